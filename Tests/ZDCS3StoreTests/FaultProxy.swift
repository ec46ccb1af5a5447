import Foundation
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// A loopback HTTP/1.1 proxy between the client and moto that injects faults into chosen
/// requests: connection resets, error statuses, delays, truncated bodies, garbage bodies.
///
/// Each request is read whole, then either answered with a fault or forwarded to the upstream
/// server on a fresh connection (`Connection: close`) and the whole answer relayed back.
final class FaultProxy: @unchecked Sendable {
  enum Fault: Sendable {
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

  let port: UInt16
  private let upstreamPort: UInt16
  private let listenFD: Int32
  private let lock = NSLock()
  private var plan: [(method: String?, fault: Fault)] = []
  private var served = 0
  private var forwarded = 0
  private var stopped = false
  private var connections = 0
  private var active = 0
  private var maxActive = 0

  /// Starts listening on a free port of 127.0.0.1.
  init(upstreamPort: UInt16) throws {
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
    let thread = Thread { [self] in acceptLoop() }
    thread.start()
  }

  var endpoint: String { "http://127.0.0.1:\(port)" }

  /// Applies `fault` to the next `count` requests (with this method, if given).
  func inject(_ fault: Fault, count: Int = 1, method: String? = nil) {
    lock.lock()
    defer { lock.unlock() }
    for _ in 0..<count { plan.append((method, fault)) }
  }

  /// Drops every planned fault.
  func clearFaults() {
    lock.lock()
    plan.removeAll()
    lock.unlock()
  }

  /// Faults injected so far.
  var faultsServed: Int {
    lock.lock()
    defer { lock.unlock() }
    return served
  }

  /// Client connections accepted so far.
  var connectionsAccepted: Int {
    lock.lock()
    defer { lock.unlock() }
    return connections
  }

  /// The most requests seen in progress at once.
  var maxConcurrentRequests: Int {
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
  var faultsPending: Int {
    lock.lock()
    defer { lock.unlock() }
    return plan.count
  }

  /// Stops accepting connections.
  func stop() {
    lock.lock()
    stopped = true
    lock.unlock()
    shutdown(listenFD, Int32(SHUT_RDWR))
    close(listenFD)
  }

  private func nextFault(method: String) -> Fault? {
    lock.lock()
    defer { lock.unlock() }
    guard let i = plan.firstIndex(where: { $0.method == nil || $0.method == method }) else {
      forwarded += 1
      return nil
    }
    served += 1
    return plan.remove(at: i).fault
  }

  private func acceptLoop() {
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
      let thread = Thread { [self] in serve(client) }
      thread.start()
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
      guard var response = forward(request) else { return }
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
