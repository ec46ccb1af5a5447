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
  /// written and their metadata committed. The flushes then wait at the same time (one on the
  /// calling thread — `before`'s, else the first file's —, the others on the global queue);
  /// a lone flush never leaves the calling thread.
  ///
  /// `dataOnly` are files whose metadata (size, blocks) is on stable storage already, so that
  /// only their data has to be: on a file system whose every flush sends the device a cache
  /// flush (``flushingFileSystems``), one whose device another file here is flushed on gets its
  /// data written and waited for before any flush starts, and no flush of its own — the other
  /// file's flush covers it. A device's cache flush is what an `fsync` costs most (three
  /// `fsync`s at once took 0.37–0.41 ms on this project's test machine, one `fsync` after
  /// two such waits 0.18–0.25 ms). The others are flushed like `paths`.
  ///
  /// `before` runs between the two steps (to flush a file known by descriptor, on the device
  /// `beforeDevice`) and returns whether it flushed; when it did not, one file relying on its
  /// flush is flushed instead. Returns how many flushes it made.
  /// `dataOnlyDescriptors` are more such files, open (the caller keeps them open and closes
  /// them), with their device and file system type (`statfs`'s `f_type`).
  @discardableResult
  public static func sync(
    paths: [String], dataOnly: [String] = [],
    dataOnlyDescriptors: [(fd: Int32, device: UInt64, fileSystemType: Int)] = [],
    before: (() throws -> Bool)? = nil, beforeDevice: UInt64? = nil
  ) throws -> Int {
    var fds: [Int32] = []
    // Those opened here.
    var owned: [Int32] = []
    defer { for fd in owned { Glibc.close(fd) } }
    func open(_ path: String) throws -> Int32? {
      let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
      if fd < 0 {
        if errno == ENOENT { return nil }
        throw POSIXIO.error("open \(path)")
      }
      owned.append(fd)
      // Directories and some file systems refuse it: their flush below then does it all.
      _ = zdc_start_writeback(fd)
      return fd
    }
    for path in paths { if let fd = try open(path) { fds.append(fd) } }
    var candidates: [(fd: Int32, device: UInt64?, flushes: Bool)] = []
    for path in dataOnly {
      if let fd = try open(path) { candidates.append((fd, device(fd), flushesDevice(fd))) }
    }
    for d in dataOnlyDescriptors {
      candidates.append((d.fd, d.device, flushingFileSystems.contains(d.fileSystemType)))
    }
    // Devices a flush of a file here covers, and those `before`'s flush covers besides.
    var flushed = Set(fds.compactMap(device))
    let onlyBefore = before == nil ? nil : beforeDevice.flatMap { flushed.contains($0) ? nil : $0 }
    var onBefore: Int32?
    for (fd, device, flushes) in candidates {
      guard let d = device, flushes else {
        fds.append(fd)
        continue
      }
      if flushed.contains(d) || d == onlyBefore, zdc_write_and_wait(fd) == 0 {
        if onBefore == nil, d == onlyBefore { onBefore = fd }
      } else {
        // Nothing flushed on its device yet: this file is, and the next ones ride on it.
        fds.append(fd)
        flushed.insert(d)
      }
    }
    var others = fds[...]
    let here: () throws -> Bool
    if let before {
      here = before
    } else if let first = others.popFirst() {
      here = {
        try POSIXIO.fsync(first)
        return true
      }
    } else {
      return 0
    }
    var count = others.count
    let failure = Mutex<(any Error)?>(nil)
    let group = DispatchGroup()
    for fd in others {
      DispatchQueue.global(qos: .userInitiated).async(group: group) {
        do { try POSIXIO.fsync(fd) } catch { failure.withLock { $0 = $0 ?? error } }
      }
    }
    do {
      if try here() {
        count += 1
      } else if let onBefore {
        try POSIXIO.fsync(onBefore)
        count += 1
      }
    } catch { failure.withLock { $0 = $0 ?? error } }
    group.wait()
    if let error = failure.withLock({ $0 }) { throw error }
    return count
  }

  /// File systems (`statfs`'s `f_type`) whose `fsync` of a file always sends the device a
  /// cache flush, even with nothing of the file to write (ext2/3/4, XFS): their flush of one
  /// file makes durable every write the device completed before it, another file's too.
  public static let flushingFileSystems: Set<Int> = [0xEF53, 0x5846_5342]

  /// The device of the file system holding `path`, or `nil`.
  public static func device(ofPath path: String) -> UInt64? {
    var st = stat()
    guard stat(path, &st) == 0 else { return nil }
    return UInt64(st.st_dev)
  }

  /// Whether the file system holding `path` is one of ``flushingFileSystems``.
  public static func flushesDevice(ofPath path: String) -> Bool {
    POSIXIO.fileSystemType(ofPath: path).map(flushingFileSystems.contains) ?? false
  }

  private static func device(_ fd: Int32) -> UInt64? {
    var st = stat()
    guard fstat(fd, &st) == 0 else { return nil }
    return UInt64(st.st_dev)
  }

  private static func flushesDevice(_ fd: Int32) -> Bool {
    let type = zdc_file_system_type(fd)
    return type >= 0 && flushingFileSystems.contains(Int(type))
  }
}

/// Thin positional I/O helpers over a file descriptor; errors become `StoreError.io`.
enum POSIXIO {
  /// The type of the file system holding `path` (`statfs`'s `f_type`), or `nil`.
  static func fileSystemType(ofPath path: String) -> Int? {
    let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { Glibc.close(fd) }
    let type = zdc_file_system_type(fd)
    return type >= 0 ? Int(type) : nil
  }

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

  /// The file's size (without asking for its times: see `zdc_file_identity`).
  static func size(_ fd: Int32) throws -> UInt64 {
    var size: UInt64 = 0
    var inode: UInt64 = 0
    var links: UInt32 = 0
    guard zdc_file_identity(fd, &size, &inode, &links) == 0 else { throw error("statx") }
    return size
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

  /// `fdatasync(2)`: the file's data and the metadata needed to read it back (size, blocks),
  /// not its timestamps.
  static func fdatasync(_ fd: Int32) throws {
    while Glibc.fdatasync(fd) != 0 {
      if errno == EINTR { continue }
      throw error("fdatasync")
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
