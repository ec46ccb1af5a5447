#define _GNU_SOURCE
#include "clinux.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

int zdc_start_writeback(int fd) { return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }

int zdc_write_and_wait(int fd) {
  int r;
  do {
    r = sync_file_range(fd, 0, 0,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER);
  } while (r < 0 && errno == EINTR);
  return r;
}

long zdc_file_system_type(int fd) {
  struct statfs s;
  if (fstatfs(fd, &s) != 0) return -1;
  return (long)s.f_type;
}

int zdc_open_tmpfile(const char *directory) {
  int fd;
  do {
    fd = open(directory, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  return fd < 0 ? -errno : fd;
}

long zdc_copy_file_range(int in, int out, unsigned long length) {
  ssize_t n;
  do {
    n = copy_file_range(in, NULL, out, NULL, length, 0);
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : (long)n;
}

int zdc_set_thread_name(const char *name) {
  char shortened[16];
  strncpy(shortened, name, sizeof shortened - 1);
  shortened[sizeof shortened - 1] = 0;
  return pthread_setname_np(pthread_self(), shortened);
}

int zdc_set_dumpable(int dumpable) { return prctl(PR_SET_DUMPABLE, dumpable ? 1 : 0, 0, 0, 0); }

int zdc_is_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

long zdc_getrandom(void *buffer, unsigned long length) {
  return (long)getrandom(buffer, length, 0);
}

int zdc_lower_io_priority(void) {
  // IOPRIO_WHO_PROCESS (1) with who 0: the calling thread; class IOPRIO_CLASS_BE (2) in the
  // top bits (shift 13), level 7.
  return (int)syscall(SYS_ioprio_set, 1, 0, (2 << 13) | 7);
}

int zdc_io_priority(void) { return (int)syscall(SYS_ioprio_get, 1, 0); }

int zdc_file_identity(int fd, unsigned long long *size, unsigned long long *inode,
                      unsigned int *links) {
  struct statx st;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_SIZE | STATX_INO | STATX_NLINK, &st) != 0) return -1;
  *size = st.stx_size;
  *inode = st.stx_ino;
  *links = st.stx_nlink;
  return 0;
}
