// CFuse: libfuse3's low-level API made callable from Swift: typed wrappers for the macros and
// variadic parts of the API, and the session's device I/O (busy polling, the
// FUSE_HANDLE_KILLPRIV_V2 negotiation, and FUSE over io_uring, in uring.c), which libfuse 3.14
// does not do.
#ifndef ZDC_CFUSE_H
#define ZDC_CFUSE_H

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse_lowlevel.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>

/// The FUSE_USE_VERSION this shim was compiled against.
int zdc_fuse_use_version(void);

/// The runtime libfuse version (e.g. 314 for 3.14).
int zdc_fuse_runtime_version(void);

/// A heap-allocated `struct fuse_args`, as FUSE_ARGS_INIT(0, NULL) would make it.
struct fuse_args *zdc_fuse_args_new(void);

/// Appends one argument (copied). Returns 0 on success, -1 on failure.
int zdc_fuse_args_add(struct fuse_args *args, const char *arg);

/// Frees the arguments and the struct itself.
void zdc_fuse_args_delete(struct fuse_args *args);

/// fuse_session_new with `sizeof(*ops)` supplied.
struct fuse_session *zdc_fuse_session_new(struct fuse_args *args,
                                          const struct fuse_lowlevel_ops *ops,
                                          void *userdata);

/// Runs the multithreaded loop with `clone_fd` and a maximum number of idle threads.
int zdc_fuse_session_loop_mt(struct fuse_session *se, int clone_fd, unsigned int max_idle_threads);

/// fuse_entry_param zeroed, so that Swift need not spell every field.
struct fuse_entry_param zdc_fuse_entry_param_zero(void);

/// Makes the allocator keep up to `bytes` of freed memory instead of returning it to the
/// kernel (a FUSE server frees and reallocates the same buffers on every request).
void zdc_malloc_keep_freed(int bytes);

/// The `struct fuse_file_info` flags that are C bit-fields, readable and writable from Swift.
void zdc_fi_set_direct_io(struct fuse_file_info *fi, int on);
void zdc_fi_set_keep_cache(struct fuse_file_info *fi, int on);
/// No FLUSH request when a descriptor of this open file is closed (kernel 5.17+; ignored before).
void zdc_fi_set_noflush(struct fuse_file_info *fi, int on);
void zdc_fi_set_nonseekable(struct fuse_file_info *fi, int on);
int zdc_fi_get_writepage(const struct fuse_file_info *fi);

/// Capability flags offered by the kernel and requested by the filesystem.
void zdc_conn_want(struct fuse_conn_info *conn, unsigned int flag);
unsigned int zdc_conn_capable(const struct fuse_conn_info *conn);
/// Clears a capability from `conn->want`.
void zdc_conn_unwant(struct fuse_conn_info *conn, unsigned int flag);
/// The capabilities requested so far (`conn->want`).
unsigned int zdc_conn_wanted(const struct fuse_conn_info *conn);

/// fuse_lowlevel_notify_store of one memory buffer: puts `size` bytes at `offset` into the
/// kernel's page cache of `ino`. Returns 0 or -errno.
int zdc_notify_store(struct fuse_session *se, fuse_ino_t ino, off_t offset, const void *buf,
                     size_t size);

/// Routes the mounted session `se`'s device I/O through this shim's wrappers, which do three
/// things:
/// - accept the kernel's FUSE_HANDLE_KILLPRIV_V2 offer, which libfuse 3.14 cannot negotiate
///   (the flag is added to the INIT reply when the kernel's INIT request offered it; the kernel
///   then stops asking for `security.capability` before every write, and the file system takes
///   on clearing set-user-ID and set-group-ID bits on write and truncate);
/// - accept its FUSE_DIRECT_IO_ALLOW_MMAP offer in the same way (see
///   zdc_fuse_direct_io_mmap_state);
/// - busy polling during bursts, by one reader at a time (zdc_fuse_set_busy_poll).
/// Call after fuse_session_mount and before the loop. Returns 0 or -errno.
int zdc_fuse_session_install_device_io(struct fuse_session *se);

/// Busy polling of the device by the session's device I/O (installed by
/// zdc_fuse_session_install_device_io): while the previous request came in less than a
/// millisecond ago (and the last one answered took its thread less than 80 us and did not end
/// a run of reads), the worker thread that reads the device polls for the next request
/// for up to `microseconds`, yielding between polls, before it blocks (0, the default, turns
/// it off). Sequential workloads then find a running thread on a running CPU instead of waking
/// a sleeping one.
///
/// With polling on, the other workers wait off the device instead of sleeping in read(2) (the
/// kernel would wake one of them for each request, and it would take the request from the
/// poller): one thread reads the device while a burst goes on, at most two while none does,
/// and every idle worker during a run of reads. A worker that has read a request which may
/// take long (see zdc_fuse_request_may_take_long), or with more requests waiting, hands the
/// device on to a waiting worker; after a short one it reads the next request itself, so a
/// sequential program's requests are read and answered by one running thread. A waiting
/// worker takes the device over when nobody has read it for a millisecond (a short request
/// that blocked).
/// Call before the loop starts.
void zdc_fuse_set_busy_poll(unsigned int microseconds);

/// Reads one request from the FUSE device `fd` into `buf` the way the session's workers do
/// (polling and taking turns as zdc_fuse_set_busy_poll says); what read(2) returns.
ssize_t zdc_fuse_read_request(int fd, void *buf, size_t len);

/// Writes an answer to the FUSE device `fd` the way the session's workers do (what the thread
/// that read its request notes for zdc_fuse_set_busy_poll); what writev(2) returns.
ssize_t zdc_fuse_write_answer(int fd, struct iovec *iov, int count);

/// Whether the device's reader would poll before it blocks now (zdc_fuse_set_busy_poll). 1 or 0.
int zdc_fuse_polling_wanted(void);

/// Whether a request (FUSE opcode, total length in bytes) may keep the worker serving it long
/// enough to keep other requests waiting: data transfers past 64 KiB, reads (the disk, the
/// network), opening (a download), fsync, truncation and the rest of what is not a quick
/// metadata operation. 1 or 0.
int zdc_fuse_request_may_take_long(uint32_t opcode, uint32_t len);

/// What became of FUSE_HANDLE_KILLPRIV_V2 in this process's session: bit 0 set when the
/// kernel offered it, bit 1 when the INIT reply carrying it was sent.
int zdc_fuse_killpriv_v2_state(void);

/// What became of FUSE_DIRECT_IO_ALLOW_MMAP (kernel 6.6+) in this process's session, as for
/// zdc_fuse_killpriv_v2_state. Once given, files opened with `direct_io` may still be mapped
/// shared, and the kernel drops its cached pages of a range a direct write changes.
int zdc_fuse_direct_io_mmap_state(void);

/// The FUSE-over-io_uring transport (kernel 6.14+, when the `fuse` module's `enable_uring`
/// parameter is on): `threads` serving threads per ring queue (one queue per CPU, each thread
/// pinned to its queue's CPU), or 0 to refuse the kernel's offer. Call before the loop starts.
void zdc_fuse_set_uring(unsigned int threads);

/// What became of the transport in this process's session.
enum {
  ZDC_URING_UNOFFERED = 0,  // the kernel did not offer it
  ZDC_URING_OFFERED = 1,    // offered at INIT (taken unless refused); no request through a ring
  ZDC_URING_ACTIVE = 2,     // requests come through the rings
  ZDC_URING_FAILED = 3,     // setting up failed; /dev/fuse serves
};
int zdc_fuse_uring_state(void);

/// After the loop ended and the session was unmounted: waits (a few seconds at most) for the
/// ring threads, which end when the kernel closes the connection, and frees their rings.
void zdc_fuse_uring_stop(void);

#endif
