import CLinux
import Glibc
import Synchronization

/// The largest local file, in bytes, that the file system holding a file takes and that this
/// process may write (its `RLIMIT_FSIZE`): ext4 with 4 KiB blocks stops at 16 TiB − 4 KiB.
///
/// Probed once per directory with an unnamed temporary file in it whose size is set (sparse,
/// nothing written) by bisection; where that cannot be done, only the resource limit counts.
enum FileSizeLimit {
  private static let known = Mutex<[String: UInt64]>([:])

  /// The limit for a file at `path` (remembered per directory: no system call once known).
  static func largest(forFileAt path: String) -> UInt64 {
    let dir = directory(of: path)
    if let limit = known.withLock({ $0[dir] }) { return limit }
    let limit = probe(directory: dir, upTo: resourceLimit())
    known.withLock { $0[dir] = limit }
    return limit
  }

  /// `RLIMIT_FSIZE`, or the largest `off_t` when there is none. (Staying within it, the probe
  /// never raises SIGXFSZ.)
  static func resourceLimit() -> UInt64 {
    var rl = rlimit()
    let most = UInt64(Int64.max)
    guard getrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &rl) == 0, rl.rlim_cur != rlim_t.max
    else { return most }
    return min(most, UInt64(rl.rlim_cur))
  }

  /// The largest size up to `limit` that a temporary file in `directory` can be given.
  static func probe(directory: String, upTo limit: UInt64) -> UInt64 {
    let fd = zdc_open_tmpfile(directory)
    guard fd >= 0 else { return limit }
    defer { close(fd) }
    var lo: UInt64 = 0
    var hi = limit
    while lo < hi {
      let mid = lo + (hi - lo) / 2 + 1
      if ftruncate(fd, off_t(mid)) == 0 {
        lo = mid
      } else if errno == EFBIG || errno == EINVAL {
        hi = mid - 1
      } else {
        return limit  // not a question of size: leave it to the writes
      }
    }
    return lo
  }

  /// The directory part of `path`, found in its UTF-8 bytes: it is asked for on every file
  /// made or opened, and a search by `Character` cost about 10,000 instructions per path.
  static func directory(of path: String) -> String {
    var path = path
    return path.withUTF8 { bytes in
      guard let slash = bytes.lastIndex(of: UInt8(ascii: "/")) else { return "." }
      return slash == 0 ? "/" : String(decoding: bytes[..<slash], as: UTF8.self)
    }
  }
}
