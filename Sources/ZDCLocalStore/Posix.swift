import CSodium
import Foundation
import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// Thin wrappers over the POSIX calls the store uses, retrying on `EINTR`.
enum Posix {
  /// An errno as a message.
  static func message(_ code: Int32) -> String {
    guard let s = strerror(code) else { return "errno \(code)" }
    return String(cString: s)
  }

  /// Maps an errno from an operation on `path` to a `StoreError`.
  static func error(_ op: String, _ path: String, _ code: Int32) -> StoreError {
    let text = "\(op) \(path): \(message(code))"
    switch code {
    case EACCES, EPERM, EROFS: return .accessDenied(text)
    default: return .io(text, errno: code)
    }
  }

  /// `open(2)` with `O_CLOEXEC`; returns the descriptor or `-errno`.
  static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0o600) -> Int32 {
    while true {
      let fd = Glibc.open(path, flags | O_CLOEXEC, mode)
      if fd >= 0 { return fd }
      if errno != EINTR { return -errno }
    }
  }

  /// Closes a descriptor, ignoring errors (only used once data is synced or was only read).
  static func close(_ fd: Int32) { _ = Glibc.close(fd) }

  /// Reads up to `count` bytes at `offset`, looping over short reads; returns the bytes read.
  static func pread(
    _ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: UInt64, path: String
  ) throws -> Int {
    var done = 0
    while done < count {
      let n = Glibc.pread(fd, buffer + done, count - done, off_t(offset) + off_t(done))
      if n > 0 {
        done += n
      } else if n == 0 {
        break
      } else if errno != EINTR {
        throw error("read", path, errno)
      }
    }
    return done
  }

  /// Writes all of `buffer` at `offset`.
  static func pwrite(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, _ offset: UInt64, path: String)
    throws
  {
    guard let base = buffer.baseAddress else { return }
    var done = 0
    while done < buffer.count {
      let n = Glibc.pwrite(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
      if n >= 0 {
        done += n
      } else if errno != EINTR {
        throw error("write", path, errno)
      }
    }
  }

  /// `fsync(2)`.
  static func fsync(_ fd: Int32, path: String) throws {
    while Glibc.fsync(fd) != 0 {
      if errno != EINTR { throw error("fsync", path, errno) }
    }
  }

  /// Syncs a directory so that a rename or unlink in it is durable; best effort.
  static func fsyncDirectory(_ path: String) {
    let fd = open(path, O_RDONLY | O_DIRECTORY)
    guard fd >= 0 else { return }
    _ = Glibc.fsync(fd)
    close(fd)
  }

  /// Gives the file open at `fd` (an unnamed one too) another name, `path` (`linkat(2)` of
  /// `/proc/self/fd/N`); returns 0 or the errno.
  static func link(openFile fd: Int32, to path: String) -> Int32 {
    linkat(AT_FDCWD, "/proc/self/fd/\(fd)", AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0 ? 0 : errno
  }

  /// `fstat(2)`.
  static func fstat(_ fd: Int32, path: String) throws -> stat {
    var st = stat()
    guard Glibc.fstat(fd, &st) == 0 else { throw error("stat", path, errno) }
    return st
  }

  /// `mkdir(2)`; returns 0 or the errno (`EEXIST` included).
  static func mkdir(_ path: String, _ mode: mode_t = 0o700) -> Int32 {
    Glibc.mkdir(path, mode) == 0 ? 0 : errno
  }

  /// Creates a directory and its missing parents (no error if it exists).
  static func mkdirs(_ path: String) throws {
    var current = path.hasPrefix("/") ? "" : "."
    for component in path.split(separator: "/") {
      current += "/" + component
      let rc = mkdir(current)
      if rc != 0 && rc != EEXIST { throw error("mkdir", current, rc) }
    }
  }

  /// One directory entry: its raw name and whether it is a directory (`nil`: unknown).
  struct Entry {
    var name: [UInt8]
    var isDirectory: Bool?
  }

  /// The entries of a directory, without `.`, `..` and anything that is neither a file nor a
  /// directory; `nil` if the directory does not exist.
  static func directoryEntries(_ path: String) throws -> [Entry]? {
    guard let dir = opendir(path) else {
      if errno == ENOENT || errno == ENOTDIR { return nil }
      throw error("opendir", path, errno)
    }
    defer { closedir(dir) }
    var out: [Entry] = []
    while let entry = readdir(dir) {
      let type = Int32(entry.pointee.d_type)
      // The name in place: a record is only as long as its name (`d_reclen`), so the 256-byte
      // `d_name` array must not be copied (or written back) whole.
      let namePointer =
        UnsafeRawPointer(entry) + MemoryLayout<dirent>.offset(of: \dirent.d_name)!
      let length = strlen(namePointer.assumingMemoryBound(to: CChar.self))
      let name = Array(UnsafeRawBufferPointer(start: namePointer, count: length))
      if name == [0x2E] || name == [0x2E, 0x2E] { continue }
      let isDirectory: Bool?
      switch type {
      case Int32(DT_DIR): isDirectory = true
      case Int32(DT_REG): isDirectory = false
      case Int32(DT_UNKNOWN): isDirectory = nil
      default: continue  // symlinks, devices, sockets: never objects
      }
      out.append(Entry(name: name, isDirectory: isDirectory))
    }
    return out
  }

  /// Whether `path` is a directory; `nil` if it is missing or neither a directory nor a file.
  static func isDirectory(_ path: String) -> Bool? {
    var st = stat()
    guard lstat(path, &st) == 0 else { return nil }
    switch st.st_mode & S_IFMT {
    case S_IFDIR: return true
    case S_IFREG: return false
    default: return nil
    }
  }

  /// `count` random bytes as lower-case hex.
  static func randomHex(_ count: Int) -> String {
    var bytes = [UInt8](repeating: 0, count: count)
    bytes.withUnsafeMutableBytes { RandomBytes.fill($0) }
    return Hex.lower(bytes)
  }
}

/// Byte-string comparisons (`memcmp`), for keys in S3 order.
enum Bytes {
  /// Negative, zero or positive as `a` sorts before, equal to or after `b`.
  static func compare(_ a: [UInt8], _ b: [UInt8]) -> Int {
    a.withUnsafeBytes { pa in
      b.withUnsafeBytes { pb in
        let n = min(pa.count, pb.count)
        if n > 0, let x = pa.baseAddress, let y = pb.baseAddress {
          let c = memcmp(x, y, n)
          if c != 0 { return Int(c) }
        }
        return pa.count - pb.count
      }
    }
  }

  /// Whether `a` sorts strictly before `b`.
  static func less(_ a: [UInt8], _ b: [UInt8]) -> Bool { compare(a, b) < 0 }

  /// Whether `a` starts with `prefix`.
  static func hasPrefix(_ a: [UInt8], _ prefix: [UInt8]) -> Bool {
    guard a.count >= prefix.count else { return false }
    guard !prefix.isEmpty else { return true }
    return a.withUnsafeBytes { pa in
      prefix.withUnsafeBytes { pp in
        guard let x = pa.baseAddress, let y = pp.baseAddress else { return false }
        return memcmp(x, y, pp.count) == 0
      }
    }
  }
}

/// Lower-case hexadecimal.
enum Hex {
  private static let digits = Array("0123456789abcdef".utf8)

  /// Encodes bytes.
  static func lower(_ bytes: some Sequence<UInt8>) -> String {
    var out: [UInt8] = []
    for b in bytes {
      out.append(digits[Int(b >> 4)])
      out.append(digits[Int(b & 0x0f)])
    }
    return String(decoding: out, as: UTF8.self)
  }

  /// Whether `bytes` are exactly `count` lower-case hex digits.
  static func isLower(_ bytes: some Collection<UInt8>, count: Int) -> Bool {
    bytes.count == count
      && bytes.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
  }
}
