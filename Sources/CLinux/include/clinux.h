// CLinux: Linux calls Swift's Glibc module does not declare (they need _GNU_SOURCE).
#ifndef ZDC_CLINUX_H
#define ZDC_CLINUX_H

/// Starts writing the file's dirty pages to its device without waiting for them
/// (`sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`): a later `fsync` then has little left
/// to write. Returns 0, or -1 with `errno` set.
int zdc_start_writeback(int fd);

/// Writes the file's dirty pages to its device and waits until the device has them
/// (`sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
/// SYNC_FILE_RANGE_WAIT_AFTER)`), without writing the file's metadata or flushing the device's
/// cache. Returns 0, or -1 with `errno` set.
int zdc_write_and_wait(int fd);

/// The type of the file system holding `fd` (`fstatfs(2)`'s `f_type`, e.g. `0xEF53` for ext4),
/// or -1 with `errno` set.
long zdc_file_system_type(int fd);

/// The size, inode number and link count of the file open as `fd`, from `statx(2)` asking for
/// those alone. Unlike `fstat`, it does not ask for the file's times: on a file system with
/// fine-grained ("multigrain") timestamps (ext4, XFS, btrfs, tmpfs since Linux 6.13), a query of
/// the times makes the next write give the file a new one, so that the write dirties its inode
/// and the next `fdatasync` on ext4 without a journal writes the inode table block, a device
/// request of its own. Returns 0, or -1 with `errno` set.
int zdc_file_identity(int fd, unsigned long long *size, unsigned long long *inode,
                      unsigned int *links);

/// Creates an unnamed regular file (mode 0600) in `directory`, open for reading and writing
/// (`open(directory, O_TMPFILE | O_RDWR | O_CLOEXEC)`): it disappears with its last descriptor
/// unless it is given a name (`linkat` of `/proc/self/fd/N`). Returns the descriptor, or
/// `-errno` (`EOPNOTSUPP` or `EISDIR` where the file system or kernel has no such files).
int zdc_open_tmpfile(const char *directory);

/// Copies up to `length` bytes from `in` to `out` at their file offsets, inside the kernel
/// (`copy_file_range(2)`: shared extents, a reflink, where the file system has them — btrfs,
/// XFS — else a copy in the page cache). Returns the count copied (0 at the end of `in`), or
/// `-errno` (`EXDEV`, `EOPNOTSUPP`, `ENOSYS` or `EINVAL` where it cannot).
long zdc_copy_file_range(int in, int out, unsigned long length);

/// Names the calling thread (`pthread_setname_np`; the first 15 bytes are kept). Returns 0 or
/// an error number.
int zdc_set_thread_name(const char *name);

/// Makes the calling process dumpable or not (`prctl(PR_SET_DUMPABLE)`). A process that is not
/// leaves no core dump, and other processes of its user can neither trace it nor read its
/// memory or environment through /proc. Returns 0, or -1 with `errno` set.
int zdc_set_dumpable(int dumpable);

/// 1 when the calling process is dumpable, 0 when not (`prctl(PR_GET_DUMPABLE)`).
int zdc_is_dumpable(void);

/// Up to `length` bytes from the kernel's random generator into `buffer` (`getrandom(2)`,
/// no flags). Returns the count, or -1 with `errno` set.
long zdc_getrandom(void *buffer, unsigned long length);

/// Gives the calling thread's disk reads and writes the lowest best-effort I/O priority
/// (`ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_BE level 7)`): schedulers that honour
/// priorities serve other threads' I/O first. Returns 0, or -1 with `errno` set.
int zdc_lower_io_priority(void);

/// The calling thread's I/O priority as `ioprio_get(IOPRIO_WHO_PROCESS, 0)` gives it (class in
/// the bits from 13 up, level below), or -1 with `errno` set.
int zdc_io_priority(void);

#endif
