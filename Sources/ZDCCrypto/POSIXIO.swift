import CLinux
import Foundation
import Glibc  // zdcfs is Linux-only (FUSE 3).
import Synchronization
import ZDCCore

/// Making local files durable (against power loss, not only a crash of the process).
public enum LocalDurability {
  /// Flushes a file (or a directory's entries) to stable storage; a missing file is fine.
  public static func sync(path: String) throws {
    let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
    if fd < 0 {
      if errno == ENOENT { return }
      throw POSIXIO.error("open \(path)")
    }
    defer { Glibc.close(fd) }
    try POSIXIO.fsync(fd)
  }

  /// Flushes several files and directories to stable storage (missing ones are fine), the
  /// writeback of all of them started before the first flush waits: that flush then commits
  /// the file system's journal for all of them at once (ext4), and the others find their data
  /// written and their metadata committed. Three files cost about one flush, not three. The
  /// flushes then wait at the same time (one on the calling thread — `before`'s, else the
  /// first file's —, the others on the global queue), so that a file system that sends the
  /// device a flush per `fsync` (ext4 without a journal) has them merged; a lone flush never
  /// leaves the calling thread. `before` runs between the two steps (to flush a file known by
  /// descriptor).
  public static func sync(paths: [String], before: (() throws -> Void)? = nil) throws {
    var fds: [Int32] = []
    defer { for fd in fds { Glibc.close(fd) } }
    for path in paths {
      let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
      if fd < 0 {
        if errno == ENOENT { continue }
        throw POSIXIO.error("open \(path)")
      }
      fds.append(fd)
      // Directories and some file systems refuse it: their flush below then does it all.
      _ = zdc_start_writeback(fd)
    }
    var others = fds[...]
    let here: () throws -> Void
    if let before {
      here = before
    } else if let first = others.popFirst() {
      here = { try POSIXIO.fsync(first) }
    } else {
      return
    }
    let failure = Mutex<(any Error)?>(nil)
    let group = DispatchGroup()
    for fd in others {
      DispatchQueue.global(qos: .userInitiated).async(group: group) {
        do { try POSIXIO.fsync(fd) } catch { failure.withLock { $0 = $0 ?? error } }
      }
    }
    do { try here() } catch { failure.withLock { $0 = $0 ?? error } }
    group.wait()
    if let error = failure.withLock({ $0 }) { throw error }
  }
}

/// Thin positional I/O helpers over a file descriptor; errors become `StoreError.io`.
enum POSIXIO {
  static func error(_ what: String) -> StoreError {
    let e = errno
    return StoreError.io("\(what): \(String(cString: strerror(e)))", errno: e)
  }

  /// Reads up to `buffer.count` bytes at `offset`; returns fewer only at end of file.
  static func pread(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, _ offset: UInt64)
    throws -> Int
  {
    guard let base = buffer.baseAddress else { return 0 }
    var done = 0
    while done < buffer.count {
      let n = Glibc.pread(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
      if n < 0 {
        if errno == EINTR { continue }
        throw error("pread")
      }
      if n == 0 { break }
      done += n
    }
    return done
  }

  /// Writes all of `buffer` at `offset`.
  static func pwrite(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, _ offset: UInt64) throws {
    guard let base = buffer.baseAddress else { return }
    var done = 0
    while done < buffer.count {
      let n = Glibc.pwrite(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
      if n < 0 {
        if errno == EINTR { continue }
        throw error("pwrite")
      }
      done += n
    }
  }

  /// Reads sequentially up to `buffer.count` bytes; returns fewer only at end of file.
  static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws -> Int {
    guard let base = buffer.baseAddress else { return 0 }
    var done = 0
    while done < buffer.count {
      let n = Glibc.read(fd, base + done, buffer.count - done)
      if n < 0 {
        if errno == EINTR { continue }
        throw error("read")
      }
      if n == 0 { break }
      done += n
    }
    return done
  }

  /// Writes all of `buffer` sequentially.
  static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws {
    guard let base = buffer.baseAddress else { return }
    var done = 0
    while done < buffer.count {
      let n = Glibc.write(fd, base + done, buffer.count - done)
      if n < 0 {
        if errno == EINTR { continue }
        throw error("write")
      }
      done += n
    }
  }

  static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0o600) throws -> Int32 {
    while true {
      let fd = Glibc.open(path, flags | O_CLOEXEC, mode)
      if fd >= 0 { return fd }
      if errno == EINTR { continue }
      throw error("open \(path)")
    }
  }

  static func size(_ fd: Int32) throws -> UInt64 {
    var st = stat()
    guard fstat(fd, &st) == 0 else { throw error("fstat") }
    return UInt64(st.st_size)
  }

  static func truncate(_ fd: Int32, _ size: UInt64) throws {
    while ftruncate(fd, off_t(size)) != 0 {
      if errno == EINTR { continue }
      throw error("ftruncate")
    }
  }

  static func fsync(_ fd: Int32) throws {
    while Glibc.fsync(fd) != 0 {
      if errno == EINTR { continue }
      throw error("fsync")
    }
  }
}

/// Little-endian integer stores and loads in raw buffers.
enum LE {
  @inline(__always)
  static func store<T: FixedWidthInteger>(_ v: T, _ p: UnsafeMutableRawBufferPointer, at o: Int) {
    p.storeBytes(of: v.littleEndian, toByteOffset: o, as: T.self)
  }

  @inline(__always)
  static func load<T: FixedWidthInteger>(_ p: UnsafeRawBufferPointer, at o: Int, as: T.Type) -> T {
    T(littleEndian: p.loadUnaligned(fromByteOffset: o, as: T.self))
  }
}
