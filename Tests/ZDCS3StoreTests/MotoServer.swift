import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// A temporary directory removed by `cleanup()`.
struct TempDir {
  let url: URL
  init() throws {
    url = FileManager.default.temporaryDirectory
      .appendingPathComponent("zdc-s3-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
  }
  func file(_ name: String) -> URL { url.appendingPathComponent(name) }
  func cleanup() { try? FileManager.default.removeItem(at: url) }
}

/// Deterministic pseudo-random bytes (xorshift), so big files need no big buffers to check.
func patternBytes(seed: UInt64, offset: UInt64, count: Int) -> Data {
  var out = Data(count: count)
  out.withUnsafeMutableBytes { raw in
    let p = raw.bindMemory(to: UInt8.self)
    for i in 0..<count {
      var x = (offset + UInt64(i)) &* 0x9E37_79B9_7F4A_7C15 &+ seed
      x ^= x >> 29
      x = x &* 0xBF58_476D_1CE4_E5B9
      x ^= x >> 32
      p[i] = UInt8(truncatingIfNeeded: x)
    }
  }
  return out
}

/// Writes `size` pattern bytes to a file, 1 MiB at a time.
func writePatternFile(_ url: URL, seed: UInt64, size: UInt64) throws {
  _ = FileManager.default.createFile(atPath: url.path, contents: nil)
  let h = try FileHandle(forWritingTo: url)
  defer { try? h.close() }
  var off: UInt64 = 0
  while off < size {
    let n = Int(min(1 << 20, size - off))
    try h.write(contentsOf: patternBytes(seed: seed, offset: off, count: n))
    off += UInt64(n)
  }
}

/// True if two files have the same bytes (compared 1 MiB at a time).
func filesEqual(_ a: URL, _ b: URL) throws -> Bool {
  let ha = try FileHandle(forReadingFrom: a)
  let hb = try FileHandle(forReadingFrom: b)
  defer {
    try? ha.close()
    try? hb.close()
  }
  while true {
    let x = try ha.read(upToCount: 1 << 20) ?? Data()
    let y = try hb.read(upToCount: 1 << 20) ?? Data()
    if x != y { return false }
    if x.isEmpty { return true }
  }
}

/// The process's current resident set size, in bytes (from /proc/self/statm).
func currentRSS() -> Int {
  guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else {
    return 0
  }
  let fields = text.split(separator: " ")
  guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
  return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Samples the resident set size every few milliseconds on its own thread and keeps the largest.
final class RSSSampler: @unchecked Sendable {
  private let lock = NSLock()
  private var running = true
  private var peak = 0
  let start = currentRSS()

  init() throws {
    try Threads.start(name: "test.rss") { [self] in
      while true {
        let now = currentRSS()
        lock.lock()
        peak = max(peak, now)
        let go = running
        lock.unlock()
        if !go { return }
        usleep(2000)
      }
    }
  }

  /// Stops sampling; returns how far the resident set grew above where it started, in bytes.
  func stop() -> Int {
    lock.lock()
    running = false
    let p = peak
    lock.unlock()
    return max(0, p - start)
  }
}
