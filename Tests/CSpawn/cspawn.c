#define _GNU_SOURCE
#include "cspawn.h"

#include <fcntl.h>
#include <unistd.h>

int zdc_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

int zdc_spawn_closefrom(posix_spawn_file_actions_t *actions, int from) {
  return posix_spawn_file_actions_addclosefrom_np(actions, from);
}
