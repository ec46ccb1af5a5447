// FUSE over io_uring (kernel 6.14+, protocol 7.42) for libfuse 3.14, which predates it.
//
// With the transport on, the kernel queues each request on the ring queue of the CPU the
// requesting task runs on, and a thread of this process pinned to that CPU serves it: the
// request, its answer and the requester's wake-up stay on one CPU. Through /dev/fuse, a
// request wakes whichever server thread waits first, on either CPU; on a virtual machine a
// wake-up across CPUs costs about as much as a small request's own work.
//
// Requests that still come through /dev/fuse (INIT, FORGET, INTERRUPT, and everything until
// every queue has an entry) are served by libfuse's loop as before; notifications are still
// written to /dev/fuse. A request taken from a ring is laid out as /dev/fuse would deliver it
// (header, per-operation struct, payload) and handed to libfuse's dispatcher; its answer, which
// libfuse writes through the session's custom I/O (cfuse.c), is caught on the serving thread
// and committed to the ring instead.
#define _GNU_SOURCE
#include "uring.h"
#include <errno.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

// The FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, 7.42); the system's header is older.
#define ZDC_FUSE_OVER_IO_URING_FLAGS2 (1u << (41 - 32))
#define ZDC_URING_IN_OUT_HEADER_SZ 128
#define ZDC_URING_OP_IN_OUT_SZ 128
struct zdc_uring_ent_in_out {
  uint64_t flags;
  uint64_t commit_id;
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};
struct zdc_uring_req_header {
  char in_out[ZDC_URING_IN_OUT_HEADER_SZ];
  char op_in[ZDC_URING_OP_IN_OUT_SZ];
  struct zdc_uring_ent_in_out ring_ent_in_out;
};
enum { ZDC_URING_CMD_REGISTER = 1, ZDC_URING_CMD_COMMIT_AND_FETCH = 2 };
struct zdc_uring_cmd_req {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};

// Room before the payload for the in-header and the per-operation struct, so that a request
// is laid out contiguously without copying its payload.
#define PREFIX (sizeof(struct fuse_in_header) + ZDC_URING_OP_IN_OUT_SZ)

struct server {
  pthread_t thread;
  _Atomic int started;
  unsigned qid;
  struct io_uring ring;
  int ring_ready;
  struct zdc_uring_req_header *header;
  char *area;  // PREFIX bytes, then the payload buffer
  size_t payload_size;
  struct iovec iov[2];
  // The request in service (0: none) and since when. Written by this thread; `answered` also
  // by a thread that answers the request late (see zdc_uring_catch_reply).
  _Atomic uint64_t unique;
  _Atomic uint64_t since_ns;
  pthread_mutex_t lock;
  pthread_cond_t answered_cond;
  int answered;
  // Set when the answer was committed from within the handler (the kernel may hold locks for
  // the request that the handler's remaining work waits for), with the submission's result.
  int committed;
  int commit_rc;
};

static atomic_uint threads_per_queue;  // most threads per queue; 0: the transport is refused
static atomic_int state;               // ZDC_URING_*
static atomic_int stopping;
static struct fuse_session *session;
static int device_fd = -1;
static struct server *servers;  // queue_count * per slots: queue q's are q*per ..< (q+1)*per
static unsigned server_count;
static unsigned queue_count;
static unsigned per;
static pthread_t monitor;
static int monitor_started;
static _Thread_local struct server *serving;

void zdc_fuse_set_uring(unsigned int threads) { atomic_store(&threads_per_queue, threads); }

int zdc_fuse_uring_state(void) { return atomic_load(&state); }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// The kernel has one queue per possible CPU (num_possible_cpus), numbered by CPU.
static unsigned possible_cpus(void) {
  FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
  unsigned highest = 0;
  if (f) {
    char line[256];
    if (fgets(line, sizeof line, f)) {
      for (char *p = line; *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) break;
        if (v > highest) highest = (unsigned)v;
        p = end;
        while (*p == ',' || *p == '-' || *p == '\n') p++;
      }
    }
    fclose(f);
    return highest + 1;
  }
  long n = sysconf(_SC_NPROCESSORS_CONF);
  return n > 0 ? (unsigned)n : 1;
}

int zdc_uring_offer(uint32_t init_in_flags, uint32_t init_in_flags2) {
  if (!(init_in_flags & FUSE_INIT_EXT)) return 0;
  if (!(init_in_flags2 & ZDC_FUSE_OVER_IO_URING_FLAGS2)) return 0;
  atomic_store(&state, ZDC_URING_OFFERED);
  if (atomic_load(&threads_per_queue) == 0) return 0;
  // Once taken, the kernel holds every request until each queue has an entry, and turns the
  // transport off again only on a registration it refuses, which needs a ring: where this
  // process may not make rings (sysctl kernel.io_uring_disabled, a seccomp filter), the offer
  // is left.
  struct io_uring probe;
  if (io_uring_queue_init(2, &probe, IORING_SETUP_SQE128) != 0) {
    atomic_store(&state, ZDC_URING_FAILED);
    return 0;
  }
  io_uring_queue_exit(&probe);
  return 1;
}

void zdc_uring_accept(uint32_t *init_out_flags, uint32_t *init_out_flags2) {
  *init_out_flags |= FUSE_INIT_EXT;
  *init_out_flags2 |= ZDC_FUSE_OVER_IO_URING_FLAGS2;
}

// Fills `sqe` (128 bytes) with a FUSE ring command on the device.
static void prepare_command(struct io_uring_sqe *sqe, int cmd, const struct iovec *iov,
                            unsigned iov_count, unsigned qid, uint64_t commit_id) {
  memset(sqe, 0, 2 * sizeof(*sqe));  // SQE128: the command area follows
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = device_fd;
  sqe->cmd_op = (uint32_t)cmd;
  sqe->addr = (uint64_t)(uintptr_t)iov;
  sqe->len = iov_count;
  struct zdc_uring_cmd_req *req = (struct zdc_uring_cmd_req *)sqe->cmd;
  req->qid = (uint16_t)qid;
  req->commit_id = commit_id;
}

// Gives the transport up before it started: the kernel holds every request until each queue
// has an entry, so a queue left without one would stall the mount. A registration the kernel
// refuses makes it turn the transport off and go on with /dev/fuse.
static void give_up(void) {
  atomic_store(&state, ZDC_URING_FAILED);
  struct io_uring probe;
  if (io_uring_queue_init(2, &probe, IORING_SETUP_SQE128) != 0) return;
  // No buffers: refused.
  prepare_command(io_uring_get_sqe(&probe), ZDC_URING_CMD_REGISTER, NULL, 0, 0, 0);
  io_uring_submit_and_wait(&probe, 1);
  io_uring_queue_exit(&probe);
}

// Submits this server's entry: registration, or the answer to `commit_id` and the fetch of
// the next request. Returns 0 or -errno.
static int submit(struct server *s, int cmd, uint64_t commit_id) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
  if (!sqe) return -EBUSY;
  prepare_command(sqe, cmd, s->iov, 2, s->qid, commit_id);
  for (;;) {
    int rc = io_uring_submit(&s->ring);
    if (rc >= 0) return 0;
    if (rc != -EINTR) return rc;
  }
}

// Waits for the next request of this server's entry. Returns 0 with a request in the
// buffers, or -errno (the connection ended: -ENOTCONN, -ECONNABORTED…).
static int wait_next(struct server *s) {
  struct io_uring_cqe *cqe;
  for (;;) {
    int rc = io_uring_wait_cqe(&s->ring, &cqe);
    if (rc == 0) break;
    if (rc != -EINTR) return rc;
  }
  int res = cqe->res;
  io_uring_cqe_seen(&s->ring, cqe);
  return res;
}

static int submit_and_wait(struct server *s, int cmd, uint64_t commit_id) {
  int rc = submit(s, cmd, commit_id);
  return rc < 0 ? rc : wait_next(s);
}

// Lays the request in the buffers out as /dev/fuse delivers it and serves it through libfuse.
// Returns the request's unique id, answered or not.
static uint64_t serve(struct server *s) {
  struct fuse_in_header in;
  memcpy(&in, s->header->in_out, sizeof in);
  uint32_t payload = s->header->ring_ent_in_out.payload_sz;
  size_t fixed = sizeof in + payload;
  if (in.len < fixed || in.len - fixed > ZDC_URING_OP_IN_OUT_SZ || payload > s->payload_size) {
    // Not laid out as expected: answered with EIO rather than guessed at.
    struct fuse_out_header out = {.len = sizeof out, .error = -EIO, .unique = in.unique};
    memcpy(s->header->in_out, &out, sizeof out);
    s->header->ring_ent_in_out.payload_sz = 0;
    s->answered = 1;
    return in.unique;
  }
  size_t op = in.len - fixed;
  char *payload_start = s->area + PREFIX;
  char *start = payload_start - op - sizeof in;
  memcpy(start, &in, sizeof in);
  memcpy(start + sizeof in, s->header->op_in, op);
  struct fuse_buf buf = {.size = in.len, .mem = start};
  pthread_mutex_lock(&s->lock);
  s->answered = 0;
  pthread_mutex_unlock(&s->lock);
  atomic_store(&s->since_ns, now_ns());
  atomic_store(&s->unique, in.unique);
  serving = s;
  fuse_session_process_buf(session, &buf);
  serving = NULL;
  return in.unique;
}

// Sets up this thread's ring (its own, so that the kernel runs the ring's completion work
// when this thread waits, and nowhere else) and entry buffers.
static int setup(struct server *s) {
  int rc = io_uring_queue_init(
      4, &s->ring, IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
  if (rc == -EINVAL) rc = io_uring_queue_init(4, &s->ring, IORING_SETUP_SQE128);  // before 6.1
  if (rc != 0) return rc;
  s->ring_ready = 1;
  if (posix_memalign((void **)&s->header, 64, sizeof *s->header) != 0) return -ENOMEM;
  if (posix_memalign((void **)&s->area, 4096, PREFIX + s->payload_size) != 0) return -ENOMEM;
  memset(s->header, 0, sizeof *s->header);
  s->iov[0] = (struct iovec){.iov_base = s->header, .iov_len = sizeof *s->header};
  s->iov[1] = (struct iovec){.iov_base = s->area + PREFIX, .iov_len = s->payload_size};
  return 0;
}

static void *server_main(void *arg) {
  struct server *s = arg;
  int first = s == &servers[s->qid * per];
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(s->qid, &set);
  // A CPU that is possible but offline takes no requests; the thread then runs anywhere.
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  char name[16];
  snprintf(name, sizeof name, "zdc.uring.%u", s->qid);
  pthread_setname_np(pthread_self(), name);

  int rc = setup(s);
  for (int attempt = 0; rc == 0; attempt++) {
    rc = submit_and_wait(s, ZDC_URING_CMD_REGISTER, 0);
    // -EAGAIN: the kernel has not finished processing the INIT reply yet.
    if (rc != -EAGAIN || attempt >= 1000) break;
    usleep(1000);
  }
  // A registered entry gets its first request once every queue has one (the kernel holds
  // requests until then), so the first request anywhere shows the transport at work.
  if (rc == 0) atomic_store(&state, ZDC_URING_ACTIVE);
  while (rc == 0) {
    s->committed = 0;
    uint64_t unique = serve(s);
    if (s->committed) {
      rc = s->commit_rc < 0 ? s->commit_rc : wait_next(s);
      continue;
    }
    pthread_mutex_lock(&s->lock);
    // An answer given later by another thread (libfuse allows it) is waited for here: the
    // commit must come from this thread, which owns the ring.
    while (!s->answered) pthread_cond_wait(&s->answered_cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    atomic_store(&s->unique, 0);
    rc = submit_and_wait(s, ZDC_URING_CMD_COMMIT_AND_FETCH, unique);
  }
  if (rc != -ENOTCONN && rc != -ECONNABORTED && rc != -ECANCELED) {
    // A queue's first thread fails before the kernel switched over (it switches once every
    // first thread registered); a later one leaves its queue served by the others.
    if (first && atomic_load(&state) != ZDC_URING_ACTIVE) give_up();
  }
  return NULL;
}

static int start_server(struct server *s) {
  int rc = -pthread_create(&s->thread, NULL, server_main, s);
  if (rc == 0) atomic_store(&s->started, 1);
  return rc;
}

// Adds a thread to a queue whose threads have all been busy with one request for a while (a
// download, a slow store). Only then: with two threads registered on a queue, the kernel
// spreads the queue's requests over both, each woken for half of them, and a sequence of small
// requests ran about 8% slower than with one.
static const uint64_t stuck_ns = 20000000;  // 20 ms

static void *monitor_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "zdc.uring");
  while (!atomic_load(&stopping)) {
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 20000000};
    nanosleep(&pause, NULL);
    uint64_t now = now_ns();
    for (unsigned q = 0; q < queue_count; q++) {
      struct server *next = NULL;
      int all_stuck = 1;
      for (unsigned i = q * per; i < (q + 1) * per; i++) {
        struct server *s = &servers[i];
        if (!atomic_load(&s->started)) {
          if (!next) next = s;
          continue;
        }
        uint64_t since = atomic_load(&s->since_ns);
        if (atomic_load(&s->unique) == 0 || now - since < stuck_ns) all_stuck = 0;
      }
      // (A thread that cannot be started leaves the queue to the threads it has.)
      if (all_stuck && next && atomic_load(&state) == ZDC_URING_ACTIVE) start_server(next);
    }
  }
  return NULL;
}

int zdc_uring_catch_reply(const struct iovec *iov, int count, ssize_t *written) {
  if (count < 1 || iov[0].iov_len < sizeof(struct fuse_out_header)) return 0;
  const struct fuse_out_header *out = iov[0].iov_base;
  if (out->unique == 0 || server_count == 0) return 0;
  struct server *s = serving;
  if (!s || atomic_load(&s->unique) != out->unique) {
    s = NULL;
    for (unsigned i = 0; i < server_count; i++) {
      if (atomic_load(&servers[i].unique) == out->unique) {
        s = &servers[i];
        break;
      }
    }
    if (!s) return 0;
  }
  size_t total = 0;
  for (int i = 1; i < count; i++) total += iov[i].iov_len;
  pthread_mutex_lock(&s->lock);
  if (s->answered) {
    pthread_mutex_unlock(&s->lock);
    return -EINVAL;  // answered twice
  }
  struct fuse_out_header head = *out;
  if (total > s->payload_size) {
    head.error = -EIO;
    head.len = sizeof head;
    total = 0;
  } else {
    char *p = s->area + PREFIX;
    for (int i = 1; i < count; i++) {
      memcpy(p, iov[i].iov_base, iov[i].iov_len);
      p += iov[i].iov_len;
    }
  }
  memcpy(s->header->in_out, &head, sizeof head);
  s->header->ring_ent_in_out.payload_sz = (uint32_t)total;
  s->answered = 1;
  if (s == serving) {
    // On the serving thread, within the handler: committed now, as a write to /dev/fuse
    // would be, since what the handler still does after answering may wait for the kernel to
    // release locks it holds until the answer (FileSystem.settleNotifications). The next
    // request may arrive in the buffers meanwhile; it is served once the handler returns.
    atomic_store(&s->unique, 0);
    s->commit_rc = submit(s, ZDC_URING_CMD_COMMIT_AND_FETCH, head.unique);
    s->committed = 1;
  }
  pthread_cond_signal(&s->answered_cond);
  pthread_mutex_unlock(&s->lock);
  *written = (ssize_t)(iov[0].iov_len + total);
  return 1;
}

static void release_server(struct server *s) {
  if (s->ring_ready) io_uring_queue_exit(&s->ring);
  s->ring_ready = 0;
  free(s->header);
  free(s->area);
  s->header = NULL;
  s->area = NULL;
}

void zdc_uring_start(struct fuse_session *se, int fd, uint32_t max_write, uint32_t max_pages) {
  per = atomic_load(&threads_per_queue);
  if (per == 0 || servers) return;
  session = se;
  device_fd = fd;
  size_t payload = 8192;  // FUSE_MIN_READ_BUFFER
  if (max_write > payload) payload = max_write;
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  if ((size_t)max_pages * (size_t)page > payload) payload = (size_t)max_pages * (size_t)page;
  unsigned count = possible_cpus();
  servers = calloc((size_t)count * per, sizeof *servers);
  if (!servers) {
    give_up();
    return;
  }
  for (unsigned i = 0; i < count * per; i++) {
    struct server *s = &servers[i];
    s->qid = i / per;
    s->payload_size = payload;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->answered_cond, NULL);
  }
  queue_count = count;
  server_count = count * per;
  for (unsigned q = 0; q < count; q++) {
    int rc = start_server(&servers[q * per]);
    if (rc != 0) {
      give_up();
      return;
    }
  }
  if (per > 1 && pthread_create(&monitor, NULL, monitor_main, NULL) == 0) monitor_started = 1;
}

void zdc_fuse_uring_stop(void) {
  atomic_store(&stopping, 1);
  if (monitor_started) pthread_join(monitor, NULL);
  monitor_started = 0;
  for (unsigned i = 0; i < server_count; i++) {
    struct server *s = &servers[i];
    if (!atomic_load(&s->started)) continue;
    // The kernel ends every entry's command when the connection goes (unmount, abort); a
    // thread still waiting a few seconds later is left to the process's exit.
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    if (pthread_timedjoin_np(s->thread, NULL, &deadline) == 0) {
      atomic_store(&s->started, 0);
      release_server(s);
    }
  }
}
