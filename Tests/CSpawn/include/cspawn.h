// CSpawn: the GNU process-spawning calls the test support needs, typed for Swift (Swift's
// Glibc module does not declare the `_GNU_SOURCE` ones).
#ifndef ZDC_CSPAWN_H
#define ZDC_CSPAWN_H

#include <spawn.h>

/// `pipe2(fds, O_CLOEXEC)`: a pipe whose ends no concurrently spawned child inherits.
int zdc_pipe_cloexec(int fds[2]);

/// `posix_spawn_file_actions_addclosefrom_np(actions, from)`: the child closes every
/// descriptor from `from` on.
int zdc_spawn_closefrom(posix_spawn_file_actions_t *actions, int from);

#endif
