import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

@Suite(.motoServer) struct S3StoreTests {
  @Test func putGetHeadDelete() throws {
    let store = try MotoServer.require().makeStore(prefix: "users/u1")
    let body = Data("hello, treesystem".utf8)
    let eTag = try store.put(key: "a/b c+d.rcrd", body: .data(body), condition: .none)
    #expect(!eTag.isEmpty && !eTag.contains("\""))
    #expect(try store.get(key: "a/b c+d.rcrd") == body)
    let info = try store.head(key: "a/b c+d.rcrd")
    #expect(info.key == "a/b c+d.rcrd" && info.size == UInt64(body.count) && info.eTag == eTag)
    #expect(abs(info.lastModified.timeIntervalSinceNow) < 300)
    // Bytes and info in one request.
    let (data, both) = try store.getWithInfo(key: "a/b c+d.rcrd")
    #expect(data == body && both == info)
    #expect(store.requestCount(.getObject) == 2 && store.requestCount(.headObject) == 1)
    try store.delete(key: "a/b c+d.rcrd", condition: .none)
    #expect(throws: StoreError.notFound(key: "a/b c+d.rcrd")) {
      try store.head(key: "a/b c+d.rcrd")
    }
    #expect(throws: StoreError.notFound(key: "a/b c+d.rcrd")) { try store.get(key: "a/b c+d.rcrd") }
    // Deleting a missing object unconditionally is not an error.
    try store.delete(key: "a/b c+d.rcrd", condition: .none)
    #expect(store.requestCount(.putObject) == 1)
    #expect(store.requestCount(.getObject) == 3)
    #expect(store.requestCount(.headObject) == 2)
    #expect(store.requestCount(.deleteObject) == 2)
    #expect(store.retryCounts.isEmpty)
  }

  @Test func keysWithAwkwardCharacters() throws {
    let store = try MotoServer.require().makeStore(prefix: "p")
    // Dots that are not whole components must survive URL handling unchanged.
    let keys = ["x/.y/z", "x/..z/w", "sp ace/é/ü", "q?u=e&r#y", "plus+semi;colon:", "tilde~star*"]
    for (i, k) in keys.enumerated() {
      _ = try store.put(key: k, body: .data(Data([UInt8(i)])), condition: .none)
    }
    for (i, k) in keys.enumerated() { #expect(try store.get(key: k) == Data([UInt8(i)])) }
    let listed = try store.listAll(prefix: "").map(\.key)
    #expect(listed == keys.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) })
    #expect(throws: StoreError.invalidKey("")) { try store.head(key: "") }
    // Whole `.`/`..` components are not portable keys (ObjectKey), on S3 as locally.
    #expect(throws: StoreError.invalidKey("x/./y")) { try store.head(key: "x/./y") }
  }

  @Test func rangedReads() throws {
    let store = try MotoServer.require().makeStore()
    let body = patternBytes(seed: 1, offset: 0, count: 1000)
    _ = try store.put(key: "obj", body: .data(body), condition: .none)
    #expect(try store.get(key: "obj", range: ByteRange(0, 10)) == body.prefix(10))
    #expect(try store.get(key: "obj", range: ByteRange(990, 1000)) == body.suffix(10))
    #expect(try store.get(key: "obj", range: ByteRange(500, 501)) == body.subdata(in: 500..<501))
    // A range running past the end is cut at the end (as S3 does).
    #expect(try store.get(key: "obj", range: ByteRange(995, 2000)) == body.suffix(5))
    #expect(try store.get(key: "obj", range: ByteRange(10, 10)) == Data())
    #expect(throws: StoreError.invalidRange(key: "obj", range: ByteRange(1000, 1010))) {
      try store.get(key: "obj", range: ByteRange(1000, 1010))
    }
    #expect(throws: StoreError.invalidRange(key: "obj", range: ByteRange(5000, 5001))) {
      try store.get(key: "obj", range: ByteRange(5000, 5001))
    }
    let dir = try TempDir()
    defer { dir.cleanup() }
    let info = try store.get(key: "obj", range: ByteRange(100, 300), to: dir.file("part"))
    #expect(try Data(contentsOf: dir.file("part")) == body.subdata(in: 100..<300))
    #expect(info.size == 1000)
    let whole = try store.get(key: "obj", range: nil, to: dir.file("whole"))
    #expect(try Data(contentsOf: dir.file("whole")) == body)
    let headed = try store.head(key: "obj")
    #expect(whole.size == 1000 && whole.eTag == headed.eTag)
  }

  @Test func conditionalPuts() throws {
    let store = try MotoServer.require().makeStore()
    let e1 = try store.put(key: "k", body: .data(Data("v1".utf8)), condition: .ifNoneMatch)
    #expect(throws: StoreError.preconditionFailed(key: "k")) {
      try store.put(key: "k", body: .data(Data("v2".utf8)), condition: .ifNoneMatch)
    }
    #expect(throws: StoreError.preconditionFailed(key: "k")) {
      try store.put(
        key: "k", body: .data(Data("v2".utf8)),
        condition: .ifMatch("0123456789abcdef0123456789abcdef"))
    }
    #expect(try store.get(key: "k") == Data("v1".utf8))
    let e2 = try store.put(key: "k", body: .data(Data("v2".utf8)), condition: .ifMatch(e1))
    #expect(e2 != e1)
    #expect(throws: StoreError.preconditionFailed(key: "k")) {
      try store.put(key: "k", body: .data(Data("v3".utf8)), condition: .ifMatch(e1))
    }
    #expect(try store.get(key: "k") == Data("v2".utf8))
    // If-Match on a missing key fails too (S3 answers 404 or 412).
    #expect(throws: StoreError.self) {
      try store.put(key: "missing", body: .data(Data()), condition: .ifMatch(e1))
    }
    // A 412 is never retried.
    #expect(store.retryCounts.isEmpty)
    #expect(store.requestCount(.putObject) == 6)
  }

  @Test func probeConditionalWrites() throws {
    let store = try MotoServer.require().makeStore(prefix: "probe")
    let support = try store.probeConditionalWrites()
    #expect(support.ifNoneMatch)
    #expect(support.ifMatch)
    #expect(support.isComplete)
    #expect(store.requestCount(.putObject) == 4)
    #expect(store.requestCount(.headObject) == 2)
    #expect(store.requestCount(.deleteObject) == 1)
    #expect(try store.listAll(prefix: "").isEmpty, "the probe object is cleaned up")
  }

  @Test func conditionalDeletes() throws {
    let store = try MotoServer.require().makeStore()
    let e = try store.put(key: "d", body: .data(Data("x".utf8)), condition: .none)
    #expect(throws: StoreError.preconditionFailed(key: "d")) {
      try store.delete(key: "d", condition: .ifMatch("ffffffffffffffffffffffffffffffff"))
    }
    #expect(throws: StoreError.preconditionFailed(key: "d")) {
      try store.delete(key: "d", condition: .ifNoneMatch)
    }
    try store.delete(key: "d", condition: .ifMatch(e))
    // Gone: If-Match fails (as on the local-folder store), If-None-Match has nothing to do.
    #expect(throws: StoreError.preconditionFailed(key: "d")) {
      try store.delete(key: "d", condition: .ifMatch(e))
    }
    try store.delete(key: "d", condition: .ifNoneMatch)
    #expect(throws: StoreError.notFound(key: "d")) { try store.head(key: "d") }
  }

  @Test func copies() throws {
    let store = try MotoServer.require().makeStore(prefix: "t")
    let src = try store.put(key: "src/a b", body: .data(Data("payload".utf8)), condition: .none)
    let e = try store.copy(from: "src/a b", to: "dst/a b", condition: .ifNoneMatch)
    #expect(e == src, "same content, same single-part eTag")
    #expect(try store.get(key: "dst/a b") == Data("payload".utf8))
    #expect(throws: StoreError.notFound(key: "nothing")) {
      try store.copy(from: "nothing", to: "dst/x", condition: .none)
    }
    // Conditions apply to the destination (moto ignores them on CopyObject; the store checks
    // them with a HEAD first).
    #expect(throws: StoreError.preconditionFailed(key: "dst/a b")) {
      try store.copy(from: "src/a b", to: "dst/a b", condition: .ifNoneMatch)
    }
    #expect(throws: StoreError.preconditionFailed(key: "dst/a b")) {
      try store.copy(from: "src/a b", to: "dst/a b", condition: .ifMatch("0000"))
    }
    _ = try store.put(key: "src/a b", body: .data(Data("newer".utf8)), condition: .none)
    _ = try store.copy(from: "src/a b", to: "dst/a b", condition: .ifMatch(e))
    #expect(try store.get(key: "dst/a b") == Data("newer".utf8))
    #expect(store.requestCount(.copyObject) == 3)
  }

  @Test func listingPagination() throws {
    let store = try MotoServer.require().makeStore(prefix: "tree")
    let keys = (0..<1050).map { String(format: "dir/%05d.rcrd", $0) }
    let errors = Locked<[any Error]>([])
    DispatchQueue.concurrentPerform(iterations: 8) { worker in
      for i in stride(from: worker, to: keys.count, by: 8) {
        do {
          _ = try store.put(key: keys[i], body: .data(Data(keys[i].utf8)), condition: .ifNoneMatch)
        } catch { errors.withLock { $0.append(error) } }
      }
    }
    #expect(errors.withLock { $0.isEmpty })
    _ = try store.put(key: "other/x", body: .data(Data()), condition: .none)
    store.resetRequestCounts()

    let all = try store.listAll(prefix: "dir/", pageSize: 100)
    #expect(all.map(\.key) == keys)
    #expect(all.allSatisfy { $0.size == 14 && !$0.eTag.contains("\"") })
    #expect(store.requestCount(.listObjects) == 11)

    let first = try store.list(
      prefix: "dir/", startAfter: "dir/01000.rcrd", continuationToken: nil, maxKeys: 30)
    #expect(first.objects.map(\.key) == Array(keys[1001..<1031]))
    #expect(first.continuationToken != nil)
    let second = try store.list(
      prefix: "dir/", startAfter: nil, continuationToken: first.continuationToken, maxKeys: 30)
    #expect(second.objects.map(\.key) == Array(keys[1031..<1050]))
    #expect(second.continuationToken == nil)
    #expect(
      try store.list(prefix: "nothing/", startAfter: nil, continuationToken: nil, maxKeys: 10)
        .objects.isEmpty)

    // One DeleteObjects request per 1,000 keys.
    store.resetRequestCounts()
    let failures = try store.deleteObjects(keys: keys + ["never-existed"])
    #expect(failures.isEmpty)
    #expect(store.requestCount(.deleteObjects) == 2)
    #expect(try store.listAll(prefix: "").map(\.key) == ["other/x"])
  }

  /// `bucket.localhost:port`: moto takes the bucket from the Host header, as S3 does.
  @Test func virtualHostedAddressing() throws {
    let server = try MotoServer.require()
    let store = try server.makeStore(
      prefix: "vh", endpoint: "http://localhost:\(server.port)", addressingStyle: .virtualHosted)
    _ = try store.put(key: "a/1", body: .data(Data("one".utf8)), condition: .ifNoneMatch)
    _ = try store.copy(from: "a/1", to: "a/2", condition: .none)
    #expect(try store.get(key: "a/2", range: ByteRange(1, 3)) == Data("ne".utf8))
    #expect(try store.listAll(prefix: "a/").map(\.key) == ["a/1", "a/2"])
    #expect(try store.deleteObjects(keys: ["a/1", "a/2"]).isEmpty)
    #expect(try store.listAll(prefix: "").isEmpty)
    // The same bucket seen path-style.
    var config = store.configuration
    config.endpoint = URL(string: server.endpoint)
    config.addressingStyle = .path
    let pathStyle = S3Store(configuration: config)
    _ = try pathStyle.put(key: "p", body: .data(Data("x".utf8)), condition: .none)
    #expect(try store.get(key: "p") == Data("x".utf8))
  }

  @Test func errorMapping() throws {
    let server = try MotoServer.require()
    let store = try server.makeStore()
    // A bucket that does not exist.
    var config = try server.configuration()
    config.bucket = "no-such-bucket-\(UUID().uuidString.lowercased().prefix(8))"
    let missing = S3Store(configuration: config)
    // A missing bucket is never "no such object" (the sync engine would take every object for
    // deleted): reads and listings say the store is unavailable, naming the bucket.
    func isMissingBucket(_ error: any Error) -> Bool {
      guard case StoreError.unavailable(let m) = error else { return false }
      return m.contains(config.bucket) && m.contains("NoSuchBucket")
    }
    #expect { try missing.get(key: "k") } throws: { isMissingBucket($0) }
    #expect {
      try missing.list(prefix: "", startAfter: nil, continuationToken: nil, maxKeys: 5)
    } throws: {
      isMissingBucket($0)
    }
    #expect { try missing.checkBucket() } throws: { isMissingBucket($0) }
    #expect { try missing.put(key: "k", body: .data(Data()), condition: .ifNoneMatch) } throws: {
      isMissingBucket($0)
    }
    // A HEAD answer has no body to name the error: that one stays "not found".
    #expect(throws: StoreError.notFound(key: "k")) { try missing.head(key: "k") }
    #expect(missing.retryCounts.isEmpty)
    // Unknown upload IDs. (moto answers UploadPart to an unknown upload with a 500, not
    // NoSuchUpload, so only ListParts is checked.)
    #expect(throws: StoreError.notFound(key: "k")) {
      try store.listParts(key: "k", uploadID: "bogus")
    }
    // Nothing listens on this port: a transient error after every attempt.
    var dead = try server.configuration(
      endpoint: "http://127.0.0.1:\(try freeLoopbackPort())", transport: fastRetries(attempts: 3))
    dead.bucket = "b"
    let unreachable = S3Store(configuration: dead)
    #expect {
      try unreachable.head(key: "k")
    } throws: { error in
      guard case StoreError.transient(let m) = error else { return false }
      return m.contains("curl 7")
    }
    #expect(unreachable.requestCount(.headObject) == 3)
    #expect(unreachable.retryCounts[.headObject] == 2)
    // Uploading a file that does not exist is a local error, not a network one.
    #expect {
      try store.put(
        key: "f", body: .file(URL(fileURLWithPath: "/nonexistent/zdc"), range: nil),
        condition: .none)
    } throws: { error in
      if case StoreError.io = error { return true }
      return false
    }
  }
}
