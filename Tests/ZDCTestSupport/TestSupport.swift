public import Foundation
public import ZDCCore

/// A temporary directory removed when the value is deinitialised.
public final class TemporaryDirectory: @unchecked Sendable {
  /// The directory.
  public let url: URL

  /// Creates a fresh directory under the system temp dir (or `$ZDC_TEST_TMPDIR`).
  public init(_ label: String = "zdc") throws {
    let base = ProcessInfo.processInfo.environment["ZDC_TEST_TMPDIR"] ?? NSTemporaryDirectory()
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
public func runProcess(
  _ executable: URL, _ arguments: [String], environment: [String: String] = [:],
  input: String? = nil
) throws -> ProcessResult {
  let p = Process()
  p.executableURL = executable
  p.arguments = arguments
  var env = ProcessInfo.processInfo.environment
  env["ZDC_PASSPHRASE"] = nil
  env["ZDC_STATE_DIR"] = nil
  for (k, v) in environment { env[k] = v }
  p.environment = env
  let out = Pipe()
  let err = Pipe()
  let inp = Pipe()
  p.standardOutput = out
  p.standardError = err
  p.standardInput = inp
  try p.run()
  if let input { inp.fileHandleForWriting.write(Data(input.utf8)) }
  try? inp.fileHandleForWriting.close()
  // Read both pipes concurrently so neither fills up and blocks the child.
  let errBox = DataBox()
  let reader = Thread { errBox.data = err.fileHandleForReading.readDataToEndOfFile() }
  reader.start()
  let outData = out.fileHandleForReading.readDataToEndOfFile()
  p.waitUntilExit()
  while !errBox.done { usleep(1000) }
  let status =
    p.terminationReason == .uncaughtSignal ? 128 + p.terminationStatus : p.terminationStatus
  return ProcessResult(
    status: status, stdout: String(decoding: outData, as: UTF8.self),
    stderr: String(decoding: errBox.data, as: UTF8.self))
}

final class DataBox: @unchecked Sendable {
  private let lock = NSLock()
  private var _data = Data()
  private var _done = false
  var data: Data {
    get { lock.withLock { _data } }
    set {
      lock.withLock {
        _data = newValue; _done = true
      }
    }
  }
  var done: Bool { lock.withLock { _done } }
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
        Data(url.lastPathComponent.utf8).range(of: needle) != nil
      {
        hits.append("name: \(url.path)")
      }
    }
    var isDir: ObjCBool = false
    guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isDir), !isDir.boolValue
    else { continue }
    let bytes = try Data(contentsOf: url)
    for needle in needles where !needle.isEmpty && bytes.range(of: needle) != nil {
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

/// Every object of a store whose key or bytes contain any needle: lists the whole store and
/// fetches every object (in 8 MiB ranges), as anyone holding the bucket could.
///
/// Used to prove that no plaintext name or content reached a store, whatever its kind.
public func findPlaintext(_ needles: [Data], in store: any CloudStore) throws -> [String] {
  let needles = needles.filter { !$0.isEmpty }
  let overlap = UInt64(max(0, (needles.map(\.count).max() ?? 1) - 1))
  let step: UInt64 = 8 << 20
  var hits: [String] = []
  for object in try store.listAll(prefix: "") {
    for needle in needles where Data(object.key.utf8).range(of: needle) != nil {
      hits.append("key: \(object.key)")
    }
    var offset: UInt64 = 0
    var found = Set<Data>()
    while offset < object.size {
      let end = min(object.size, offset + step + overlap)
      let bytes = try store.get(key: object.key, range: ByteRange(offset, end))
      for needle in needles where !found.contains(needle) && bytes.range(of: needle) != nil {
        found.insert(needle)
        hits.append("content: \(object.key) contains \(needle.count) plaintext bytes")
      }
      offset += step
    }
  }
  return hits
}
