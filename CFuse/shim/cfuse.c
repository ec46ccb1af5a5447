#define _GNU_SOURCE
#include "cfuse.h"
#include "uring.h"
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

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

// Busy polling of the device during bursts of requests (see zdc_fuse_set_busy_poll).
static atomic_uint busy_poll_us;
static atomic_int busy_poller;              // 1 while a thread polls
static _Atomic uint64_t last_request_ns;    // when a request was last read (0: none yet)
// How long the last answered request took its thread, from its read to its answer. A long one
// waited for the disk (a cold read): its sender's next request comes after a wake-up on the
// sender's side anyway, and a polling thread then only competes with the I/O completions for
// the CPUs (fio's cold random reads: about 4 us more per read, queued to answered, with a
// thread polling after each).
static _Atomic uint64_t last_service_ns;
static const uint64_t long_service_ns = 80000;
static _Thread_local uint64_t request_read_ns;  // when this thread read its last request
// A burst: the previous request came in less than this long ago. Outside bursts nobody polls.
static const uint64_t burst_gap_ns = 1000000;

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void zdc_fuse_set_busy_poll(unsigned int microseconds) {
  atomic_store(&busy_poll_us, microseconds);
}

// Before a thread blocks for the next request: during a burst, one thread at a time polls the
// device for up to busy_poll_us, so that the next request is read by a running thread on a
// running CPU instead of waking a sleeping one (on a virtual machine, waking a thread on an
// idle virtual CPU costs about as much as the request's own work). It yields between polls:
// without, a copy of many small files ran up to three times slower on two CPUs (the poller
// kept a CPU from the copy and from the server's other threads).
static void poll_for_request(int fd) {
  unsigned int us = atomic_load_explicit(&busy_poll_us, memory_order_relaxed);
  // Through the rings, the device brings only forgets and interrupts.
  if (us == 0 || zdc_fuse_uring_state() == ZDC_URING_ACTIVE) return;
  uint64_t now = monotonic_ns();
  uint64_t last = atomic_load_explicit(&last_request_ns, memory_order_relaxed);
  if (last == 0 || now - last > burst_gap_ns) return;
  if (atomic_load_explicit(&last_service_ns, memory_order_relaxed) > long_service_ns) return;
  int expected = 0;
  if (!atomic_compare_exchange_strong(&busy_poller, &expected, 1)) return;
  uint64_t until = now + (uint64_t)us * 1000u;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  // Any event (a request, an error, the end of the session) ends the polling; the read that
  // follows sees it.
  while (poll(&p, 1, 0) == 0 && monotonic_ns() < until) {
    sched_yield();
  }
  atomic_store(&busy_poller, 0);
}

static void note_request(ssize_t n) {
  if (n <= 0 || atomic_load_explicit(&busy_poll_us, memory_order_relaxed) == 0) return;
  request_read_ns = monotonic_ns();
  atomic_store_explicit(&last_request_ns, request_read_ns, memory_order_relaxed);
}

// An answer about to be written to the device by the thread that read its request (libfuse's
// workers answer on the thread that read the request; notifications, unique 0, are not
// answers).
static void note_answer(const struct iovec *iov, int count) {
  if (count < 1 || iov[0].iov_len < sizeof(struct fuse_out_header) || request_read_ns == 0 ||
      ((const struct fuse_out_header *)iov[0].iov_base)->unique == 0) {
    return;
  }
  atomic_store_explicit(&last_service_ns, monotonic_ns() - request_read_ns,
                        memory_order_relaxed);
  request_read_ns = 0;
}

// FUSE_DIRECT_IO_ALLOW_MMAP (include/uapi/linux/fuse.h, 7.39; the system's header is older).
#define ZDC_FUSE_DIRECT_IO_ALLOW_MMAP_FLAGS2 (1u << (36 - 32))

// The session's device I/O (zdc_fuse_session_install_device_io): busy polling,
// FUSE_HANDLE_KILLPRIV_V2 and FUSE_DIRECT_IO_ALLOW_MMAP, which libfuse 3.14 cannot negotiate,
// and FUSE over io_uring (uring.c), which it does not know either. The INIT request is read
// and answered on one thread, so the thread remembers the request's unique id and what it
// offered between the two.
static _Thread_local uint64_t init_unique;
static _Thread_local int init_pending;
static _Thread_local int init_killpriv;
static _Thread_local int init_uring;
static _Thread_local int init_dio_mmap;
static atomic_int killpriv_state;  // bit 0: offered by the kernel; bit 1: in the reply
static atomic_int dio_mmap_state;  // the same for FUSE_DIRECT_IO_ALLOW_MMAP
static struct fuse_session *device_session;

static ssize_t device_read(int fd, void *buf, size_t len, void *userdata) {
  (void)userdata;
  poll_for_request(fd);
  ssize_t n = read(fd, buf, len);
  note_request(n);
  if (n >= (ssize_t)(sizeof(struct fuse_in_header) + 16)) {
    const struct fuse_in_header *in = buf;
    if (in->opcode == FUSE_INIT) {
      const struct fuse_init_in *arg = (const void *)((const char *)buf + sizeof(*in));
      init_unique = in->unique;
      init_pending = 1;
      init_killpriv = (arg->flags & FUSE_HANDLE_KILLPRIV_V2) != 0;
      if (init_killpriv) atomic_fetch_or(&killpriv_state, 1);
      int extended = n >= (ssize_t)(sizeof(*in) + sizeof(*arg)) && (arg->flags & FUSE_INIT_EXT);
      init_uring = extended && zdc_uring_offer(arg->flags, arg->flags2);
      init_dio_mmap = extended && (arg->flags2 & ZDC_FUSE_DIRECT_IO_ALLOW_MMAP_FLAGS2) != 0;
      if (init_dio_mmap) atomic_fetch_or(&dio_mmap_state, 1);
    }
  }
  return n;
}

static ssize_t device_writev(int fd, struct iovec *iov, int count, void *userdata) {
  (void)userdata;
  ssize_t written;
  int caught = zdc_uring_catch_reply(iov, count, &written);
  if (caught == 1) return written;
  if (caught < 0) {
    errno = -caught;
    return -1;
  }
  if (init_pending && count >= 2 && iov[0].iov_len >= sizeof(struct fuse_out_header) &&
      iov[1].iov_len >= 16) {
    struct fuse_out_header *out = iov[0].iov_base;
    if (out->unique == init_unique) {
      init_pending = 0;
      struct fuse_init_out *arg = iov[1].iov_base;
      int extended = out->error == 0 && iov[1].iov_len >= sizeof(*arg);
      int uring = init_uring && extended;
      int dio_mmap = init_dio_mmap && extended;
      if (out->error == 0 && init_killpriv) arg->flags |= FUSE_HANDLE_KILLPRIV_V2;
      if (uring) zdc_uring_accept(&arg->flags, &arg->flags2);
      if (dio_mmap) {
        arg->flags |= FUSE_INIT_EXT;
        arg->flags2 |= ZDC_FUSE_DIRECT_IO_ALLOW_MMAP_FLAGS2;
      }
      note_answer(iov, count);
      ssize_t n = writev(fd, iov, count);
      if (n >= 0 && out->error == 0 && init_killpriv) atomic_fetch_or(&killpriv_state, 2);
      if (n >= 0 && dio_mmap) atomic_fetch_or(&dio_mmap_state, 2);
      if (n >= 0 && uring) zdc_uring_start(device_session, fd, arg->max_write, arg->max_pages);
      return n;
    }
  }
  note_answer(iov, count);
  return writev(fd, iov, count);
}

static ssize_t device_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout,
                                     size_t len, unsigned int flags, void *userdata) {
  (void)userdata;
  poll_for_request(fdin);
  ssize_t n = splice(fdin, offin, fdout, offout, len, flags);
  note_request(n);
  return n;
}

static ssize_t device_splice_send(int fdin, off_t *offin, int fdout, off_t *offout,
                                  size_t len, unsigned int flags, void *userdata) {
  (void)userdata;
  return splice(fdin, offin, fdout, offout, len, flags);
}

int zdc_fuse_session_install_device_io(struct fuse_session *se) {
  static const struct fuse_custom_io io = {
      .writev = device_writev,
      .read = device_read,
      .splice_receive = device_splice_receive,
      .splice_send = device_splice_send,
  };
  int fd = fuse_session_fd(se);
  if (fd < 0) return -EBADF;
  device_session = se;
  int rc = fuse_session_custom_io(se, &io, fd);
  return rc > 0 ? -rc : rc;
}

int zdc_fuse_killpriv_v2_state(void) { return atomic_load(&killpriv_state); }

int zdc_fuse_direct_io_mmap_state(void) { return atomic_load(&dio_mmap_state); }
