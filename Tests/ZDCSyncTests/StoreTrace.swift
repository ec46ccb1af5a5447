import Foundation
import ZDCCore
import ZDCCrypto
import ZDCTestSupport

/// A shared record of store calls, for explaining a randomized test's failure: each device
/// reaches the store through its own `TracingStore`, which appends one line per call with
/// its outcome (RCRD bodies decoded: node, size, marks; DATA by ciphertext size).
final class StoreTrace: @unchecked Sendable {
  // Safe: `lines` is only touched under `lock`.
  private let lock = NSLock()
  private var lines: [(keys: [String], text: String)] = []
  let user: TestUser

  init(user: TestUser) { self.user = user }

  func append(_ keys: [String], _ text: String) {
    lock.withLock { lines.append((keys, text)) }
  }

  /// A short description of an RCRD body.
  func describe(rcrd body: Data) -> String {
    guard let d = try? Rcrd.decode(body, userID: user.userID, keyPair: user.keys) else {
      return "undecodable"
    }
    var s = "cid=\(d.cloudID.prefix(6)) \(d.meta.name) size=\(d.meta.dataSize)"
    if d.meta.arriving { s += " ARRIVING" }
    if d.meta.moving { s += " MOVING" }
    return s
  }

  /// The lines about the objects of the node with `cloudID` (every key an RCRD of it was
  /// seen at, and the DATA beside each).
  func lines(forCloudID cloudID: String) -> [String] {
    let all = lock.withLock { lines }
    let tag = "cid=\(cloudID.prefix(6))"
    var keys = Set<String>()
    for l in all where l.text.contains(tag) {
      for k in l.keys where k.hasSuffix(".rcrd") {
        keys.insert(k)
        keys.insert(String(k.dropLast(5)) + ".data")
      }
    }
    return all.filter { !keys.isDisjoint(with: $0.keys) }.map(\.text)
  }
}

/// One device's way to the store, recording into a `StoreTrace`.
final class TracingStore: ForwardingStore, @unchecked Sendable {
  // @unchecked: immutable after init; the inner store and the trace are thread-safe.
  let inner: any CloudStore
  let device: String
  let trace: StoreTrace

  init(_ inner: any CloudStore, device: String, trace: StoreTrace) {
    self.inner = inner
    self.device = device
    self.trace = trace
  }

  private func short(_ key: String) -> String {
    let parts = key.split(separator: "/")
    guard parts.count >= 2 else { return key }
    return parts.suffix(2).map { String($0.prefix(6)) }.joined(separator: "/")
      + (key.hasSuffix(".rcrd") ? ".rcrd" : key.hasSuffix(".data") ? ".data" : "")
  }

  private func cond(_ c: WriteCondition) -> String {
    switch c {
    case .none: return ""
    case .ifNoneMatch: return " if-none"
    case .ifMatch(let e): return " if=\(e.prefix(8))"
    }
  }

  private func record<T>(
    _ keys: [String], _ what: String, _ body: () throws -> T, describe: (T) -> String
  ) throws -> T {
    let t0 = Date()
    do {
      let r = try body()
      trace.append(keys, "\(t0.timeIntervalSince1970) \(device) \(what) -> \(describe(r))")
      return r
    } catch {
      trace.append(keys, "\(t0.timeIntervalSince1970) \(device) \(what) !! \(error)")
      throw error
    }
  }

  private func bodyText(_ key: String, _ body: UploadBody) -> String {
    guard case .data(let d) = body else { return "file" }
    return key.hasSuffix(".rcrd") ? trace.describe(rcrd: d) : "\(d.count) B"
  }

  func get(key: String, range: ByteRange?) throws -> Data {
    try record(
      [key], "get \(short(key))\(range.map { " \($0)" } ?? "")",
      {
        try inner.get(key: key, range: range)
      }
    ) { d in key.hasSuffix(".rcrd") && range == nil ? trace.describe(rcrd: d) : "\(d.count) B" }
  }

  func head(key: String) throws -> ObjectInfo {
    try record([key], "head \(short(key))", { try inner.head(key: key) }) {
      "\($0.eTag.prefix(8)) \($0.size) B"
    }
  }

  func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo) {
    let info = try head(key: key)
    return (try get(key: key, range: nil), info)
  }

  func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    try record(
      [key], "put \(short(key))\(cond(condition)) [\(bodyText(key, body))]",
      { try inner.put(key: key, body: body, condition: condition) }
    ) { String($0.prefix(8)) }
  }

  func delete(key: String, condition: WriteCondition) throws {
    try record(
      [key], "delete \(short(key))\(cond(condition))",
      {
        try inner.delete(key: key, condition: condition)
      }
    ) { _ in "ok" }
  }

  func copy(from source: String, to destination: String, condition: WriteCondition) throws
    -> String
  {
    try record(
      [source, destination], "copy \(short(source)) -> \(short(destination))\(cond(condition))",
      { try inner.copy(from: source, to: destination, condition: condition) }
    ) { String($0.prefix(8)) }
  }
}
