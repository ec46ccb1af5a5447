#define _GNU_SOURCE
#include "clinux.h"

#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>

int zdc_start_writeback(int fd) { return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }

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
