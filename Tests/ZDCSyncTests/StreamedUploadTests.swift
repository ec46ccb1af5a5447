import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

/// Passes calls to a local-folder store, streamed puts included, counting streamed puts and
/// multipart uploads; each piece of a streamed put can be made to take a while.
final class StreamedPutRecorder: ForwardingStore, StreamingPutStore, @unchecked Sendable {
  // @unchecked: the counters and the delay are guarded by `lock`.
  let inner: any CloudStore
  private let streaming: LocalFolderStore
  private let lock = NSLock()
  private var streamedStarted = 0
  private var multipartUploads = 0
  private var delay: TimeInterval = 0

  init(_ store: LocalFolderStore) {
    inner = store
    streaming = store
  }

  /// Streamed puts begun so far.
  var streamedPuts: Int { lock.withLock { streamedStarted } }
  /// Multipart uploads created so far.
  var multipartCount: Int { lock.withLock { multipartUploads } }
  /// How long each piece of a streamed put waits before it is written.
  var pieceDelay: TimeInterval {
    get { lock.withLock { delay } }
    set { lock.withLock { delay = newValue } }
  }

  func put(
    key: String, condition: WriteCondition,
    producing produce: (_ sink: (UnsafeRawBufferPointer) throws -> Void) throws -> Void
  ) throws -> String {
    lock.withLock { streamedStarted += 1 }
    return try streaming.put(key: key, condition: condition) { sink in
      try withoutActuallyEscaping(sink) { sink in
        try produce { piece in
          let wait = pieceDelay
          if wait > 0 { Thread.sleep(forTimeInterval: wait) }
          try sink(piece)
        }
      }
    }
  }

  func createMultipartUpload(key: String) throws -> String {
    lock.withLock { multipartUploads += 1 }
    return try inner.createMultipartUpload(key: key)
  }
}

/// Large DATA uploads to the local folder go up in one streamed put: no encoded work file, no
/// parts for the store to copy together again (a third of the writes of the upload in parts).
@Suite struct StreamedUploadTests {
  private static func randomContent(_ count: Int, seed: UInt64) -> Data {
    var content = Data(count: count)
    var rng = SplitMix64(seed: seed)
    content.withUnsafeMutableBytes { b in
      for i in 0..<b.count { b[i] = UInt8(truncatingIfNeeded: rng.next()) }
    }
    return content
  }

  private static func files(under url: URL) -> [String] {
    (FileManager.default.enumerator(atPath: url.path)?.allObjects as? [String]) ?? []
  }

  /// A device on a fresh local folder behind a `StreamedPutRecorder`, uploading files of 1 MiB
  /// or more (1 MiB parts when it goes in parts), with a file `name` of `content` queued.
  private static func device(
    _ label: String, file name: String, content: Data, streaming: Bool = true
  ) throws -> (TestStore, LocalFolderStore, StreamedPutRecorder, TestUser, Device) {
    let backing = try StoreKind.local.make(label)
    let local = try #require(backing.store as? LocalFolderStore)
    let store = StreamedPutRecorder(local)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.multipartThreshold = 1 << 20
      push.partSize = 1 << 20
      push.streamLargeUploads = streaming
    }
    try a.catalog.write(user.userID) { tx in
      let n = try tx.createNode(path: TreesystemPath([name]))
      a.delegate.setContent(content, for: n)
      try tx.queueDataUpload(nodeID: n.id)
    }
    return (backing, local, store, user, a)
  }

  @Test func aLargeUploadToTheLocalFolderIsOneStreamedPut() throws {
    let content = Self.randomContent(3 << 20, seed: 21)
    let (backing, local, store, user, a) = try Self.device(
      "zdc-sync-stream", file: "big.bin", content: content)
    try a.start()
    try a.sync()
    #expect(store.streamedPuts == 1)
    #expect(store.multipartCount == 0)
    #expect(try a.cloudContent("big.bin") == content)
    // No work file, no parts, no temporary object left anywhere.
    #expect(try FileManager.default.contentsOfDirectory(atPath: a.work.url.path).isEmpty)
    let dir = try #require(backing.dir)
    let leftovers = Self.files(under: dir.url).filter {
      $0.hasPrefix(".zdc-tmp/") || $0.hasPrefix(".zdc-multipart/")
    }
    #expect(leftovers.isEmpty)
    // Another device reads it; the store holds nothing in the clear.
    let b = try Device("beta", user: user, store: local)
    try b.engine.pull.pull()
    #expect(try b.cloudContent("big.bin") == content)
    #expect(try backing.plaintext([content.prefix(64), Data("big.bin".utf8)]).isEmpty)
    a.engine.stop()
  }

  /// Newer data written while a streamed put runs goes up after it, in a streamed put of its
  /// own: the store holds the newer data at the end, and no temporary object is left.
  @Test func newerDataDuringAStreamedUploadWins() throws {
    // 4 MiB: 64 pieces of 64 KiB, at least 0.64 s.
    let first = Self.randomContent(4 << 20, seed: 22)
    let second = Self.randomContent(3 << 20, seed: 23)
    let (backing, local, store, user, a) = try Self.device(
      "zdc-sync-stream-newer", file: "v.bin", content: first)
    store.pieceDelay = 0.01
    try a.start()
    let deadline = Date().addingTimeInterval(10)
    while store.streamedPuts < 1 && Date() < deadline { Thread.sleep(forTimeInterval: 0.005) }
    try a.write("v.bin", second)
    store.pieceDelay = 0
    try a.sync()
    #expect(store.streamedPuts >= 2)
    #expect(try a.cloudContent("v.bin") == second)
    let b = try Device("beta", user: user, store: local)
    try b.engine.pull.pull()
    #expect(try b.cloudContent("v.bin") == second)
    let dir = try #require(backing.dir)
    #expect(Self.files(under: dir.url).filter { $0.hasPrefix(".zdc-tmp/") }.isEmpty)
    a.engine.stop()
  }

  /// With streamed uploads turned off, the same upload goes in parts.
  @Test func withoutStreamingALargeUploadGoesInParts() throws {
    let content = Self.randomContent(3 << 20, seed: 24)
    let (backing, _, store, _, a) = try Self.device(
      "zdc-sync-stream-off", file: "big.bin", content: content, streaming: false)
    try withExtendedLifetime(backing) {
      try a.start()
      try a.sync()
      #expect(store.streamedPuts == 0)
      #expect(store.multipartCount == 1)
      #expect(try a.cloudContent("big.bin") == content)
      a.engine.stop()
    }
  }
}
