import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

@Suite(.motoServer) struct MultipartTests {
  static let mib: UInt64 = 1 << 20

  @Test func multipartFromFileWithResumeAndStreamedDownload() throws {
    let store = try MotoServer.require().makeStore(prefix: "mp")
    let dir = try TempDir()
    defer { dir.cleanup() }
    let size = 64 * Self.mib
    let partSize = 16 * Self.mib
    let source = dir.file("source")
    try writePatternFile(source, seed: 42, size: size)

    // First "session": start, upload two parts, then stop.
    let uploadID = try store.createMultipartUpload(key: "big.data")
    var etags: [Int: String] = [:]
    for n in 1...2 {
      let lo = UInt64(n - 1) * partSize
      etags[n] = try store.uploadPart(
        key: "big.data", uploadID: uploadID, partNumber: n,
        body: .file(source, range: ByteRange(lo, lo + partSize)))
    }

    // Second "session": resume from what the store holds.
    let held = try store.listParts(key: "big.data", uploadID: uploadID)
    #expect(held.map(\.partNumber) == [1, 2])
    #expect(held.map(\.size) == [partSize, partSize])
    #expect(held.map(\.eTag) == [etags[1]!, etags[2]!])
    var parts = held
    for n in (held.count + 1)...4 {
      let lo = UInt64(n - 1) * partSize
      let e = try store.uploadPart(
        key: "big.data", uploadID: uploadID, partNumber: n,
        body: .file(source, range: ByteRange(lo, lo + partSize)))
      parts.append(UploadedPart(partNumber: n, eTag: e, size: partSize))
    }
    let eTag = try store.completeMultipartUpload(
      key: "big.data", uploadID: uploadID, parts: parts, condition: .ifNoneMatch)
    #expect(eTag.hasSuffix("-4"), "a multipart eTag names its part count")

    let info = try store.head(key: "big.data")
    #expect(info.size == size && info.eTag == eTag)

    // Streamed download to a file, whole and ranged.
    let copy = dir.file("copy")
    let got = try store.get(key: "big.data", range: nil, to: copy)
    #expect(got.size == size && got.eTag == eTag)
    #expect(try filesEqual(source, copy))
    let window = try store.get(
      key: "big.data", range: ByteRange(20 * Self.mib + 7, 21 * Self.mib + 7), to: dir.file("win"))
    #expect(window.size == size)
    #expect(
      try Data(contentsOf: dir.file("win"))
        == patternBytes(seed: 42, offset: 20 * Self.mib + 7, count: Int(Self.mib)))

    // 64 MiB up and down without holding it: measured in a process of its own (this one runs
    // other suites at the same time, whose allocations its resident set would count).
    let server = try MotoServer.require()
    let helper = try runProcess(
      BuiltProducts.executable("zdc-testhelper"),
      ["stream-rss", "s3://\(store.configuration.bucket)/rss", "big.data", "64", "16"],
      environment: [
        "AWS_ENDPOINT_URL": server.endpoint, "AWS_ENDPOINT_URL_S3": "", "AWS_REGION": "us-east-1",
        "AWS_PROFILE": "", "AWS_ACCESS_KEY_ID": server.credentials.accessKeyID,
        "AWS_SECRET_ACCESS_KEY": server.credentials.secretAccessKey, "AWS_SESSION_TOKEN": "",
      ])
    #expect(helper.status == 0, "\(helper.stderr)")
    let growth = helper.stdout.split(separator: "\n").compactMap { line -> Int? in
      line.hasPrefix("GROWTH ") ? Int(line.dropFirst(7)) : nil
    }.first
    // Holding one 16 MiB part would take 16 MiB; the whole object 64 MiB.
    #expect(
      growth.map { $0 < 12 * Int(Self.mib) } == true,
      "peak resident set rose by \(growth ?? -1) bytes")
    // The sampler does see an object read into memory (48 MiB: above glibc's largest mmap
    // threshold, so it takes fresh pages rather than reused ones).
    let control = try RSSSampler()
    let inMemory = try store.get(key: "big.data", range: ByteRange(0, 48 * Self.mib))
    #expect(inMemory.count == 48 * Int(Self.mib))
    #expect(control.stop() >= 32 * Int(Self.mib))

    #expect(store.requestCount(.createMultipartUpload) == 1)
    #expect(store.requestCount(.uploadPart) == 4)
    #expect(store.requestCount(.listParts) == 1)
    #expect(store.requestCount(.completeMultipartUpload) == 1)
  }

  @Test func singlePutFromFileRange() throws {
    let store = try MotoServer.require().makeStore()
    let dir = try TempDir()
    defer { dir.cleanup() }
    let source = dir.file("s")
    try writePatternFile(source, seed: 7, size: 3 * Self.mib + 11)
    _ = try store.put(key: "whole", body: .file(source, range: nil), condition: .ifNoneMatch)
    _ = try store.put(
      key: "slice", body: .file(source, range: ByteRange(Self.mib, 2 * Self.mib + 5)),
      condition: .none)
    #expect(try store.get(key: "whole") == (try Data(contentsOf: source)))
    #expect(
      try store.get(key: "slice")
        == patternBytes(seed: 7, offset: Self.mib, count: Int(Self.mib) + 5))
    _ = try store.put(key: "empty", body: .data(Data()), condition: .none)
    #expect(try store.head(key: "empty").size == 0)
    #expect(try store.get(key: "empty") == Data())
  }

  @Test func completeIsConditionalAndAbortFrees() throws {
    let store = try MotoServer.require().makeStore()
    _ = try store.put(key: "taken", body: .data(Data("old".utf8)), condition: .none)
    let id = try store.createMultipartUpload(key: "taken")
    let e = try store.uploadPart(
      key: "taken", uploadID: id, partNumber: 1, body: .data(Data("new".utf8)))
    #expect(throws: StoreError.preconditionFailed(key: "taken")) {
      try store.completeMultipartUpload(
        key: "taken", uploadID: id, parts: [UploadedPart(partNumber: 1, eTag: e, size: 3)],
        condition: .ifNoneMatch)
    }
    #expect(try store.get(key: "taken") == Data("old".utf8))
    try store.abortMultipartUpload(key: "taken", uploadID: id)
    #expect(throws: StoreError.notFound(key: "taken")) {
      try store.listParts(key: "taken", uploadID: id)
    }
    // Aborting twice is harmless.
    try store.abortMultipartUpload(key: "taken", uploadID: id)

    let id2 = try store.createMultipartUpload(key: "fresh")
    let e2 = try store.uploadPart(
      key: "fresh", uploadID: id2, partNumber: 1, body: .data(Data("small".utf8)))
    let done = try store.completeMultipartUpload(
      key: "fresh", uploadID: id2, parts: [UploadedPart(partNumber: 1, eTag: e2, size: 5)],
      condition: .ifNoneMatch)
    #expect(try store.head(key: "fresh").eTag == done)
    #expect(try store.get(key: "fresh") == Data("small".utf8))

    // If-Match on completion: a stale eTag is refused, the current one accepted. (moto ignores
    // If-Match on CompleteMultipartUpload; the store checks the eTag first as well.)
    let id3 = try store.createMultipartUpload(key: "fresh")
    let e3 = try store.uploadPart(
      key: "fresh", uploadID: id3, partNumber: 1, body: .data(Data("third".utf8)))
    let part3 = [UploadedPart(partNumber: 1, eTag: e3, size: 5)]
    #expect(throws: StoreError.preconditionFailed(key: "fresh")) {
      try store.completeMultipartUpload(
        key: "fresh", uploadID: id3, parts: part3, condition: .ifMatch("0123"))
    }
    _ = try store.completeMultipartUpload(
      key: "fresh", uploadID: id3, parts: part3, condition: .ifMatch(done))
    #expect(try store.get(key: "fresh") == Data("third".utf8))
  }
}
