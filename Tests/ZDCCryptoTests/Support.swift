import Foundation
import Testing
import ZDCCore

@testable import ZDCCrypto

/// Deterministic generator for reproducible property tests.
struct SplitMix64: RandomNumberGenerator {
  var state: UInt64
  init(seed: UInt64) { state = seed }
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
}

/// `count` pseudo-random bytes from `rng`.
func randomBytes(_ count: Int, _ rng: inout SplitMix64) -> Data {
  var d = Data(count: count)
  d.withUnsafeMutableBytes { p in
    var i = 0
    while i < count {
      var w = rng.next()
      let n = min(8, count - i)
      withUnsafeBytes(of: &w) { wb in
        UnsafeMutableRawBufferPointer(rebasing: p[i..<(i + n)])
          .copyMemory(from: UnsafeRawBufferPointer(rebasing: wb[0..<n]))
      }
      i += n
    }
  }
  return d
}

/// A byte pattern documented in the fixtures README.
func pattern(_ count: Int, mul: Int, add: Int) -> Data {
  Data((0..<count).map { UInt8(truncatingIfNeeded: $0 &* mul &+ add) })
}

/// Records fetch calls for a CloudFileReader over bytes in memory.
final class FetchLog: @unchecked Sendable {
  // @unchecked: guarded by `lock`.
  private let lock = NSLock()
  private var _ranges: [ByteRange] = []
  let object: Data

  init(_ object: Data) { self.object = object }

  var ranges: [ByteRange] {
    lock.lock()
    defer { lock.unlock() }
    return _ranges
  }

  func reset() {
    lock.lock()
    _ranges = []
    lock.unlock()
  }

  var fetch: @Sendable (ByteRange) throws -> Data {
    { [self] r in
      lock.lock()
      _ranges.append(r)
      lock.unlock()
      let lo = Int(min(r.lowerBound, UInt64(object.count)))
      let hi = Int(min(r.upperBound, UInt64(object.count)))
      // A slice (non-zero startIndex), as some transports return.
      return object[lo..<hi]
    }
  }
}

/// Encodes to memory.
func encodeCloudFile(
  key: Data, metadata: Data = Data(), thumbnail: Data = Data(), data: Data
) throws -> Data {
  var out = Data()
  try CloudFileEncoder(key: key).encode(metadata: metadata, thumbnail: thumbnail, data: .data(data))
  { out.append($0) }
  return out
}

/// Opens an encoded object and decrypts all three sections.
func decodeAll(key: Data, object: Data) throws -> (Data, Data, Data) {
  let log = FetchLog(object)
  let r = try CloudFileReader(key: key, ciphertextSize: UInt64(object.count), fetch: log.fetch)
  return (try r.read(.metadata), try r.read(.thumbnail), try r.read(.data))
}

/// A fresh temporary directory.
func temporaryDirectory() throws -> URL {
  let url = FileManager.default.temporaryDirectory.appendingPathComponent(
    "zdc-crypto-tests-\(UUID().uuidString)")
  try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
  return url
}

/// `Tests/Fixtures/v1`, found from this source file's path.
let fixturesDirectory: URL = URL(fileURLWithPath: #filePath)
  .deletingLastPathComponent()
  .deletingLastPathComponent()
  .appendingPathComponent("Fixtures/v1")

let regenerateFixtures = ProcessInfo.processInfo.environment["ZDC_REGENERATE_FIXTURES"] == "1"

/// True when `needle` occurs anywhere in `haystack`.
func contains(_ haystack: Data, _ needle: String) -> Bool {
  haystack.range(of: Data(needle.utf8)) != nil
}
