import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

/// Retries and error mapping through the fault-injecting proxy.
@Suite(.motoServer) struct FaultTests {
  /// A store talking to moto through a new proxy.
  func proxied(attempts: Int = 5, tune: (inout S3TransportOptions) -> Void = { _ in }) throws
    -> (S3Store, FaultProxy)
  {
    let server = try MotoServer.require()
    let proxy = try FaultProxy(upstreamPort: server.port)
    var options = fastRetries(attempts: attempts)
    tune(&options)
    let store = try server.makeStore(endpoint: proxy.endpoint, transport: options)
    return (store, proxy)
  }

  @Test func resetsAnd503sAreRetried() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    let body = patternBytes(seed: 3, offset: 0, count: 200_000)
    proxy.inject(.reset, count: 2, method: "PUT")
    proxy.inject(.status(503, code: "SlowDown"), count: 2, method: "PUT")
    let e = try store.put(key: "k", body: .data(body), condition: .ifNoneMatch)
    #expect(proxy.faultsServed == 4)
    // A reset on a reused connection may be absorbed by libcurl's own resend.
    #expect((3...5).contains(store.requestCount(.putObject)))
    #expect((2...4).contains(store.retryCounts[.putObject] ?? 0))
    proxy.inject(.status(500, code: "InternalError"), method: "GET")
    proxy.inject(.reset, method: "GET")
    #expect(try store.get(key: "k") == body)
    #expect(try store.head(key: "k").eTag == e)
    // The reset hits a reused connection, which libcurl itself retries once on a fresh one, so
    // the store may see it or not.
    #expect(proxy.faultsPending == 0)
    #expect((2...3).contains(store.requestCount(.getObject)))
  }

  @Test func truncatedDownloadsAreRetriedAndIntact() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    let dir = try TempDir()
    defer { dir.cleanup() }
    let source = dir.file("src")
    try writePatternFile(source, seed: 9, size: 6 << 20)
    _ = try store.put(key: "obj", body: .file(source, range: nil), condition: .none)
    proxy.inject(.truncate, count: 2, method: "GET")
    let info = try store.get(key: "obj", range: nil, to: dir.file("out"))
    #expect(info.size == 6 << 20)
    #expect(try filesEqual(source, dir.file("out")))
    proxy.inject(.truncate, method: "GET")
    #expect(
      try store.get(key: "obj", range: ByteRange(1000, 501_000))
        == patternBytes(seed: 9, offset: 1000, count: 500_000))
    #expect(store.retryCounts[.getObject] == 3)
  }

  @Test func interruptedMultipartUploadsRewindTheirFiles() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    let dir = try TempDir()
    defer { dir.cleanup() }
    let source = dir.file("src")
    let part: UInt64 = 5 << 20
    try writePatternFile(source, seed: 11, size: 2 * part + 12345)
    let id = try store.createMultipartUpload(key: "mp")
    proxy.inject(.reset, method: "PUT")
    proxy.inject(.status(503, code: "ServiceUnavailable"), method: "PUT")
    proxy.inject(.delay(0.2), method: "PUT")
    var parts: [UploadedPart] = []
    for n in 1...3 {
      let lo = UInt64(n - 1) * part
      let hi = min(lo + part, 2 * part + 12345)
      let e = try store.uploadPart(
        key: "mp", uploadID: id, partNumber: n, body: .file(source, range: ByteRange(lo, hi)))
      parts.append(UploadedPart(partNumber: n, eTag: e, size: hi - lo))
    }
    proxy.inject(.status(503, code: "SlowDown"), method: "POST")
    proxy.inject(.errorIn200(code: "InternalError"), method: "POST")
    _ = try store.completeMultipartUpload(key: "mp", uploadID: id, parts: parts, condition: .none)
    #expect(throws: StoreError.notFound(key: "mp")) { try store.listParts(key: "mp", uploadID: id) }
    _ = try store.get(key: "mp", range: nil, to: dir.file("back"))
    #expect(try filesEqual(source, dir.file("back")))
    #expect(proxy.faultsPending == 0)
    #expect((1...2).contains(store.retryCounts[.uploadPart] ?? 0))
    #expect(store.retryCounts[.completeMultipartUpload] == 2)
  }

  @Test func slowAnswersTimeOutAndAreRetried() throws {
    let (store, proxy) = try proxied {
      $0.lowSpeedLimit = 1
      $0.lowSpeedTime = 1
    }
    defer { proxy.stop() }
    _ = try store.put(key: "k", body: .data(Data("v".utf8)), condition: .none)
    proxy.inject(.delay(3), method: "GET")
    #expect(try store.get(key: "k") == Data("v".utf8))
    // At least the delayed attempt was abandoned (a loaded machine may add more).
    #expect((store.retryCounts[.getObject] ?? 0) >= 1)
  }

  @Test func persistentFailuresBecomeTransientAfterTheLastAttempt() throws {
    let (store, proxy) = try proxied(attempts: 3)
    defer { proxy.stop() }
    proxy.inject(.status(503, code: "SlowDown"), count: 10, method: "HEAD")
    #expect(throws: StoreError.self) { try store.head(key: "k") }
    #expect(store.requestCount(.headObject) == 3)
    proxy.clearFaults()
    proxy.inject(.reset, count: 10, method: "GET")
    #expect {
      try store.get(key: "k")
    } throws: { error in
      if case StoreError.transient = error { return true }
      return false
    }
    #expect(store.requestCount(.getObject) == 3)
  }

  @Test func clientErrorsAreNeverRetried() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    proxy.inject(.status(403, code: "AccessDenied"), method: "GET")
    #expect {
      try store.get(key: "k")
    } throws: { error in
      if case StoreError.accessDenied(let m) = error { return m.contains("AccessDenied") }
      return false
    }
    proxy.inject(.status(409, code: "ConditionalRequestConflict"), method: "PUT")
    #expect(throws: StoreError.preconditionFailed(key: "k")) {
      try store.put(key: "k", body: .data(Data()), condition: .ifNoneMatch)
    }
    proxy.inject(.status(416, code: "InvalidRange"), method: "GET")
    #expect(throws: StoreError.invalidRange(key: "k", range: ByteRange(5, 6))) {
      try store.get(key: "k", range: ByteRange(5, 6))
    }
    #expect(throws: StoreError.notFound(key: "k")) { try store.get(key: "k") }
    #expect(store.retryCounts.isEmpty)
    #expect(store.requestCount(.getObject) == 3)
  }

  /// The answer to CompleteMultipartUpload is lost and the request is sent again.
  @Test func lostCompletionAnswer() throws {
    let server = try MotoServer.require()
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    let dir = try TempDir()
    defer { dir.cleanup() }
    let source = dir.file("src")
    let part: UInt64 = 5 << 20
    try writePatternFile(source, seed: 12, size: part + 100)
    func upload(_ key: String) throws -> (String, [UploadedPart]) {
      let id = try store.createMultipartUpload(key: key)
      let e1 = try store.uploadPart(
        key: key, uploadID: id, partNumber: 1, body: .file(source, range: ByteRange(0, part)))
      let e2 = try store.uploadPart(
        key: key, uploadID: id, partNumber: 2,
        body: .file(source, range: ByteRange(part, part + 100)))
      return (
        id,
        [
          UploadedPart(partNumber: 1, eTag: e1, size: part),
          UploadedPart(partNumber: 2, eTag: e2, size: 100),
        ]
      )
    }

    // moto answers a repeated completion with the object (S3 may answer NoSuchUpload).
    let (id, parts) = try upload("obj")
    proxy.inject(.loseAnswer, method: "POST")
    let eTag = try store.completeMultipartUpload(
      key: "obj", uploadID: id, parts: parts, condition: .ifNoneMatch)
    #expect(eTag == (try store.head(key: "obj").eTag))
    _ = try store.get(key: "obj", range: nil, to: dir.file("back"))
    #expect(try filesEqual(source, dir.file("back")))

    // As S3 does: the upload was completed by an attempt whose answer never came (here, by
    // another client straight to moto), and the resend is answered NoSuchUpload. The store
    // recognises the object made of its parts.
    let (id2, parts2) = try upload("obj2")
    let direct = S3Store(
      configuration: {
        var c = store.configuration
        c.endpoint = URL(string: server.endpoint)
        return c
      }())
    let done = try direct.completeMultipartUpload(
      key: "obj2", uploadID: id2, parts: parts2, condition: .none)
    proxy.inject(.reset, method: "POST")
    proxy.inject(.status(404, code: "NoSuchUpload"), method: "POST")
    #expect(
      try store.completeMultipartUpload(
        key: "obj2", uploadID: id2, parts: parts2, condition: .ifNoneMatch) == done)
    // A first-attempt 404 is not mistaken for success (even though the object is there).
    proxy.inject(.status(404, code: "NoSuchUpload"), method: "POST")
    #expect(throws: StoreError.notFound(key: "obj2")) {
      try store.completeMultipartUpload(key: "obj2", uploadID: id2, parts: parts2, condition: .none)
    }
  }

  /// A conditional PUT whose answer is lost is sent again and meets its own write (412): the
  /// store sees the content is its own and reports success; someone else's content is a 412.
  @Test func lostAnswerToConditionalPut() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    proxy.inject(.loseAnswer, method: "PUT")
    let e = try store.put(key: "rcrd", body: .data(Data("mine".utf8)), condition: .ifNoneMatch)
    #expect(e == (try store.head(key: "rcrd").eTag))
    #expect(proxy.faultsPending == 0)
    proxy.inject(.loseAnswer, method: "PUT")
    let e2 = try store.put(key: "rcrd", body: .data(Data("mine 2".utf8)), condition: .ifMatch(e))
    #expect(try store.get(key: "rcrd") == Data("mine 2".utf8))
    #expect(e2 != e)
    #expect(throws: StoreError.preconditionFailed(key: "rcrd")) {
      try store.put(key: "rcrd", body: .data(Data("theirs".utf8)), condition: .ifNoneMatch)
    }
  }

  @Test func serversIgnoringRangeAreHandled() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    let dir = try TempDir()
    defer { dir.cleanup() }
    let body = patternBytes(seed: 13, offset: 0, count: 3_000_000)
    _ = try store.put(key: "obj", body: .data(body), condition: .none)
    proxy.inject(.ignoreRange, count: 2, method: "GET")
    #expect(try store.get(key: "obj", range: ByteRange(10, 20)) == body.subdata(in: 10..<20))
    let info = try store.get(
      key: "obj", range: ByteRange(1_500_000, 2_600_000), to: dir.file("part"))
    #expect(try Data(contentsOf: dir.file("part")) == body.subdata(in: 1_500_000..<2_600_000))
    #expect(info.size == 3_000_000)
  }

  @Test func copyFailingAfter200IsRetried() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    _ = try store.put(key: "a", body: .data(Data("abc".utf8)), condition: .none)
    proxy.inject(.errorIn200(code: "InternalError"), method: "PUT")
    _ = try store.copy(from: "a", to: "b", condition: .none)
    #expect(try store.get(key: "b") == Data("abc".utf8))
    #expect(store.requestCount(.copyObject) == 2)
    // A non-retryable error inside a 200 is reported, not retried.
    proxy.inject(.errorIn200(code: "AccessDenied"), method: "PUT")
    #expect(throws: StoreError.self) { try store.copy(from: "a", to: "c", condition: .none) }
    #expect(store.requestCount(.copyObject) == 3)
  }

  @Test func connectionsAreReused() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    let before = proxy.connectionsAccepted
    for i in 0..<40 {
      _ = try store.put(key: "k\(i)", body: .data(Data([UInt8(i)])), condition: .none)
      _ = try store.get(key: "k\(i)")
    }
    #expect(proxy.connectionsAccepted - before <= 1, "sequential requests share one connection")
    #expect(store.totalRequestCount == 80)
  }

  @Test func concurrencyIsBounded() throws {
    let (store, proxy) = try proxied {
      $0.maxConcurrentRequests = 3
    }
    defer { proxy.stop() }
    proxy.inject(.delay(0.05), count: 24, method: "PUT")
    let failures = Locked(0)
    let group = DispatchGroup()
    for i in 0..<24 {
      // One thread per caller, however many cores there are.
      group.enter()
      try Threads.start(name: "test.put") {
        defer { group.leave() }
        do {
          _ = try store.put(key: "c\(i)", body: .data(Data([UInt8(i)])), condition: .none)
        } catch { failures.withLock { $0 += 1 } }
      }
    }
    group.wait()
    #expect(failures.withLock { $0 } == 0)
    #expect(proxy.maxConcurrentRequests <= 3)
    #expect(proxy.maxConcurrentRequests >= 2, "requests do run in parallel")
    #expect(try store.listAll(prefix: "c").count == 24)
  }

  @Test func malformedResponses() throws {
    let (store, proxy) = try proxied()
    defer { proxy.stop() }
    proxy.inject(.garbage, method: "GET")
    #expect {
      try store.list(prefix: "", startAfter: nil, continuationToken: nil, maxKeys: 10)
    } throws: { error in
      if case StoreError.malformedResponse = error { return true }
      return false
    }
    #expect(store.retryCounts.isEmpty)
  }
}
