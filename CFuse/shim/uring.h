// FUSE over io_uring: the hooks the session's device I/O (cfuse.c) calls. See uring.c.
#ifndef ZDC_CFUSE_URING_H
#define ZDC_CFUSE_URING_H

#include "cfuse.h"
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/// The kernel's INIT request's flags: returns 1 when they offer the transport and it is taken.
int zdc_uring_offer(uint32_t init_in_flags, uint32_t init_in_flags2);

/// Sets the transport's flag in the INIT reply's flags.
void zdc_uring_accept(uint32_t *init_out_flags, uint32_t *init_out_flags2);

/// After the INIT reply that took the transport was written: starts the ring threads, which
/// register one entry each (payload buffers sized for `max_write` and `max_pages`).
void zdc_uring_start(struct fuse_session *se, int fd, uint32_t max_write, uint32_t max_pages);

/// An answer libfuse is about to write: when it answers a request taken from a ring, it is
/// put into that request's buffers, to be committed by the ring's thread. Returns 1 (taken;
/// `*written` is what writev would have returned), 0 (not a ring request's answer), or -errno.
int zdc_uring_catch_reply(const struct iovec *iov, int count, ssize_t *written);

#endif
