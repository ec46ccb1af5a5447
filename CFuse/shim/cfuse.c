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
#include <pthread.h>

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
static _Atomic uint64_t last_request_ns;    // when a request was last read (0: none yet)
// How long the last answered request took its thread, from its read to its answer. A long one
// waited for the disk (a cold read): its sender's next request comes after a wake-up on the
// sender's side anyway, and a polling thread then only competes with the I/O completions for
// the CPUs (fio's cold random reads: about 4 us more per read, queued to answered, with a
// thread polling after each).
static _Atomic uint64_t last_service_ns;
static const uint64_t long_service_ns = 80000;
// How many of the last requests answered were READs, in a row. During a run of reads (two or
// more) the sender waits for each answer in the page cache's read path and sends its next read
// after a wake-up on its side, as after a long request: a polling thread then shares a CPU with
// the reader and serializes both, the other CPU idle (fio's 4 KiB random reads of data in the
// disk cache: 28-31 us each with polling, 22-24 us without). A single read among other
// requests (a small file's, between its OPEN and its FLUSH) keeps the polling.
static atomic_uint reads_in_a_row;
static const unsigned int read_run = 2;
static _Thread_local uint64_t request_read_ns;  // when this thread read its last request
static _Thread_local uint32_t request_opcode;   // the opcode of that request (0: not known)
// A burst: the previous request came in less than this long ago. Outside bursts nobody polls.
static const uint64_t burst_gap_ns = 1000000;

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void reader_reset(void);

void zdc_fuse_set_busy_poll(unsigned int microseconds) {
  atomic_store(&busy_poll_us, microseconds);
  reader_reset();
}

static int in_read_run(void) {
  return atomic_load_explicit(&reads_in_a_row, memory_order_relaxed) >= read_run;
}

// Whether the device's reader polls before it blocks: during a burst (the previous request
// came in less than burst_gap_ns ago), unless the last request answered took long or ended a
// run of reads.
static int polling_wanted(void) {
  if (atomic_load_explicit(&busy_poll_us, memory_order_relaxed) == 0) return 0;
  // Through the rings, the device brings only forgets and interrupts.
  if (zdc_fuse_uring_state() == ZDC_URING_ACTIVE) return 0;
  uint64_t last = atomic_load_explicit(&last_request_ns, memory_order_relaxed);
  if (last == 0 || monotonic_ns() - last > burst_gap_ns) return 0;
  if (in_read_run()) return 0;
  return atomic_load_explicit(&last_service_ns, memory_order_relaxed) <= long_service_ns;
}

int zdc_fuse_polling_wanted(void) { return polling_wanted(); }

// Before the reader blocks for the next request: it polls the device for up to busy_poll_us,
// so that the next request is read by a running thread on a running CPU instead of waking a
// sleeping one (on a virtual machine, waking a thread on an idle virtual CPU costs about as
// much as the request's own work). It yields between polls: without, a copy of many small files
// ran up to three times slower on two CPUs (the poller kept a CPU from the copy and from the
// server's other threads).
static void poll_for_request(int fd) {
  uint64_t until =
      monotonic_ns() + (uint64_t)atomic_load_explicit(&busy_poll_us, memory_order_relaxed) * 1000u;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  // Any event (a request, an error, the end of the session) ends the polling; the read that
  // follows sees it.
  while (poll(&p, 1, 0) == 0 && monotonic_ns() < until) {
    sched_yield();
  }
}

static void note_request(const void *buf, ssize_t n) {
  if (n <= 0) return;
  request_opcode = buf != NULL && n >= (ssize_t)sizeof(struct fuse_in_header)
                       ? ((const struct fuse_in_header *)buf)->opcode
                       : 0;
  request_read_ns = monotonic_ns();
  atomic_store_explicit(&last_request_ns, request_read_ns, memory_order_relaxed);
}

// Who reads the device, while polling is on (zdc_fuse_set_busy_poll). The kernel wakes one
// thread sleeping in read(2) per request. While a thread polls, that woken thread took the
// request from it, or woke for nothing: in a copy of many small files, 4 requests in 5 were
// read by a thread just woken, 13-18 us after they were sent, against 3-5 us for the poller's.
// So the thread that polls holds the seat, and the others wait here, off the device's wait
// queue. When nobody polls (the mount is idle, or its requests wait for the disk), up to
// classic_readers threads sleep in read(2) and the rest wait here; during a run of reads, every
// thread that is not busy does (outside the roles, see reader_enter), so that a thread that
// reads a request which may take long leaves others on the device and wakes none. (With at
// most two there, the thread that had answered the previous read was seldom back in read(2)
// when the next came, and each of fio's random reads woke a waiting thread: 30 us each instead
// of 22-24 us.) The requests after the run then find them there, and each takes one before it
// waits here.
//
// A thread gives the seat up when it has read a request. If the request may take long (much
// data, the disk, the network) or more requests wait, and no other thread sleeps in read(2),
// it hands the device on (wakes a waiting thread). Otherwise it leaves the seat free and takes
// it back after answering: a sequential program's short requests are then all read and
// answered by one running thread, with no thread woken in between. A short request that
// blocks all the same (its disk stalls, a lock is held) must not hold up the others: one
// waiting thread, the standby, checks every reader_check_ns during a burst and goes to the
// device once nobody has attended it for reader_takeover_ns.
//
// With polling off, every thread reads (a single reader sleeping on a CPU of its own made each
// request wake a CPU on each side: 37 us per request with nothing to do, against 18 us).
static pthread_mutex_t reader_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reader_waiters;  // threads waiting to be handed the device
static pthread_cond_t standby_cond;    // the standby's
static pthread_once_t reader_once = PTHREAD_ONCE_INIT;
static int seat_taken;                 // a thread polls or reads holding the seat
static int classic_in_read;            // threads reading without the seat
static int waiting_count;              // threads waiting on reader_waiters
static int standby_present;            // a thread waits as the standby
static int standby_timed;              // the standby waits with a timeout
static uint64_t unattended_since;      // when the device was last left without a reader and
                                       // without being handed on (0: attended or handed on)
static int device_ended;               // the device reported the end of the session
static const int classic_readers = 2;
static const uint64_t reader_check_ns = 1000000;
static const uint64_t reader_takeover_ns = 1000000;
// Writes of at most this much data are short requests.
static const uint32_t small_write_bytes = 64 * 1024;

enum reader_role { READER_ALONE, READER_SEAT, READER_CLASSIC };

static void reader_init(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&reader_waiters, &a);
  pthread_cond_init(&standby_cond, &a);
  pthread_condattr_destroy(&a);
}

int zdc_fuse_request_may_take_long(uint32_t opcode, uint32_t len) {
  switch (opcode) {
    case FUSE_LOOKUP: case FUSE_FORGET: case FUSE_BATCH_FORGET: case FUSE_GETATTR:
    case FUSE_READLINK: case FUSE_SYMLINK: case FUSE_MKNOD: case FUSE_MKDIR: case FUSE_UNLINK:
    case FUSE_RMDIR: case FUSE_RENAME: case FUSE_RENAME2: case FUSE_LINK: case FUSE_STATFS:
    case FUSE_RELEASE: case FUSE_RELEASEDIR: case FUSE_SETXATTR: case FUSE_GETXATTR:
    case FUSE_LISTXATTR: case FUSE_REMOVEXATTR: case FUSE_FLUSH: case FUSE_OPENDIR:
    case FUSE_READDIR: case FUSE_READDIRPLUS: case FUSE_ACCESS: case FUSE_CREATE:
    case FUSE_INTERRUPT: case FUSE_IOCTL:
      return 0;
    case FUSE_WRITE:
      return len > sizeof(struct fuse_in_header) + sizeof(struct fuse_write_in) + small_write_bytes;
    default:
      return 1;
  }
}

// A new session: nobody reads its device yet. (Threads of an ended one must be gone.)
static void reader_reset(void) {
  pthread_mutex_lock(&reader_lock);
  seat_taken = 0;
  classic_in_read = 0;
  unattended_since = 0;
  device_ended = 0;
  pthread_mutex_unlock(&reader_lock);
  atomic_store(&last_request_ns, 0);
  atomic_store(&last_service_ns, 0);
  atomic_store(&reads_in_a_row, 0);
}

static int attended(void) { return seat_taken || classic_in_read > 0; }

// The role a thread that wants to read (and poll, with `polling`) may take now, or -1 to wait.
static int reader_role_now(int polling) {
  if (device_ended) return READER_CLASSIC;
  if (polling) return seat_taken ? -1 : READER_SEAT;
  return !seat_taken && (classic_in_read < classic_readers || in_read_run()) ? READER_CLASSIC : -1;
}

static void take_role(int role) {
  if (role == READER_SEAT) seat_taken = 1;
  else classic_in_read++;
  unattended_since = 0;
}

static void waiter_cancelled(void *arg) {
  (void)arg;
  waiting_count--;
  pthread_mutex_unlock(&reader_lock);
}

static void standby_cancelled(void *arg) {
  (void)arg;
  standby_present = 0;
  standby_timed = 0;
  pthread_mutex_unlock(&reader_lock);
}

// Waits until the thread may read, and takes its role. A cancellation point: libfuse ends its
// workers by cancelling them.
static int reader_enter(void) {
  if (atomic_load_explicit(&busy_poll_us, memory_order_relaxed) == 0) return READER_ALONE;
  pthread_once(&reader_once, reader_init);
  // During a run of reads a thread reads as it would with polling off, outside the roles'
  // bookkeeping (taking and leaving a role cost about 1.5 us of each cached 4 KiB read: 23.7
  // against 22.1 us, eight interleaved pairs). Uncounted, such readers add to those the others
  // see on the device and never stand in for one: the standby still goes to the device when
  // it finds nobody counted there, at its next check (reader_check_ns).
  if (in_read_run()) return READER_ALONE;
  int polling = polling_wanted();
  pthread_mutex_lock(&reader_lock);
  int role;
  while ((role = reader_role_now(polling)) < 0) {
    if (standby_present) {
      waiting_count++;
      pthread_cleanup_push(waiter_cancelled, NULL);
      pthread_cond_wait(&reader_waiters, &reader_lock);
      pthread_cleanup_pop(0);
      waiting_count--;
      polling = polling_wanted();
      continue;
    }
    standby_present = 1;
    pthread_cleanup_push(standby_cancelled, NULL);
    for (;;) {
      uint64_t now = monotonic_ns();
      if (device_ended) break;
      // Left unattended too long (the last reader's request blocks): in, whatever the role.
      if (!attended() && unattended_since != 0 && now - unattended_since >= reader_takeover_ns)
        break;
      // Handed on.
      if (!attended() && unattended_since == 0) break;
      // During a burst it checks on a timer, so that nobody has to wake it each time the
      // device is left for a short request; it sleeps until woken when none comes.
      uint64_t last = atomic_load_explicit(&last_request_ns, memory_order_relaxed);
      standby_timed = !attended() || (last != 0 && now - last < burst_gap_ns);
      if (standby_timed) {
        uint64_t at = now + reader_check_ns;
        struct timespec ts = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
        pthread_cond_timedwait(&standby_cond, &reader_lock, &ts);
      } else {
        pthread_cond_wait(&standby_cond, &reader_lock);
      }
    }
    pthread_cleanup_pop(0);
    standby_present = 0;
    standby_timed = 0;
    // Another waiting thread becomes the standby.
    if (waiting_count) pthread_cond_signal(&reader_waiters);
    polling = polling_wanted();
  }
  take_role(role);
  pthread_mutex_unlock(&reader_lock);
  return role;
}

static void hand_on_locked(void) {
  unattended_since = 0;
  if (waiting_count) pthread_cond_signal(&reader_waiters);
  else if (standby_present) pthread_cond_signal(&standby_cond);
}

static void reader_cancelled(void *arg) {
  int role = (int)(intptr_t)arg;
  if (role == READER_ALONE) return;
  pthread_mutex_lock(&reader_lock);
  if (role == READER_SEAT) seat_taken = 0;
  else classic_in_read--;
  if (!attended()) hand_on_locked();
  pthread_mutex_unlock(&reader_lock);
}

// The device reported the end of the session: every thread waiting for it goes to see.
static void session_ended_locked(void) {
  device_ended = 1;
  pthread_cond_broadcast(&reader_waiters);
  pthread_cond_broadcast(&standby_cond);
}

// Leaves the device after a read that returned `n` bytes of `buf` (NULL: not looked at).
static void reader_leave(int role, int fd, const void *buf, ssize_t n) {
  int ended = n == 0 || (n < 0 && errno == ENODEV);
  if (role == READER_ALONE) {
    // (With polling on, threads may wait here for the device: the end of the session is
    // theirs to see too.)
    if (ended && atomic_load_explicit(&busy_poll_us, memory_order_relaxed) != 0) {
      pthread_mutex_lock(&reader_lock);
      session_ended_locked();
      pthread_mutex_unlock(&reader_lock);
    }
    return;
  }
  const struct fuse_in_header *in = buf;
  int busy = in == NULL || n < (ssize_t)sizeof(*in) ||
             zdc_fuse_request_may_take_long(in->opcode, in->len);
  pthread_mutex_lock(&reader_lock);
  if (role == READER_SEAT) seat_taken = 0;
  else classic_in_read--;
  int alone = !attended();
  pthread_mutex_unlock(&reader_lock);
  if (!busy && alone) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    busy = poll(&p, 1, 0) != 0;  // more requests wait
  }
  pthread_mutex_lock(&reader_lock);
  if (ended) {
    session_ended_locked();
  } else if (!attended()) {
    if (busy) {
      hand_on_locked();
    } else {
      unattended_since = monotonic_ns();
      if (standby_present && !standby_timed) pthread_cond_signal(&standby_cond);
    }
  }
  pthread_mutex_unlock(&reader_lock);
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
  if (request_opcode == FUSE_READ) {
    atomic_fetch_add_explicit(&reads_in_a_row, 1, memory_order_relaxed);
  } else {
    atomic_store_explicit(&reads_in_a_row, 0, memory_order_relaxed);
  }
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

// One request from the device `fd` through `receive` (read(2) into `request`, or splice(2)
// into a pipe: `request` NULL), taking turns with the other workers ("Who reads the device").
static ssize_t receive_request(int fd, const void *request, ssize_t (*receive)(void *),
                               void *context) {
  int role = reader_enter();
  ssize_t n;
  pthread_cleanup_push(reader_cancelled, (void *)(intptr_t)role);
  if (role == READER_SEAT) poll_for_request(fd);
  n = receive(context);
  pthread_cleanup_pop(0);
  int saved = errno;
  reader_leave(role, fd, request, n);
  errno = saved;
  note_request(request, n);
  return n;
}

struct read_call {
  int fd;
  void *buf;
  size_t len;
};

static ssize_t read_device(void *context) {
  struct read_call *c = context;
  return read(c->fd, c->buf, c->len);
}

static ssize_t device_read(int fd, void *buf, size_t len, void *userdata) {
  (void)userdata;
  struct read_call call = {fd, buf, len};
  ssize_t n = receive_request(fd, buf, read_device, &call);
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

ssize_t zdc_fuse_read_request(int fd, void *buf, size_t len) {
  return device_read(fd, buf, len, NULL);
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

ssize_t zdc_fuse_write_answer(int fd, struct iovec *iov, int count) {
  return device_writev(fd, iov, count, NULL);
}

struct splice_call {
  int fdin;
  off_t *offin;
  int fdout;
  off_t *offout;
  size_t len;
  unsigned int flags;
};

static ssize_t splice_device(void *context) {
  struct splice_call *c = context;
  return splice(c->fdin, c->offin, c->fdout, c->offout, c->len, c->flags);
}

static ssize_t device_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout,
                                     size_t len, unsigned int flags, void *userdata) {
  (void)userdata;
  struct splice_call call = {fdin, offin, fdout, offout, len, flags};
  return receive_request(fdin, NULL, splice_device, &call);
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
