#include "cfuse.h"
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

int zdc_fuse_use_version(void) { return FUSE_USE_VERSION; }
int zdc_fuse_runtime_version(void) { return fuse_version(); }

struct fuse_args *zdc_fuse_args_new(void) {
  struct fuse_args init = FUSE_ARGS_INIT(0, NULL);
  struct fuse_args *args = malloc(sizeof(*args));
  if (args) *args = init;
  return args;
}

int zdc_fuse_args_add(struct fuse_args *args, const char *arg) {
  return fuse_opt_add_arg(args, arg);
}

void zdc_fuse_args_delete(struct fuse_args *args) {
  if (!args) return;
  fuse_opt_free_args(args);
  free(args);
}

struct fuse_session *zdc_fuse_session_new(struct fuse_args *args,
                                          const struct fuse_lowlevel_ops *ops,
                                          void *userdata) {
  return fuse_session_new(args, ops, sizeof(*ops), userdata);
}

int zdc_fuse_session_loop_mt(struct fuse_session *se, int clone_fd, unsigned int max_idle_threads) {
  struct fuse_loop_config *config = fuse_loop_cfg_create();
  if (!config) return -1;
  fuse_loop_cfg_set_clone_fd(config, clone_fd);
  fuse_loop_cfg_set_idle_threads(config, max_idle_threads);
  int rc = fuse_session_loop_mt(se, config);
  fuse_loop_cfg_destroy(config);
  return rc;
}

struct fuse_entry_param zdc_fuse_entry_param_zero(void) {
  struct fuse_entry_param e;
  memset(&e, 0, sizeof(e));
  return e;
}

void zdc_fi_set_direct_io(struct fuse_file_info *fi, int on) { fi->direct_io = on ? 1 : 0; }
void zdc_fi_set_keep_cache(struct fuse_file_info *fi, int on) { fi->keep_cache = on ? 1 : 0; }
void zdc_fi_set_noflush(struct fuse_file_info *fi, int on) { fi->noflush = on ? 1 : 0; }
void zdc_fi_set_nonseekable(struct fuse_file_info *fi, int on) { fi->nonseekable = on ? 1 : 0; }
int zdc_fi_get_writepage(const struct fuse_file_info *fi) { return fi->writepage; }

void zdc_conn_want(struct fuse_conn_info *conn, unsigned int flag) {
  if (conn->capable & flag) conn->want |= flag;
}
unsigned int zdc_conn_capable(const struct fuse_conn_info *conn) { return conn->capable; }
void zdc_conn_unwant(struct fuse_conn_info *conn, unsigned int flag) { conn->want &= ~flag; }
unsigned int zdc_conn_wanted(const struct fuse_conn_info *conn) { return conn->want; }

int zdc_notify_store(struct fuse_session *se, fuse_ino_t ino, off_t offset, const void *buf,
                     size_t size) {
  struct fuse_bufvec bufv = FUSE_BUFVEC_INIT(size);
  bufv.buf[0].mem = (void *)buf;
  return fuse_lowlevel_notify_store(se, ino, offset, &bufv, 0);
}

void zdc_malloc_keep_freed(int bytes) { mallopt(M_TRIM_THRESHOLD, bytes); }
