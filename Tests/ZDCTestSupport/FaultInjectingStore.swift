public import Foundation
public import ZDCCore

/// A `CloudStore` wrapper that injects failures: thrown errors, delays, 412s and short
/// listings, at a configurable rate and per operation, so sync code can be tested against
/// an unreliable store. Counts the calls it passes through.
public final class FaultInjectingStore: CloudStore, @unchecked Sendable {
  /// The operations faults can target.
  public enum Operation: String, Sendable, CaseIterable {
    case list, get, head, put, delete, copy, createMultipart, uploadPart, listParts
    case completeMultipart, abortMultipart
  }

  /// What happens when a fault fires.
  public enum Fault: Sendable {
    /// Throw `StoreError.transient` without touching the store.
    case transientBefore
    /// Perform the operation, then throw `StoreError.transient` (the caller can't tell it worked).
    case transientAfter
    /// Throw `StoreError.preconditionFailed` (a spurious conflict) for writes.
    case preconditionFailed
    /// Sleep this long, then perform the operation.
    case delay(TimeInterval)
    /// For `list`: return only the first half of the page, with a continuation token.
    case partialList
  }

  private let inner: any CloudStore
  private let lock = NSLock()
  private var rules: [Operation: (rate: Double, faults: [Fault], keys: String?)] = [:]
  private var rng: any RandomNumberGenerator
  private var _counts: [Operation: Int] = [:]
  private var _injected = 0

  /// Wraps a store; with a seed, fault choices are reproducible.
  public init(_ inner: any CloudStore, seed: UInt64? = nil) {
    self.inner = inner
    if let seed { rng = SplitMix64(seed: seed) } else { rng = SystemRandomNumberGenerator() }
  }

  /// Makes `operation` fail with one of `faults` with probability `rate` (0 disables); with
  /// `keysContaining`, only calls on keys that contain it.
  public func inject(
    _ faults: [Fault], into operations: [Operation], rate: Double, keysContaining: String? = nil
  ) {
    lock.withLock { for op in operations { rules[op] = (rate, faults, keysContaining) } }
  }

  /// Removes every fault.
  public func heal() { lock.withLock { rules.removeAll() } }

  /// Calls passed through, per operation.
  public var counts: [Operation: Int] { lock.withLock { _counts } }

  /// Faults injected so far.
  public var injectedCount: Int { lock.withLock { _injected } }

  private func pick(_ op: Operation, key: String? = nil) -> Fault? {
    lock.withLock {
      _counts[op, default: 0] += 1
      guard let rule = rules[op], rule.rate > 0, !rule.faults.isEmpty else { return nil }
      if let part = rule.keys, !(key ?? "").contains(part) { return nil }
      let roll = Double(rng.next() % 1_000_000) / 1_000_000
      guard roll < rule.rate else { return nil }
      _injected += 1
      return rule.faults[Int(rng.next() % UInt64(rule.faults.count))]
    }
  }

  private func run<T>(_ op: Operation, write: Bool, key: String, _ body: () throws -> T) throws -> T
  {
    switch pick(op, key: key) {
    case nil, .partialList?: return try body()
    case .transientBefore?: throw StoreError.transient("injected fault before \(op)")
    case .transientAfter?:
      _ = try body()
      throw StoreError.transient("injected fault after \(op)")
    case .preconditionFailed?:
      if write { throw StoreError.preconditionFailed(key: key) }
      return try body()
    case .delay(let s)?:
      Thread.sleep(forTimeInterval: s)
      return try body()
    }
  }

  public func list(prefix: String, startAfter: String?, continuationToken: String?, maxKeys: Int)
    throws -> ListPage
  {
    let fault = pick(.list)
    switch fault {
    case .transientBefore?, .transientAfter?:
      throw StoreError.transient("injected fault in list")
    case .delay(let s)?:
      Thread.sleep(forTimeInterval: s)
    default: break
    }
    // A token this wrapper made continues after a key; others belong to the inner store
    // (opaque on S3).
    var after = startAfter
    var token = continuationToken
    if let t = continuationToken, t.hasPrefix(Self.tokenPrefix) {
      after = String(t.dropFirst(Self.tokenPrefix.count))
      token = nil
    }
    let page = try inner.list(
      prefix: prefix, startAfter: after, continuationToken: token, maxKeys: maxKeys)
    if case .partialList? = fault, page.objects.count > 1 {
      let half = Array(page.objects.prefix(page.objects.count / 2))
      return ListPage(
        objects: half, continuationToken: half.last.map { Self.tokenPrefix + $0.key })
    }
    return page
  }

  /// Marks the continuation tokens of shortened pages: the rest is listed after the key that
  /// follows.
  static let tokenPrefix = "zdc-fault-after:"

  public func get(key: String, range: ByteRange?) throws -> Data {
    try run(.get, write: false, key: key) { try inner.get(key: key, range: range) }
  }

  public func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo {
    try run(.get, write: false, key: key) { try inner.get(key: key, range: range, to: file) }
  }

  public func head(key: String) throws -> ObjectInfo {
    try run(.head, write: false, key: key) { try inner.head(key: key) }
  }

  public func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    try run(.put, write: true, key: key) {
      try inner.put(key: key, body: body, condition: condition)
    }
  }

  public func delete(key: String, condition: WriteCondition) throws {
    try run(.delete, write: true, key: key) { try inner.delete(key: key, condition: condition) }
  }

  public func copy(from source: String, to destination: String, condition: WriteCondition) throws
    -> String
  {
    try run(.copy, write: true, key: destination) {
      try inner.copy(from: source, to: destination, condition: condition)
    }
  }

  public func createMultipartUpload(key: String) throws -> String {
    try run(.createMultipart, write: false, key: key) { try inner.createMultipartUpload(key: key) }
  }

  public func uploadPart(key: String, uploadID: String, partNumber: Int, body: UploadBody) throws
    -> String
  {
    try run(.uploadPart, write: false, key: key) {
      try inner.uploadPart(key: key, uploadID: uploadID, partNumber: partNumber, body: body)
    }
  }

  public func listParts(key: String, uploadID: String) throws -> [UploadedPart] {
    try run(.listParts, write: false, key: key) {
      try inner.listParts(key: key, uploadID: uploadID)
    }
  }

  public func completeMultipartUpload(
    key: String, uploadID: String, parts: [UploadedPart], condition: WriteCondition
  ) throws -> String {
    try run(.completeMultipart, write: true, key: key) {
      try inner.completeMultipartUpload(
        key: key, uploadID: uploadID, parts: parts, condition: condition)
    }
  }

  public func abortMultipartUpload(key: String, uploadID: String) throws {
    try run(.abortMultipart, write: false, key: key) {
      try inner.abortMultipartUpload(key: key, uploadID: uploadID)
    }
  }
}

/// A small seeded generator (SplitMix64) for reproducible test randomness.
public struct SplitMix64: RandomNumberGenerator, Sendable {
  private var state: UInt64
  public init(seed: UInt64) { state = seed }
  public mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
}
