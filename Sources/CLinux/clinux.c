#define _GNU_SOURCE
#include "clinux.h"

#include <fcntl.h>
#include <pthread.h>
#include <string.h>

int zdc_start_writeback(int fd) { return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }

int zdc_set_thread_name(const char *name) {
  char shortened[16];
  strncpy(shortened, name, sizeof shortened - 1);
  shortened[sizeof shortened - 1] = 0;
  return pthread_setname_np(pthread_self(), shortened);
}
