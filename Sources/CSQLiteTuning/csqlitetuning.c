#include "csqlitetuning.h"

#include <pthread.h>
#include <sqlite3.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int result = 0;

static void tune(void) {
  result = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

int zdc_sqlite_tune_process(void) {
  pthread_once(&once, tune);
  return result;
}
