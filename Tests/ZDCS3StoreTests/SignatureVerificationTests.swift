import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

/// Every operation against a moto that recomputes and checks each request's SigV4 signature
/// (`INITIAL_NO_AUTH_ACTION_COUNT`) and the IAM user's permissions.
///
/// moto recomputes the canonical request from werkzeug's re-serialised URL, which leaves
/// RFC 3986 sub-delimiters (`+ ! $ & ' ( ) * , ; =`), `: @ [ ]`, non-ASCII, and `/` in query
/// values unencoded where S3 (and this store) encode them, so keys and prefixes here keep to
/// the characters both agree on. The encoding itself is checked against the AWS example and in
/// `SigV4Tests`.
@Suite(.motoServerAuthenticated) struct SignatureVerificationTests {
  @Test func everyOperationIsSignedCorrectly() throws {
    let server = try MotoServer.require()
    let store = try server.makeStore()
    try exerciseEveryOperation(store)
  }

  @Test func sessionTokensAreSignedAndAccepted() throws {
    let server = try MotoServer.require()
    let temporary = try assumeRole(on: server)
    #expect(temporary.sessionToken?.isEmpty == false)
    let store = try server.using(temporary).makeStore()
    try exerciseEveryOperation(store)
    // Without the token, the temporary key is not valid.
    var config = store.configuration
    config.credentials.sessionToken = nil
    let tokenless = S3Store(configuration: config)
    #expect(throws: StoreError.self) { try tokenless.head(key: "x") }
    #expect(tokenless.retryCounts.isEmpty)
  }

  func exerciseEveryOperation(_ store: S3Store) throws {
    let dir = try TempDir()
    defer { dir.cleanup() }
    let keys = ["plain", "with space/sub-dir_x.y~z", "q?u#e/r?y", "Upper/CASE"]
    for k in keys {
      _ = try store.put(key: k, body: .data(Data(k.utf8)), condition: .ifNoneMatch)
    }
    try writePatternFile(dir.file("f"), seed: 5, size: 300_000)
    let fe = try store.put(key: "file", body: .file(dir.file("f"), range: nil), condition: .none)
    _ = try store.put(key: "file", body: .data(Data()), condition: .ifMatch(fe))
    for k in keys { #expect(try store.get(key: k) == Data(k.utf8)) }
    #expect(try store.get(key: "plain", range: ByteRange(1, 4)) == Data("lai".utf8))
    _ = try store.get(key: "plain", range: nil, to: dir.file("g"))
    #expect(try store.head(key: "with space/sub-dir_x.y~z").size == 24)
    let page = try store.list(prefix: "", startAfter: "U", continuationToken: nil, maxKeys: 2)
    #expect(page.objects.count == 2 && page.continuationToken != nil)
    let rest = try store.list(
      prefix: "", startAfter: nil, continuationToken: page.continuationToken, maxKeys: 2)
    #expect(!rest.objects.isEmpty)
    #expect(try store.listAll(prefix: "", pageSize: 2).count == keys.count + 1)
    _ = try store.copy(from: "q?u#e/r?y", to: "copy/q?u#e", condition: .ifNoneMatch)
    #expect(try store.get(key: "copy/q?u#e") == Data("q?u#e/r?y".utf8))

    let id = try store.createMultipartUpload(key: "mp key")
    let e1 = try store.uploadPart(
      key: "mp key", uploadID: id, partNumber: 1, body: .file(dir.file("f"), range: nil))
    #expect(try store.listParts(key: "mp key", uploadID: id).map(\.eTag) == [e1])
    _ = try store.completeMultipartUpload(
      key: "mp key", uploadID: id, parts: [UploadedPart(partNumber: 1, eTag: e1, size: 300_000)],
      condition: .ifNoneMatch)
    let id2 = try store.createMultipartUpload(key: "abandoned")
    try store.abortMultipartUpload(key: "abandoned", uploadID: id2)

    #expect(try store.deleteObjects(keys: keys).isEmpty)
    try store.delete(key: "file", condition: .none)
    #expect(try store.listAll(prefix: "").map(\.key).sorted() == ["copy/q?u#e", "mp key"])
    #expect(try store.probeConditionalWrites().isComplete)
    #expect(store.retryCounts.isEmpty)
  }

  @Test func aWrongSecretIsRefusedAndNotRetried() throws {
    let server = try MotoServer.require()
    let good = try server.makeStore()
    var config = good.configuration
    config.credentials.secretAccessKey += "x"
    let bad = S3Store(configuration: config)
    #expect {
      try bad.put(key: "k", body: .data(Data("v".utf8)), condition: .none)
    } throws: { error in
      if case StoreError.accessDenied(let m) = error { return m.contains("SignatureDoesNotMatch") }
      return false
    }
    #expect(bad.requestCount(.putObject) == 1)
    #expect(throws: StoreError.notFound(key: "k")) { try good.head(key: "k") }
  }
}
