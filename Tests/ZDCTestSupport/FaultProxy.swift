import Foundation
import ZDCCore
public import ZDCS3Store

#if canImport(Glibc)
  import Glibc
#endif

/// A loopback HTTP/1.1 proxy between S3 clients and moto that counts the S3 requests it sees
/// and injects faults into chosen ones: connection resets, error statuses, delays, truncated
/// bodies, garbage bodies; it can also drop the conditional-write headers, like a server that
/// ignores them.
///
/// Each request is read whole, then either answered with a fault or forwarded to the upstream
/// server on a fresh connection (`Connection: close`) and the whole answer relayed back.
public final class FaultProxy: @unchecked Sendable {
  // @unchecked: every mutable property is only touched under `lock`.

  /// What to do to one request.
  public enum Fault: Sendable {
    /// Read the request, then reset the connection (RST).
    case reset
    /// Answer this status with an S3 XML error body.
    case status(Int, code: String)
    /// Wait this many seconds, then forward normally.
    case delay(Double)
    /// Forward, but send only half of the response body, then close.
    case truncate
    /// Answer 200 with a body that is not well-formed XML.
    case garbage
    /// Answer 200 with an S3 `<Error>` body (as CompleteMultipartUpload and CopyObject may).
    case errorIn200(code: String)
    /// Forward the request, then reset the connection instead of relaying the answer.
    case loseAnswer
    /// Forward, but relay the answer without its `Range` support: strip the request's `Range`
    /// header so the whole object comes back with 200.
    case ignoreRange
  }

  /// One UploadPart request the proxy forwarded, with the status of its answer.
  public struct PartUpload: Sendable, Hashable {
    public var uploadID: String
    public var partNumber: Int
    /// The upstream's status code (0 when no answer came back).
    public var status: Int
  }

  /// The port it listens on (127.0.0.1).
  public let port: UInt16
  private let upstreamPort: UInt16
  private var counts: [S3RequestKind: Int] = [:]
  private var parts: [PartUpload] = []
  private var openUploadIDs: Set<String> = []
  private var stripConditions = false
  private var randomFaults: [Fault] = []
  private var randomRate = 0.0
  private var rng = SplitMix64(seed: 1)
  private let listenFD: Int32
  private let lock = NSLock()
  private var plan: [(method: String?, fault: Fault)] = []
  private var served = 0
  private var forwarded = 0
  private var stopped = false
  /// Set when the accept loop has closed `listenFD`.
  private var listenClosed = false
  private var connections = 0
  private var active = 0
  private var maxActive = 0

  /// Starts listening on a free port of 127.0.0.1, forwarding to `upstreamPort` there.
  public init(upstreamPort: UInt16) throws {
    self.upstreamPort = upstreamPort
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HelperError("socket: errno \(errno)") }
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var addr = loopbackAddress(port: 0)
    let rc = withUnsafePointer(to: &addr) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard rc == 0, listen(fd, 64) == 0 else {
      close(fd)
      throw HelperError("bind/listen: errno \(errno)")
    }
    var out = sockaddr_in()
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &out) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
    }
    port = UInt16(bigEndian: out.sin_port)
    listenFD = fd
    try Threads.start(name: "test.proxy") { [self] in acceptLoop() }
  }

  /// `http://127.0.0.1:PORT`.
  public var endpoint: String { "http://127.0.0.1:\(port)" }

  /// Requests received so far, by S3 operation (faulted ones included).
  public var requestCounts: [S3RequestKind: Int] { lock.withLock { counts } }

  /// Requests of one S3 operation received so far.
  public func requestCount(_ kind: S3RequestKind) -> Int { lock.withLock { counts[kind] ?? 0 } }

  /// Every UploadPart forwarded so far, in the order the answers came back.
  public var partUploads: [PartUpload] { lock.withLock { parts } }

  /// Multipart uploads that received parts and were neither completed nor aborted since.
  public var openUploads: Set<String> { lock.withLock { openUploadIDs } }

  /// Sets every counter back to zero and forgets the part log.
  public func resetCounts() {
    lock.withLock {
      counts.removeAll()
      parts.removeAll()
    }
  }

  /// Drops (or keeps again) `If-Match` and `If-None-Match` from every request, like a server
  /// that ignores conditional writes.
  public func stripConditionalHeaders(_ on: Bool) { lock.withLock { stripConditions = on } }

  /// Applies `fault` to the next `count` requests (with this method, if given).
  public func inject(_ fault: Fault, count: Int = 1, method: String? = nil) {
    lock.lock()
    defer { lock.unlock() }
    for _ in 0..<count { plan.append((method, fault)) }
  }

  /// Drops every planned fault, and stops random ones.
  public func clearFaults() {
    lock.lock()
    plan.removeAll()
    randomFaults = []
    randomRate = 0
    lock.unlock()
  }

  /// From now on, applies one of `faults` (chosen at random, reproducibly from `seed`) to each
  /// request with probability `rate`, after the planned faults.
  public func injectRandomly(_ faults: [Fault], rate: Double, seed: UInt64) {
    lock.withLock {
      randomFaults = faults
      randomRate = rate
      rng = SplitMix64(seed: seed)
    }
  }

  /// Faults injected so far.
  public var faultsServed: Int {
    lock.lock()
    defer { lock.unlock() }
    return served
  }

  /// Client connections accepted so far.
  public var connectionsAccepted: Int {
    lock.lock()
    defer { lock.unlock() }
    return connections
  }

  /// The most requests seen in progress at once.
  public var maxConcurrentRequests: Int {
    lock.lock()
    defer { lock.unlock() }
    return maxActive
  }

  private func track(_ delta: Int) {
    lock.lock()
    active += delta
    maxActive = max(maxActive, active)
    lock.unlock()
  }

  /// Faults still planned.
  public var faultsPending: Int {
    lock.lock()
    defer { lock.unlock() }
    return plan.count
  }

  /// Stops accepting connections.
  public func stop() {
    // Wakes the accept loop, which closes the socket: closing it here could let another
    // thread open something under its number before the loop calls `accept` again.
    lock.withLock {
      stopped = true
      if !listenClosed { shutdown(listenFD, Int32(SHUT_RDWR)) }
    }
  }

  private func nextFault(method: String) -> Fault? {
    lock.lock()
    defer { lock.unlock() }
    guard let i = plan.firstIndex(where: { $0.method == nil || $0.method == method }) else {
      if !randomFaults.isEmpty, Double(rng.next() % 1_000_000) / 1_000_000 < randomRate {
        served += 1
        return randomFaults[Int(rng.next() % UInt64(randomFaults.count))]
      }
      forwarded += 1
      return nil
    }
    served += 1
    return plan.remove(at: i).fault
  }

  private func acceptLoop() {
    defer {
      lock.withLock {
        listenClosed = true
        close(listenFD)
      }
    }
    while true {
      let client = accept(listenFD, nil, nil)
      if client < 0 {
        lock.lock()
        let done = stopped
        lock.unlock()
        if done || (errno != EINTR && errno != ECONNABORTED) { return }
        continue
      }
      lock.lock()
      connections += 1
      lock.unlock()
      do {
        try Threads.start(name: "test.proxy.conn") { [self] in serve(client) }
      } catch {
        close(client)
      }
    }
  }

  private func serve(_ fd: Int32) {
    let conn = BufferedSocket(fd)
    defer { conn.close() }
    while let head = conn.readUntil(Data("\r\n\r\n".utf8)) {
      let headText = String(decoding: head, as: UTF8.self)
      var lines = headText.components(separatedBy: "\r\n").filter { !$0.isEmpty }
      guard !lines.isEmpty else { return }
      let method = String(lines[0].split(separator: " ").first ?? "")
      let target = lines[0].split(separator: " ").dropFirst().first.map(String.init) ?? "/"
      let kind = Self.classify(method: method, target: target, headers: lines.dropFirst())
      let query = Self.query(target)
      lock.withLock { counts[kind, default: 0] += 1 }
      if lock.withLock({ stripConditions }) {
        lines = lines.filter {
          let l = $0.lowercased()
          return !l.hasPrefix("if-match:") && !l.hasPrefix("if-none-match:")
        }
      }
      var length = 0
      for line in lines.dropFirst() {
        let lower = line.lowercased()
        if lower.hasPrefix("content-length:") {
          length = Int(lower.dropFirst(15).trimmingCharacters(in: .whitespaces)) ?? 0
        }
      }
      guard let body = conn.readExactly(length) else { return }
      track(1)
      defer { track(-1) }
      let fault = nextFault(method: method)
      switch fault {
      case .reset?:
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        return
      case .status(let status, let code)?:
        let xml = Data(
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>\(code)</Code><Message>injected</Message></Error>"
            .utf8)
        let reply =
          "HTTP/1.1 \(status) Injected\r\nContent-Type: application/xml\r\nContent-Length: \(method == "HEAD" ? 0 : xml.count)\r\n\r\n"
        guard conn.write(Data(reply.utf8)) else { return }
        if method != "HEAD" { guard conn.write(xml) else { return } }
        continue
      case .errorIn200(let code)?:
        let xml = Data("<Error><Code>\(code)</Code><Message>late failure</Message></Error>".utf8)
        let reply = "HTTP/1.1 200 OK\r\nContent-Length: \(xml.count)\r\n\r\n"
        guard conn.write(Data(reply.utf8) + xml) else { return }
        continue
      case .garbage?:
        let junk = Data("<ListBucketResult><Contents><Key>oops</Contents>".utf8)
        let reply = "HTTP/1.1 200 OK\r\nContent-Length: \(junk.count)\r\n\r\n"
        guard conn.write(Data(reply.utf8) + junk) else { return }
        continue
      case .delay(let seconds)?:
        Thread.sleep(forTimeInterval: seconds)
      case .truncate?, .loseAnswer?, nil:
        break
      case .ignoreRange?:
        lines = lines.filter { !$0.lowercased().hasPrefix("range:") }
      }
      lines = lines.filter {
        let l = $0.lowercased()
        return !l.hasPrefix("connection:") && !l.hasPrefix("keep-alive:")
      }
      lines.append("Connection: close")
      let request = Data((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8) + body
      let answer = forward(request)
      record(kind, query: query, response: answer)
      guard var response = answer else { return }
      // Relay the answer as if the upstream kept the connection open.
      if let end = response.range(of: Data("\r\n\r\n".utf8)) {
        let head = String(decoding: response[..<end.lowerBound], as: UTF8.self)
          .components(separatedBy: "\r\n")
          .filter { !$0.lowercased().hasPrefix("connection:") }
          .joined(separator: "\r\n")
        response = Data(head.utf8) + response[end.lowerBound...]
      }
      if case .loseAnswer? = fault {
        var l = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        return
      }
      if case .truncate? = fault {
        let split = response.range(of: Data("\r\n\r\n".utf8))?.upperBound ?? response.count
        let bodyCount = response.count - split
        _ = conn.write(response.prefix(split + bodyCount / 2))
        return
      }
      guard conn.write(response) else { return }
      // The upstream said "Connection: close"; keep the client's connection alive anyway
      // unless the answer has no length (then only closing can end it).
      let respHead = String(decoding: response.prefix(4096), as: UTF8.self).lowercased()
      if !respHead.contains("content-length:") && method != "HEAD" { return }
    }
  }

  /// Notes what a forwarded request did to multipart uploads.
  private func record(_ kind: S3RequestKind, query: [String: String], response: Data?) {
    let status =
      response.flatMap { r -> Int? in
        let line = String(decoding: r.prefix(32), as: UTF8.self)
        return line.split(separator: " ").dropFirst().first.flatMap { Int($0) }
      } ?? 0
    guard let id = query["uploadId"] else { return }
    lock.withLock {
      switch kind {
      case .uploadPart:
        parts.append(
          PartUpload(
            uploadID: id, partNumber: Int(query["partNumber"] ?? "") ?? 0, status: status))
        openUploadIDs.insert(id)
      case .completeMultipartUpload, .abortMultipartUpload:
        if (200..<300).contains(status) { openUploadIDs.remove(id) }
      default: break
      }
    }
  }

  /// The query parameters of a request target (percent-decoded).
  static func query(_ target: String) -> [String: String] {
    guard let q = target.split(separator: "?", maxSplits: 1).dropFirst().first else { return [:] }
    var out: [String: String] = [:]
    for pair in q.split(separator: "&") {
      let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
      let k = String(kv[0]).removingPercentEncoding ?? String(kv[0])
      let v = kv.count > 1 ? (String(kv[1]).removingPercentEncoding ?? String(kv[1])) : ""
      out[k] = v
    }
    return out
  }

  /// The S3 operation of a path-style request.
  static func classify(method: String, target: String, headers: ArraySlice<String>)
    -> S3RequestKind
  {
    let q = query(target)
    let path = String(target.split(separator: "?", maxSplits: 1).first ?? "/")
    let isBucket = path.split(separator: "/", omittingEmptySubsequences: true).count <= 1
    let copy = headers.contains { $0.lowercased().hasPrefix("x-amz-copy-source:") }
    switch method {
    case "GET":
      if isBucket { return .listObjects }
      return q["uploadId"] != nil ? .listParts : .getObject
    case "HEAD": return .headObject
    case "PUT":
      if isBucket { return .createBucket }
      if q["uploadId"] != nil { return .uploadPart }
      return copy ? .copyObject : .putObject
    case "POST":
      if q["delete"] != nil { return .deleteObjects }
      if q["uploads"] != nil { return .createMultipartUpload }
      return .completeMultipartUpload
    case "DELETE": return q["uploadId"] != nil ? .abortMultipartUpload : .deleteObject
    default: return .getObject
    }
  }

  private func forward(_ request: Data) -> Data? {
    let up = connectLoopback(port: upstreamPort)
    guard up >= 0 else { return nil }
    let conn = BufferedSocket(up)
    defer { conn.close() }
    guard conn.write(request) else { return nil }
    return conn.readToEnd()
  }
}

/// A socket with a read buffer.
final class BufferedSocket {
  let fd: Int32
  private var buffer = Data()

  init(_ fd: Int32) { self.fd = fd }

  func close() { _ = Glibc.close(fd) }

  private func fill() -> Bool {
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
      let n = recv(fd, &chunk, chunk.count, 0)
      if n < 0 && errno == EINTR { continue }
      if n <= 0 { return false }
      buffer.append(contentsOf: chunk[0..<n])
      return true
    }
  }

  /// Bytes up to and including `delimiter`; nil at end of stream.
  func readUntil(_ delimiter: Data) -> Data? {
    while true {
      if let r = buffer.range(of: delimiter) {
        let out = buffer.subdata(in: buffer.startIndex..<r.upperBound)
        buffer.removeSubrange(buffer.startIndex..<r.upperBound)
        return out
      }
      guard fill() else { return nil }
    }
  }

  func readExactly(_ count: Int) -> Data? {
    while buffer.count < count {
      guard fill() else { return nil }
    }
    let out = buffer.prefix(count)
    buffer.removeFirst(count)
    return Data(out)
  }

  func readToEnd() -> Data {
    while fill() {}
    defer { buffer = Data() }
    return buffer
  }

  func write(_ data: Data) -> Bool {
    data.withUnsafeBytes { raw in
      var off = 0
      while off < raw.count {
        let n = send(fd, raw.baseAddress! + off, raw.count - off, Int32(MSG_NOSIGNAL))
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return false }
        off += n
      }
      return true
    }
  }
}
