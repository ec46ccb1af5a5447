import CSpawn
public import Foundation
public import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// A temporary directory removed when the value is deinitialised.
public final class TemporaryDirectory: @unchecked Sendable {
  /// The directory.
  public let url: URL

  /// Creates a fresh directory under `base`, by default the system temp dir (or
  /// `$ZDC_TEST_TMPDIR`).
  public init(_ label: String = "zdc", under base: String? = nil) throws {
    let base =
      base ?? ProcessInfo.processInfo.environment["ZDC_TEST_TMPDIR"] ?? NSTemporaryDirectory()
    let url = URL(fileURLWithPath: base).appendingPathComponent(
      "\(label)-\(getpid())-\(UUID().uuidString.prefix(8))", isDirectory: true)
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    self.url = url
  }

  /// A path inside the directory.
  public func path(_ component: String) -> URL { url.appendingPathComponent(component) }

  deinit { try? FileManager.default.removeItem(at: url) }
}

/// Locates executables built by SwiftPM next to the running test bundle.
public enum BuiltProducts {
  /// The build products directory (e.g. `.build/debug`).
  public static var directory: URL {
    var exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    // The test runner lives in `<products>/zdcfsPackageTests.xctest` (a file on Linux).
    exe.deleteLastPathComponent()
    return exe
  }

  /// The URL of a built executable product.
  public static func executable(_ name: String) -> URL {
    directory.appendingPathComponent(name)
  }
}

/// The result of running a child process to completion.
public struct ProcessResult: Sendable {
  /// Exit status (or 128 + signal).
  public var status: Int32
  /// Everything written to standard output.
  public var stdout: String
  /// Everything written to standard error.
  public var stderr: String
}

/// Runs an executable to completion, feeding `input` on stdin and collecting its output.
///
/// Spawns a ``ChildProcess`` and reads both pipes on the calling thread (`poll`).
public func runProcess(
  _ executable: URL, _ arguments: [String], environment: [String: String] = [:],
  input: String? = nil
) throws -> ProcessResult {
  var env = ProcessInfo.processInfo.environment
  env["ZDC_PASSPHRASE"] = nil
  env["ZDC_STATE_DIR"] = nil
  for (k, v) in environment { env[k] = v }
  let child = try ChildProcess(
    executable.path, arguments, environment: env, stdin: .pipe, stdout: .pipe, stderr: .pipe)
  if let input { child.writeStdin(Array(input.utf8)) }
  child.closeStdin()
  // Both outputs until both end.
  var outputs = [Data(), Data()]
  var open = [child.stdoutFD, child.stderrFD]
  var buffer = [UInt8](repeating: 0, count: 65536)
  while open.contains(where: { $0 >= 0 }) {
    var polled = open.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
    let ready = poll(&polled, nfds_t(polled.count), -1)
    if ready < 0 {
      if errno == EINTR { continue }
      child.stop()
      throw HelperError("poll: errno \(errno)")
    }
    for (i, p) in polled.enumerated() where p.fd >= 0 && p.revents != 0 {
      let n = buffer.withUnsafeMutableBytes { read(p.fd, $0.baseAddress, $0.count) }
      if n > 0 {
        outputs[i].append(contentsOf: buffer[0..<n])
      } else if n == 0 || errno != EINTR && errno != EAGAIN {
        // At its end (the descriptor itself is the child object's to close).
        open[i] = -1
      }
    }
  }
  return ProcessResult(
    status: child.wait(), stdout: String(decoding: outputs[0], as: UTF8.self),
    stderr: String(decoding: outputs[1], as: UTF8.self))
}

/// Every place under `root` (files, recursively, plus file names) where any needle occurs.
///
/// Used to prove that no plaintext name or content reached a store or a cache.
public func findPlaintext(_ needles: [Data], under root: URL) throws -> [String] {
  var hits: [String] = []
  guard let walker = FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil)
  else { return hits }
  for case let url as URL in walker {
    for needle in needles where !needle.isEmpty {
      if url.lastPathComponent.utf8.count >= needle.count,
        contains(Data(url.lastPathComponent.utf8), needle)
      {
        hits.append("name: \(url.path)")
      }
    }
    var isDir: ObjCBool = false
    guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isDir), !isDir.boolValue
    else { continue }
    for needle in try needlesFound(needles, inFile: url) {
      hits.append("content: \(url.path) contains \(needle.count) plaintext bytes")
    }
  }
  return hits
}

/// A lock-protected value for tests.
public final class Locked<Value>: @unchecked Sendable {
  // @unchecked: `stored` is only touched under `lock`.
  private let lock = NSLock()
  private var stored: Value

  public init(_ value: Value) { stored = value }

  /// Runs `body` with exclusive access to the value.
  public func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
    lock.lock()
    defer { lock.unlock() }
    return try body(&stored)
  }

  /// The value (read or replaced under the lock).
  public var value: Value {
    get { withLock { $0 } }
    set { withLock { $0 = newValue } }
  }

  /// Changes the value under the lock.
  public func mutate(_ body: (inout Value) -> Void) { withLock { body(&$0) } }
}

/// The needles that occur in a file, read in 8 MiB pieces that overlap by the longest needle
/// (big files cost no memory).
public func needlesFound(_ needles: [Data], inFile url: URL) throws -> Set<Data> {
  let handle = try FileHandle(forReadingFrom: url)
  defer { try? handle.close() }
  let overlap = max(0, (needles.map(\.count).max() ?? 1) - 1)
  var carry = Data()
  var found = Set<Data>()
  while true {
    let piece = try handle.read(upToCount: 8 << 20) ?? Data()
    if piece.isEmpty { break }
    let window = carry + piece
    for needle in needles where !needle.isEmpty && !found.contains(needle) {
      if contains(window, needle) { found.insert(needle) }
    }
    carry = window.suffix(overlap)
  }
  return found
}

/// Every object of a store whose key or bytes contain any needle: lists the whole store and
/// fetches every object (whole, in one request each), as anyone holding the bucket could.
///
/// Used to prove that no plaintext name or content reached a store, whatever its kind.
public func findPlaintext(_ needles: [Data], in store: any CloudStore) throws -> [String] {
  let needles = needles.filter { !$0.isEmpty }
  let scratch = FileManager.default.temporaryDirectory.appendingPathComponent(
    "zdc-scan-\(UUID().uuidString)")
  defer { try? FileManager.default.removeItem(at: scratch) }
  var hits: [String] = []
  for object in try store.listAll(prefix: "") {
    for needle in needles where contains(Data(object.key.utf8), needle) {
      hits.append("key: \(object.key)")
    }
    let found: Set<Data>
    if object.size <= 8 << 20 {
      let bytes = try store.get(key: object.key)
      found = Set(needles.filter { contains(bytes, $0) })
    } else {
      _ = try store.get(key: object.key, range: nil, to: scratch)
      found = try needlesFound(needles, inFile: scratch)
    }
    for needle in needles where found.contains(needle) {
      hits.append("content: \(object.key) contains \(needle.count) plaintext bytes")
    }
  }
  return hits
}

/// Whether `needle` occurs in `haystack` (memchr and memcmp: fast enough for gigabytes).
public func contains(_ haystack: Data, _ needle: Data) -> Bool {
  guard !needle.isEmpty else { return true }
  guard haystack.count >= needle.count else { return false }
  let first: Int32 = Int32(needle[needle.startIndex])
  let length: Int = needle.count
  let last: Int = haystack.count - length
  return haystack.withUnsafeBytes { (h: UnsafeRawBufferPointer) -> Bool in
    needle.withUnsafeBytes { (n: UnsafeRawBufferPointer) -> Bool in
      guard let base = h.baseAddress, let probe = n.baseAddress else { return false }
      var i = 0
      while i <= last {
        guard let p = memchr(base + i, first, last - i + 1) else { return false }
        if memcmp(p, probe, length) == 0 { return true }
        i = UnsafeRawPointer(p) - base + 1
      }
      return false
    }
  }
}
