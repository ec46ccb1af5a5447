import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCDisk
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

/// A store wrapper that records the byte ranges read, to prove what a download fetched.
final class RecordingStore: ForwardingStore, @unchecked Sendable {
  let inner: any CloudStore
  private let lock = NSLock()
  private var _reads: [(key: String, range: ByteRange?, bytes: Int)] = []
  private var _heads = 0

  init(_ inner: any CloudStore) { self.inner = inner }

  var reads: [(key: String, range: ByteRange?, bytes: Int)] { lock.withLock { _reads } }
  var heads: Int { lock.withLock { _heads } }
  var bytesRead: Int { reads.reduce(0) { $0 + $1.bytes } }
  func reset() {
    lock.withLock {
      _reads = []; _heads = 0
    }
  }

  func get(key: String, range: ByteRange?) throws -> Data {
    let d = try inner.get(key: key, range: range)
    lock.withLock { _reads.append((key, range, d.count)) }
    return d
  }
  func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo {
    let info = try inner.get(key: key, range: range, to: file)
    lock.withLock { _reads.append((key, range, Int(range?.count ?? info.size))) }
    return info
  }
  func head(key: String) throws -> ObjectInfo {
    lock.withLock { _heads += 1 }
    return try inner.head(key: key)
  }
}

/// Real pieces: a store (a local folder or an S3 bucket), an on-disk catalog with one user, a
/// disk manager, and a download manager reading through fault-injecting and recording wrappers.
final class DownloadFixture: @unchecked Sendable {
  let tmp: TemporaryDirectory
  let backing: TestStore
  let local: any CloudStore
  let recorder: RecordingStore
  let faults: FaultInjectingStore
  let catalog: Catalog
  let disk: DiskManager
  let progress = ProgressTracker()
  let downloads: DownloadManager
  let userID = "alice"

  init(_ kind: StoreKind, options: DownloadOptions = DownloadOptions(), seed: UInt64? = 1) throws {
    tmp = try TemporaryDirectory("download")
    backing = try kind.make("download-store")
    local = backing.store
    recorder = RecordingStore(local)
    faults = FaultInjectingStore(recorder, seed: seed)
    catalog = try Catalog.temporary()
    try catalog.createLocalUser(
      LocalUser(
        id: userID, treeID: "com.example.zdcfs", boxPublicKey: SecureRandom.bytes(32),
        signPublicKey: SecureRandom.bytes(32)))
    disk = try DiskManager(
      directory: tmp.path("state"),
      key: try KeyDerivation.key(for: .localCache, secret: SecureRandom.bytes(32)))
    var o = options
    o.initialBackoff = min(o.initialBackoff, 0.002)
    downloads = DownloadManager(
      store: faults, disk: disk, catalog: catalog, userID: userID, progress: progress, options: o)
  }

  /// Creates a node and uploads its DATA object directly to the store (not counted);
  /// records the object's eTag on the node, as a pull would.
  @discardableResult
  func makeNode(
    _ name: String, data: Data, metadata: Data = Data(), thumbnail: Data = Data()
  ) throws -> Node {
    let node = try catalog.write(userID) { tx in
      try tx.createNode(path: try TreesystemPath([name]))
    }
    try upload(node, data: data, metadata: metadata, thumbnail: thumbnail)
    return node
  }

  /// Writes a new version of a node's DATA object; with `record`, the catalog learns its eTag.
  @discardableResult
  func upload(
    _ node: Node, data: Data, metadata: Data = Data(), thumbnail: Data = Data(),
    record: Bool = true
  ) throws -> String {
    var object = Data()
    try CloudFileEncoder(key: node.encryptionKey).encode(
      metadata: metadata, thumbnail: thumbnail, data: .data(data)
    ) { object.append($0) }
    return try putObject(node, object, record: record)
  }

  @discardableResult
  func putObject(_ node: Node, _ object: Data, record: Bool = true) throws -> String {
    let loc = try location(node)
    let eTag = try local.put(key: loc.dataKey, body: .data(object), condition: .none)
    if record { try setDataETag(node, eTag) }
    return eTag
  }

  func setDataETag(_ node: Node, _ eTag: String?) throws {
    try catalog.write(userID) { tx in
      let n = try tx.existingNode(id: node.id)
      try tx.setCloudState(
        nodeID: n.id, eTagRcrd: n.eTagRcrd, lastModifiedRcrd: n.lastModifiedRcrd, eTagData: eTag,
        lastModifiedData: Date(), cloudDataInfo: n.cloudDataInfo)
    }
  }

  func location(_ node: Node) throws -> CloudObjectRef {
    try #require(try catalog.read(userID) { try $0.objectLocation(of: node.id) })
  }

  func node(_ id: NodeID) throws -> Node {
    try catalog.read(userID) { try $0.existingNode(id: id) }
  }

  var gets: Int { faults.counts[.get] ?? 0 }
}

func randomData(_ count: Int, seed: UInt64 = 7) -> Data {
  var rng = SplitMix64(seed: seed)
  var d = Data(count: count)
  d.withUnsafeMutableBytes { p in
    let words = p.bindMemory(to: UInt64.self)
    for i in 0..<words.count { words[i] = rng.next() }
  }
  return d
}

func text(_ marker: String, count: Int) -> Data {
  var d = Data()
  let unit = Data("\(marker)|".utf8)
  while d.count < count { d.append(unit) }
  return d.prefix(count)
}

@Suite(.motoServer) struct DownloadManagerTests {
  @Test(arguments: StoreKind.all)
  func downloadsOnceThenServesFromTheCache(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let content = text("whole-file-content", count: 300_000)
    let node = try f.makeNode("report.txt", data: content, metadata: Data("m".utf8))
    let seen = Results()
    f.progress.addObserver { p in
      if let op = p.operations.first, op.kind == "download", op.nodeID == node.id,
        p.download.inFlightItems == 1
      {
        seen.add(op.doneBytes == 0 || op.doneBytes == op.totalBytes)
      }
    }
    let h = try f.downloads.downloadData(nodeID: node.id)
    #expect(!seen.all.isEmpty)
    #expect(try h.readAll() == content)
    #expect(h.isComplete)
    h.close()
    #expect(f.gets == 1)
    let again = try f.downloads.downloadData(nodeID: node.id)
    #expect(try again.readAll() == content)
    again.close()
    #expect(f.gets == 1)
    // The sizes are recorded on the node.
    let info = try #require(try f.node(node.id).cloudDataInfo)
    #expect(info.dataSize == UInt64(content.count))
    #expect(info.metadataSize == 1)
    #expect(try info.eTag == f.node(node.id).eTagData)
    let p = f.progress.snapshot
    #expect(p.download.doneItems == 1)
    #expect(p.download.inFlightItems == 0)
    #expect(p.operations.isEmpty)
    #expect(p.isIdle)
  }

  @Test(arguments: StoreKind.all)
  func twentyThreadsShareOneDownload(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let content = randomData(2_000_000)
    let node = try f.makeNode("shared.bin", data: content)
    f.faults.inject([.delay(0.3)], into: [.get], rate: 1)
    let results = Results()
    let group = DispatchGroup()
    for _ in 0..<20 {
      group.enter()
      try Threads.start(name: "test.download") {
        defer { group.leave() }
        do {
          let h = try f.downloads.downloadData(nodeID: node.id)
          results.add(try h.readAll() == content)
          h.close()
        } catch {
          results.add(false)
        }
      }
    }
    group.wait()
    #expect(results.all.count == 20)
    #expect(results.all.allSatisfy { $0 })
    #expect(f.gets == 1)
    #expect(f.recorder.reads.count == 1)
    #expect(f.disk.usage.entries == 1)
    #expect(f.disk.usage.pinnedEntries == 0)
  }

  @Test(arguments: StoreKind.all)
  func rangedReadOfALargeFileFetchesOnlyItsChunks(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let size = 20 << 20
    let content = randomData(size, seed: 99)
    let meta = Data("meta".utf8)
    let node = try f.makeNode("big.bin", data: content, metadata: meta)
    let window = ByteRange(10 << 20, (10 << 20) + 100_000)
    let h = try f.downloads.downloadRange(nodeID: node.id, range: window, readAhead: 0)
    #expect(!h.isComplete)
    #expect(h.contains(window))
    #expect(!h.contains(ByteRange(0, 1)))
    #expect(
      try h.read(offset: window.lowerBound, count: Int(window.count))
        == content[Int(window.lowerBound)..<Int(window.upperBound)])
    h.close()
    // What was fetched: the header with chunk 0 (to authenticate the section sizes), then
    // exactly the object chunks covering the cache chunks of the window.
    let sizes = CloudFileSizes(
      metadataSize: UInt64(meta.count), thumbnailSize: 0, dataSize: UInt64(size))
    let stream = try #require(
      CloudFileFormat.plaintextSize(
        metadataSize: sizes.metadataSize, thumbnailSize: 0, dataSize: sizes.dataSize))
    let cacheChunks = CacheChunks.chunks(covering: window, fileSize: UInt64(size))
    let dataBytes = CacheChunks.byteRange(of: cacheChunks, fileSize: UInt64(size))
    let start = sizes.streamRange(of: .data).lowerBound
    let expected = CloudFileFormat.ciphertextRange(
      forPlaintext: ByteRange(start + dataBytes.lowerBound, start + dataBytes.upperBound),
      plaintextSize: stream)
    let reads = f.recorder.reads
    #expect(reads.count == 2)
    #expect(reads.last?.range == expected)
    #expect(f.recorder.heads == 1)
    let headerBytes = CloudFileFormat.ciphertextRange(forChunks: 0..<1, plaintextSize: stream)
    #expect(f.recorder.bytesRead == Int(headerBytes.upperBound + expected.count))
    #expect(f.recorder.bytesRead < 300_000)

    // The same window again: local. A nearby window: only its own chunks (header known).
    f.recorder.reset()
    try f.downloads.downloadRange(nodeID: node.id, range: window, readAhead: 0).close()
    #expect(f.recorder.reads.isEmpty)
    let next = ByteRange(window.upperBound + 200_000, window.upperBound + 201_000)
    let h2 = try f.downloads.downloadRange(nodeID: node.id, range: next, readAhead: 300_000)
    #expect(f.recorder.reads.count == 1)
    #expect(f.recorder.heads == 0)
    #expect(h2.contains(ByteRange(next.lowerBound, next.upperBound + 250_000)))
    #expect(
      try h2.read(offset: next.lowerBound, count: 1000)
        == content[Int(next.lowerBound)..<Int(next.upperBound)])
    h2.close()
    #expect(f.recorder.bytesRead < 700_000)
    #expect(f.disk.usage.bytes < 1 << 20)
    #expect(try f.node(node.id).cloudDataInfo?.dataSize == UInt64(size))

    // Concurrent readers of one window share its download.
    f.recorder.reset()
    let far = ByteRange(15 << 20, (15 << 20) + 10)
    f.faults.inject([.delay(0.2)], into: [.get], rate: 1)
    let group = DispatchGroup()
    let results = Results()
    for _ in 0..<10 {
      group.enter()
      try Threads.start(name: "test.download") {
        defer { group.leave() }
        let h = try? f.downloads.downloadRange(nodeID: node.id, range: far, readAhead: 0)
        results.add(
          (try? h?.read(offset: far.lowerBound, count: 10))
            == content[(15 << 20)..<((15 << 20) + 10)])
        h?.close()
      }
    }
    group.wait()
    #expect(results.all.allSatisfy { $0 })
    #expect(f.recorder.reads.count == 1)
  }

  /// A cold sequential read (as `cat` or `cp` of a mounted file does) grows its read-ahead:
  /// 40 MiB in about 10 requests rather than 40; a read elsewhere goes back to the default.
  @Test(arguments: StoreKind.all)
  func sequentialReadsGrowTheirReadAhead(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let size = 40 << 20
    let content = randomData(size, seed: 5)
    let node = try f.makeNode("movie.bin", data: content)
    f.recorder.reset()
    var offset = 0
    while offset < size {
      let range = ByteRange(UInt64(offset), UInt64(min(size, offset + (128 << 10))))
      let h = try f.downloads.downloadRange(nodeID: node.id, range: range)
      #expect(
        try h.read(offset: range.lowerBound, count: Int(range.count))
          == content[offset..<offset + Int(range.count)])
      h.close()
      offset += 128 << 10
    }
    // The header, then 1 (+ the default), 2, 4, 8, 16, 32 MiB windows, give or take.
    #expect(f.recorder.reads.count <= 10, "\(f.recorder.reads.map(\.bytes))")
    #expect(f.recorder.bytesRead < size + (1 << 20))
    // A read that does not follow cached bytes takes the default read-ahead.
    let g = try DownloadFixture(kind)
    let other = try g.makeNode("other.bin", data: content)
    g.recorder.reset()
    let far = ByteRange(30 << 20, (30 << 20) + 4096)
    try g.downloads.downloadRange(nodeID: other.id, range: far).close()
    #expect(g.recorder.bytesRead < (1 << 20) + 300_000, "\(g.recorder.reads.map(\.bytes))")
  }

  @Test(arguments: StoreKind.all)
  func metadataAndThumbnailWithoutTheData(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let meta = text("META-SECTION", count: 3000)
    let thumb = text("THUMB-SECTION", count: 90_000)
    let node = try f.makeNode(
      "photo.jpg", data: randomData(3_000_000), metadata: meta, thumbnail: thumb)
    #expect(try f.downloads.metadata(nodeID: node.id) == meta)
    #expect(try f.downloads.thumbnail(nodeID: node.id) == thumb)
    #expect(f.recorder.bytesRead < 250_000)
    #expect(f.disk.usage.entries == 0)
    let info = try f.downloads.cloudDataInfo(nodeID: node.id)
    #expect(info.thumbnailSize == UInt64(thumb.count))
    // A node without a thumbnail answers from the recorded sizes, without the store.
    let plain = try f.makeNode("plain.txt", data: Data("x".utf8))
    _ = try f.downloads.cloudDataInfo(nodeID: plain.id)
    f.recorder.reset()
    #expect(try f.downloads.thumbnail(nodeID: plain.id).isEmpty)
    #expect(f.recorder.reads.isEmpty)
  }

  @Test(arguments: StoreKind.all)
  func retriesTransientFaults(_ kind: StoreKind) throws {
    var options = DownloadOptions()
    options.maxAttempts = 30
    let f = try DownloadFixture(kind, options: options, seed: 42)
    let content = text("retry", count: 500_000)
    let node = try f.makeNode("retry.txt", data: content)
    f.faults.inject([.transientBefore, .transientAfter], into: [.get, .head], rate: 0.5)
    let h = try f.downloads.downloadData(nodeID: node.id)
    #expect(try h.readAll() == content)
    h.close()
    #expect(f.faults.injectedCount > 0)
    let big = try f.makeNode("ranged.txt", data: text("ranged", count: 700_000))
    let r = try f.downloads.downloadRange(nodeID: big.id, range: ByteRange(300_000, 400_000))
    #expect(try r.read(offset: 300_000, count: 10) == text("ranged", count: 300_010).suffix(10))
    r.close()

    // Bounded: a store that always fails is given up on after maxAttempts.
    var few = DownloadOptions()
    few.maxAttempts = 3
    let g = try DownloadFixture(kind, options: few)
    let n = try g.makeNode("down.txt", data: content)
    g.faults.inject([.transientBefore], into: [.get], rate: 1)
    #expect(throws: StoreError.self) { try g.downloads.downloadData(nodeID: n.id) }
    #expect(g.gets == 3)
    #expect(g.disk.usage.entries == 0)
    #expect(g.progress.snapshot.lastError != nil)
    #expect(g.progress.snapshot.download.inFlightItems == 0)
  }

  @Test(arguments: StoreKind.all)
  func tamperedObjectsAreRejectedAndNeverCached(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let content = text("tamper", count: 400_000)
    let node = try f.makeNode("t.txt", data: content)
    var object = try f.local.get(key: try f.location(node).dataKey)
    object[200_000] ^= 1
    try f.putObject(node, object)
    #expect {
      try f.downloads.downloadData(nodeID: node.id)
    } throws: { error in
      if case SyncError.badRemoteObject = error { return true }
      return false
    }
    #expect {
      try f.downloads.downloadRange(
        nodeID: node.id, range: ByteRange(190_000, 200_000), readAhead: 0)
    } throws: { error in
      if case SyncError.badRemoteObject = error { return true }
      return false
    }
    #expect(f.disk.usage.entries <= 1)  // at most the empty partial entry
    #expect(
      f.disk.cachedFile(cloudID: node.cloudID, eTag: try f.node(node.id).eTagData!)?.isComplete
        != true)
    let leftovers = try FileManager.default.contentsOfDirectory(atPath: f.disk.cacheDirectory.path)
    #expect(leftovers.filter { $0.hasPrefix("dl-") }.isEmpty)
    // A node key that is not the object's: rejected as well.
    let other = try f.makeNode("other.txt", data: content)
    try f.putObject(other, try f.local.get(key: try f.location(node).dataKey))
    #expect(throws: SyncError.self) { try f.downloads.metadata(nodeID: other.id) }
  }

  @Test(arguments: StoreKind.all)
  func reportsADataObjectChangedUnderneath(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let node = try f.makeNode("c.txt", data: text("v1", count: 100_000))
    let old = try f.node(node.id).eTagData!
    // Another device uploaded a new version; this catalog has not pulled it yet.
    let new = try f.upload(node, data: text("v2", count: 100_000), record: false)
    #expect(throws: DownloadError.remoteChanged(nodeID: node.id, expected: old, found: new)) {
      try f.downloads.downloadData(nodeID: node.id)
    }
    #expect(throws: DownloadError.remoteChanged(nodeID: node.id, expected: old, found: new)) {
      try f.downloads.downloadRange(nodeID: node.id, range: ByteRange(0, 10))
    }
    // After the pull: fine.
    try f.setDataETag(node, new)
    #expect(try f.downloads.downloadData(nodeID: node.id).readAll() == text("v2", count: 100_000))
    // Deleted remotely.
    try f.local.delete(key: try f.location(node).dataKey, condition: .none)
    try f.setDataETag(node, "gone-etag")
    #expect(throws: DownloadError.remoteChanged(nodeID: node.id, expected: "gone-etag", found: nil))
    {
      try f.downloads.downloadData(nodeID: node.id)
    }
    // Never uploaded.
    let fresh = try f.catalog.write(f.userID) {
      try $0.createNode(path: try TreesystemPath(["new"]))
    }
    #expect(throws: DownloadError.noData(fresh.id)) {
      try f.downloads.downloadData(nodeID: fresh.id)
    }
  }

  @Test(arguments: StoreKind.all)
  func corruptCacheEntryIsDroppedAndDownloadedAgain(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let content = text("corrupt-cache", count: 300_000)
    let node = try f.makeNode("cc.txt", data: content)
    let h = try f.downloads.downloadData(nodeID: node.id)
    let url = h.url
    h.close()
    let fh = try FileHandle(forUpdating: url)
    try fh.seek(toOffset: UInt64(CryptoFile.headerSize + 1000))
    fh.write(Data([0xFF, 0x00, 0xFF]))
    try fh.close()
    let bad = try f.downloads.downloadData(nodeID: node.id)
    #expect(f.gets == 1)
    #expect {
      try bad.read(offset: 0, count: 100)
    } throws: { error in
      if case DiskError.corrupt = error { return true }
      return false
    }
    bad.close()
    let good = try f.downloads.downloadData(nodeID: node.id)
    #expect(try good.readAll() == content)
    good.close()
    #expect(f.gets == 2)
  }

  @Test(arguments: StoreKind.all)
  func anUploadedStagingFileIsServedWithoutAStoreRequest(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let node = try f.catalog.write(f.userID) { tx in
      try tx.createNode(path: try TreesystemPath(["written-here.txt"]))
    }
    let content = text("written-locally", count: 250_000)
    let s = try f.disk.stagingFile(forNode: node.id)
    try s.write(content, at: 0)
    try f.disk.commitStaging(s)
    s.close()
    // What the push manager does: encode the staged CryptoFile, upload, record the eTag.
    let staged = try #require(f.disk.stagedData(forNode: node.id))
    let file = try CryptoFile.open(at: staged.url, key: staged.key)
    var object = Data()
    try CloudFileEncoder(key: node.encryptionKey).encode(data: file.cloudFileSource()) {
      object.append($0)
    }
    let eTag = try f.putObject(node, object)
    try f.disk.markUploaded(
      nodeID: node.id, version: staged.version, cloudID: node.cloudID, eTag: eTag)
    let h = try f.downloads.downloadData(nodeID: node.id)
    #expect(try h.readAll() == content)
    h.close()
    #expect(f.gets == 0)
    #expect(f.faults.counts.values.reduce(0, +) == 0)
  }

  @Test(arguments: StoreKind.all)
  func nothingPlaintextInTheCacheStagingOrIndex(_ kind: StoreKind) throws {
    let f = try DownloadFixture(kind)
    let names = ["Quarterly Secret Report.txt", "Geheimnis-Ünïcødé.md"]
    let content = text("PLAINTEXT-CONTENT-never-on-disk", count: 400_000)
    let meta = Data("PLAINTEXT-METADATA-SECTION".utf8)
    let thumb = Data("PLAINTEXT-THUMBNAIL-SECTION".utf8)
    let a = try f.makeNode(names[0], data: content, metadata: meta, thumbnail: thumb)
    let b = try f.makeNode(names[1], data: content)
    try f.downloads.downloadData(nodeID: a.id).close()
    try f.downloads.downloadRange(nodeID: b.id, range: ByteRange(100_000, 200_000)).close()
    _ = try f.downloads.metadata(nodeID: a.id)
    _ = try f.downloads.thumbnail(nodeID: a.id)
    let s = try f.disk.stagingFile(forNode: b.id)
    try s.write(content, at: 0)
    try f.disk.commitStaging(s)
    s.close()
    f.disk.flush()
    var needles = [Data("PLAINTEXT-CONTENT-never-on-disk".utf8), meta, thumb]
    for n in names {
      needles.append(Data(n.utf8))
      needles.append(Data(n.lowercased().utf8))
    }
    let hits = try findPlaintext(needles, under: f.disk.directory)
    #expect(hits.isEmpty, "\(hits)")
    // Not vacuous: the content is really there, encrypted.
    #expect(try f.downloads.downloadData(nodeID: a.id).readAll() == content)
    let files = try FileManager.default.contentsOfDirectory(atPath: f.disk.cacheDirectory.path)
    #expect(files.count == 2)
    #expect(files.allSatisfy { $0.count == 32 && $0.allSatisfy(\.isHexDigit) })
  }
}

final class Results: @unchecked Sendable {
  private let lock = NSLock()
  private var values: [Bool] = []
  func add(_ v: Bool) { lock.withLock { values.append(v) } }
  var all: [Bool] { lock.withLock { values } }
}
