import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

@Suite(.serialized, .motoServer) struct ScaleAndStoreTests {
  /// 10,000 nodes on the local folder; 1,000 on moto (a Python server, 10× slower per request).
  @Test(arguments: StoreKind.all)
  func tenThousandNodesSync(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-scale")
    let store = backing.store
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.maxConcurrentOperations = 8
    }
    let b = try Device("beta", user: user, store: store)
    let dirs = kind.isS3 ? 10 : 100
    let filesPerDir = 99
    try a.catalog.write(user.userID) { tx in
      for d in 0..<dirs {
        let dp = try TreesystemPath(["dir-\(d)"])
        let dn = try tx.createNode(path: dp, kind: .directory)
        for f in 0..<filesPerDir {
          let content = Data("content of \(d)/\(f)".utf8)
          var node = Node(
            uuid: "", localUserID: user.userID, parentID: dn.id, name: "file-\(d)-\(f).txt",
            kind: .file, shareList: .owner(user.userID), encryptionKey: Data(), dirSalt: Data(),
            dirPrefix: "", cloudID: "", mode: 0o644, mtime: FileTime(seconds: 1_700_000_000),
            dataSize: UInt64(content.count))
          node = try tx.createNode(node)
          a.delegate.setContent(content, for: node)
          try tx.queueDataUpload(nodeID: node.id)
        }
      }
    }
    let t0 = Date()
    try a.start()
    try a.sync(170)
    let pushTime = Date().timeIntervalSince(t0)
    #expect(try a.operationCount() == 0)
    let t1 = Date()
    let result = try b.engine.pull.pull()
    let pullTime = Date().timeIntervalSince(t1)
    #expect(result.fullScan)
    #expect(result.newNodes == dirs * (filesPerDir + 1))
    print("\(dirs * 100) nodes on \(kind.name): push \(pushTime) s, first pull \(pullTime) s")
    let ta = try a.tree(withContent: false)
    let tb = try b.tree(withContent: false)
    #expect(ta.count == dirs * 100)
    #expect(ta == tb)
    // Bytes: every file's cloud content, read through B's catalog (B's keys), matches A's.
    var mismatches = 0
    for d in stride(from: 0, to: dirs, by: 1) {
      for f in stride(from: 0, to: filesPerDir, by: 7) {
        let p = "dir-\(d)/file-\(d)-\(f).txt"
        if try b.cloudContent(p) != Data("content of \(d)/\(f)".utf8) { mismatches += 1 }
      }
    }
    #expect(mismatches == 0)
    // An incremental pull afterwards touches only what changed.
    try a.write("dir-5/file-5-5.txt", "changed")
    try a.sync()
    let r2 = try b.engine.pull.pull()
    #expect(!r2.fullScan)
    #expect(r2.fetchedRcrds <= 2)
    #expect(try b.cloudContent("dir-5/file-5-5.txt") == Data("changed".utf8))
    a.engine.stop()
  }

  @Test(arguments: StoreKind.all)
  func multipartUploadResumesWithoutResendingParts(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-mp")
    let inner = backing.store
    // S3 takes parts of 5 MiB at least (but for the last).
    let partSize = max(UInt64(256 << 10), kind.minimumPartSize)
    let size = kind.isS3 ? 12_000_000 : 1_500_000
    let store = FaultInjectingStore(inner, seed: 1)
    // The complete fails once after the store acted... no: before it acts, so parts stay.
    store.inject([.transientBefore], into: [.completeMultipart], rate: 1)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.multipartThreshold = 1 << 20
      push.partSize = partSize
    }
    var content = Data(count: size)
    var rng = SplitMix64(seed: 3)
    content.withUnsafeMutableBytes { b in
      for i in 0..<b.count { b[i] = UInt8(truncatingIfNeeded: rng.next()) }
    }
    try a.catalog.write(user.userID) { tx in
      let n = try tx.createNode(path: TreesystemPath(["big.bin"]))
      a.delegate.setContent(content, for: n)
      try tx.queueDataUpload(nodeID: n.id)
    }
    try a.start()
    // Let the parts go up and the completion fail a few times, then heal.
    let deadline = Date().addingTimeInterval(20)
    while store.counts[.completeMultipart, default: 0] < 3 && Date() < deadline {
      Thread.sleep(forTimeInterval: 0.01)
    }
    store.heal()
    try a.sync()
    let parts = (size + 64 + (1 << 16)) / Int(partSize) + 1
    #expect(store.counts[.uploadPart, default: 0] <= parts)
    #expect(store.counts[.createMultipart, default: 0] == 1)
    #expect(try a.cloudContent("big.bin") == content)
    let b = try Device("beta", user: user, store: inner)
    try b.engine.pull.pull()
    #expect(try b.cloudContent("big.bin") == content)
    a.engine.stop()
  }

  @Test(arguments: StoreKind.all)
  func realTenMiBFileUsesMultipart(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-mp10")
    let inner = backing.store
    let store = FaultInjectingStore(inner, seed: 2)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store)
    let content = Data(repeating: 0x5A, count: 11 << 20)
    try a.catalog.write(user.userID) { tx in
      let n = try tx.createNode(path: TreesystemPath(["movie.bin"]))
      a.delegate.setContent(content, for: n)
      try tx.queueDataUpload(nodeID: n.id)
    }
    try a.start()
    try a.sync()
    #expect(store.counts[.uploadPart, default: 0] == 2)
    #expect(try a.cloudContent("movie.bin") == content)
    // Nothing left in the work directory (ciphertext temp files are removed).
    #expect(try FileManager.default.contentsOfDirectory(atPath: a.work.url.path).isEmpty)
    a.engine.stop()
  }

  @Test(
    arguments: [(.local, 42), (.local, 7), (.local, 1234), (.s3, 42), (.s3, 7)]
      as [(StoreKind, UInt64)])
  func faultyStoreDrainsWithoutLossOrDuplicates(_ kind: StoreKind, seed: UInt64) throws {
    let backing = try kind.make("zdc-sync-faults")
    let inner = backing.store
    let faulty = FaultInjectingStore(inner, seed: seed)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: faulty)
    let b = try Device("beta", user: user, store: faulty)
    try a.start()
    try b.start()
    try a.create("base", kind: .directory)
    for i in 0..<10 { try a.create("base/f\(i).txt", "initial \(i)") }
    try a.sync()
    try b.sync()
    faulty.inject(
      [.transientBefore, .transientAfter, .preconditionFailed, .delay(0.005)],
      into: [.put, .delete, .copy, .head, .get], rate: 0.3)
    faulty.inject([.partialList, .transientBefore], into: [.list], rate: 0.3)
    // Changes on both devices while the store misbehaves.
    for i in 0..<10 { try a.write("base/f\(i).txt", "alpha \(i)") }
    try a.create("base/new-a.txt", "new from alpha")
    try a.move("base/f9.txt", to: "moved.txt")
    try a.delete("base/f8.txt")
    try b.create("from-b", kind: .directory)
    try b.create("from-b/x.txt", "x from beta")
    // Pulls under faults fail or apply correctly; none may lose anything.
    for _ in 0..<6 {
      _ = try? a.engine.pull.pull()
      _ = try? b.engine.pull.pull(fullScan: true)
      Thread.sleep(forTimeInterval: 0.2)
    }
    #expect(faulty.injectedCount > 0)
    faulty.heal()
    for _ in 0..<2 {
      try a.sync()
      try b.sync()
    }
    let ta = try a.tree()
    #expect(ta == (try b.tree()))
    #expect(ta["/base/f0.txt"] == "file:alpha 0")
    #expect(ta["/base/f8.txt"] == nil)
    #expect(ta["/moved.txt"] == "file:initial 9" || ta["/moved.txt"] == "file:alpha 9")
    #expect(ta["/from-b/x.txt"] == "file:x from beta")
    #expect(ta["/base/new-a.txt"] == "file:new from alpha")
    let conflicted = ta.keys.filter { $0.contains("conflicted copy") || $0.contains(" 2") }
    #expect(conflicted.isEmpty, "unexpected conflict copies \(conflicted.sorted()); tree \(ta)")
    // Exactly one RCRD per node: no duplicates or orphans.
    let rcrds = try inner.listAll(prefix: "\(user.userID)/").filter { $0.key.hasSuffix(".rcrd") }
    #expect(rcrds.count == ta.count)
    a.engine.stop()
    b.engine.stop()
  }

  @Test(arguments: StoreKind.all)
  func malformedObjectsAreSkipped(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-malformed")
    let store = backing.store
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store)
    try a.start()
    try a.create("good.txt", "good")
    try a.sync()
    let layout = CloudLayout(userID: user.userID, treeID: user.treeID)
    // Garbage RCRDs beside the good one, a tampered copy of the good one, and a bad log entry.
    let home = Trunk.home.dirPrefix
    _ = try store.put(
      key: layout.rcrdKey(dirPrefix: home, cloudName: "garbage"), body: .data(Data("{".utf8)),
      condition: .none)
    let goodKey = try store.listAll(prefix: layout.childrenPrefix(dirPrefix: home)).first {
      $0.key.hasSuffix(".rcrd")
    }!.key
    var tampered = try store.get(key: goodKey)
    tampered[tampered.count / 2] ^= 1
    _ = try store.put(
      key: layout.rcrdKey(dirPrefix: home, cloudName: "tampered"), body: .data(tampered),
      condition: .none)
    _ = try store.put(
      key: layout.changeKey(ulid: ULID().string, deviceID: "evil"), body: .data(Data("x".utf8)),
      condition: .none)
    let b = try Device("beta", user: user, store: store)
    let r = try b.engine.pull.pull()
    #expect(r.skipped >= 1)
    #expect(try b.tree() == ["/good.txt": "file:good"])
    // Incremental pulls skip the bad log entry too.
    try a.create("second.txt", "second")
    try a.sync()
    let r2 = try b.engine.pull.pull()
    #expect(!r2.fullScan)
    #expect(try b.tree() == ["/good.txt": "file:good", "/second.txt": "file:second"])
    a.engine.stop()
  }

  @Test(arguments: StoreKind.all)
  func compactionForcesFullScanForStaleCursors(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-compact")
    let store = backing.store
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { _, pull in pull.compactionAge = 0.3 }
    let b = try Device("beta", user: user, store: store)
    try a.start()
    try a.create("one.txt", "1")
    try a.sync()
    _ = try b.engine.pull.pull()  // B's cursor is now at A's first entry
    try a.create("two.txt", "2")
    try a.sync()
    // Both entries compact once older than the compaction age (on a loaded machine the
    // second may be written late: pull again until both went, within a generous deadline).
    var compacted = 0
    let deadline = Date().addingTimeInterval(60)
    repeat {
      Thread.sleep(forTimeInterval: 0.5)
      compacted += try a.engine.pull.pull().compacted
    } while compacted < 2 && Date() < deadline
    #expect(compacted >= 2)
    let layout = CloudLayout(userID: user.userID, treeID: user.treeID)
    #expect(try store.listAll(prefix: layout.changesPrefix).isEmpty)
    #expect(try store.get(key: ChangeLogCodec.compactedMarkerKey(layout)).count == 26)
    let rb = try b.engine.pull.pull()
    #expect(rb.fullScan)
    #expect(try b.tree() == ["/one.txt": "file:1", "/two.txt": "file:2"])
    a.engine.stop()
  }

  @Test func changeLogFormatRoundTripsAndRejectsTampering() throws {
    let key = SecureRandom.bytes(32)
    let entries = [
      ChangeLogEntry(
        cloudID: "abc", kind: .put, rcrd: "u/t/p/n.rcrd", data: "u/t/p/n.data", eTagRcrd: "e1"),
      ChangeLogEntry(
        cloudID: "def", kind: .move, rcrd: "u/t/q/m.rcrd", data: "u/t/q/m.data",
        fromRcrd: "u/t/p/m.rcrd"),
    ]
    let name = "\(ULID().string)-dev1"
    let blob = try ChangeLogCodec.encode(entries, deviceID: "dev1", name: name, key: key)
    #expect(try ChangeLogCodec.decode(blob, name: name, key: key) == entries)
    #expect(throws: (any Error).self) {
      try ChangeLogCodec.decode(blob, name: "\(ULID().string)-dev2", key: key)
    }
    var bad = blob
    bad[bad.count - 1] ^= 0x80
    #expect(throws: (any Error).self) { try ChangeLogCodec.decode(bad, name: name, key: key) }
    #expect(blob.range(of: Data("u/t/p".utf8)) == nil)
  }
}

/// A delegate serving one node's content from a CryptoFile and another's through a promise.
final class SourcesDelegate: SyncDelegate, @unchecked Sendable {
  // Safe: `sources` is only touched under `lock`.
  private let lock = NSLock()
  private var sources: [String: NodeData] = [:]
  func set(_ d: NodeData, for name: String) { lock.withLock { sources[name] = d } }
  func data(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> NodeData? {
    lock.withLock { sources[node.name] }
  }
  func metadata(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  { .data(Data("meta of \(node.name)".utf8)) }
}

@Suite(.serialized, .motoServer) struct DataSourceTests {
  @Test(arguments: StoreKind.all)
  func cryptoFilePromiseAndCleartextFileSources(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-sources")
    let store = backing.store
    let user = try TestUser()
    let work = try TemporaryDirectory("zdc-sources-work")
    let catalog = try Catalog.temporary(options: .init(durability: .normal))
    try catalog.createLocalUser(
      LocalUser(
        id: user.userID, treeID: user.treeID, boxPublicKey: user.keys.boxPublicKey,
        signPublicKey: user.keys.signPublicKey))
    let delegate = SourcesDelegate()
    let cacheKey = SecureRandom.bytes(32)
    let cryptoURL = work.path("staged.cf")
    let staged = try CryptoFile.create(at: cryptoURL, key: cacheKey)
    try staged.write(Data("staged secret bytes".utf8), at: 0)
    try staged.close()
    delegate.set(.cryptoFile(cryptoURL, key: cacheKey), for: "a.txt")
    let promise = NodeDataPromise()
    delegate.set(.promise(promise), for: "b.txt")
    let plain = work.path("plain.txt")
    try Data("cleartext file bytes".utf8).write(to: plain)
    delegate.set(.cleartextFile(plain), for: "c.txt")
    let engine = try SyncEngine(
      catalog: catalog, store: store,
      account: SyncAccount(userID: user.userID, keys: user.keys, deviceID: "src", deviceName: "s"),
      delegate: delegate,
      push: PushConfiguration(
        workDirectory: work.path("push"), retryBase: 0.02, retryCap: 0.1, pollInterval: 0.02))
    try catalog.write(user.userID) { tx in
      for name in ["a.txt", "b.txt", "c.txt"] {
        let n = try tx.createNode(path: TreesystemPath([name]))
        try tx.queueDataUpload(nodeID: n.id)
      }
    }
    try engine.start()
    DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) {
      promise.fulfill(.data(Data("promised bytes".utf8)))
    }
    #expect(engine.push.waitUntilIdle(timeout: 30))
    engine.stop()
    let b = try Device("beta", user: user, store: store)
    try b.engine.pull.pull()
    #expect(try b.cloudContent("a.txt") == Data("staged secret bytes".utf8))
    #expect(try b.cloudContent("b.txt") == Data("promised bytes".utf8))
    #expect(try b.cloudContent("c.txt") == Data("cleartext file bytes".utf8))
    #expect(try backing.plaintext([Data("secret bytes".utf8), Data("a.txt".utf8)]).isEmpty)
  }

  @Test(arguments: StoreKind.all)
  func newerDataDuringMultipartUploadWins(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-newer")
    let inner = backing.store
    // S3 takes parts of 5 MiB at least (but for the last).
    let partSize: UInt64 = kind.isS3 ? 5 << 20 : 64 << 10
    let (firstSize, secondSize) = kind.isS3 ? (16 << 20, 12 << 20) : (1 << 20, 900 << 10)
    let store = FaultInjectingStore(inner, seed: 5)
    store.inject([.delay(0.03)], into: [.uploadPart], rate: 1)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.multipartThreshold = 4 * partSize
      push.partSize = partSize
    }
    let first = Data(repeating: 1, count: firstSize)
    let second = Data(repeating: 2, count: secondSize)
    try a.catalog.write(user.userID) { tx in
      let n = try tx.createNode(path: TreesystemPath(["v.bin"]))
      a.delegate.setContent(first, for: n)
      try tx.queueDataUpload(nodeID: n.id)
    }
    try a.start()
    let deadline = Date().addingTimeInterval(10)
    while store.counts[.uploadPart, default: 0] < 2 && Date() < deadline {
      Thread.sleep(forTimeInterval: 0.005)
    }
    try a.write("v.bin", second)
    try a.sync()
    store.heal()
    #expect(try a.cloudContent("v.bin") == second)
    #expect(a.delegate.events.filter { $0 == "pushed /home/v.bin" }.count >= 1)
    let b = try Device("beta", user: user, store: inner)
    try b.engine.pull.pull()
    #expect(try b.cloudContent("v.bin") == second)
    a.engine.stop()
  }

  @Test func partsGrowToKeepAnUploadWithinThePartLimit() {
    let mib: UInt64 = 1 << 20
    let config = PushConfiguration(workDirectory: URL(fileURLWithPath: "/tmp"))
    #expect(config.partSize == 8 * mib && config.maxPartCount == 10_000)
    #expect(config.partSize(forObjectOf: 40 * mib) == 8 * mib)
    #expect(config.partSize(forObjectOf: 10_000 * 8 * mib) == 8 * mib)
    #expect(config.partSize(forObjectOf: 10_000 * 8 * mib + 1) == 16 * mib)
    // 100 GiB: 6,400 parts of 16 MiB rather than 12,800 of 8 MiB; 5 TiB (S3's largest
    // object): 10,000 parts of 528 MiB at most.
    #expect(config.partSize(forObjectOf: 100 << 30) == 16 * mib)
    let big: UInt64 = 5 << 40
    let part = config.partSize(forObjectOf: big)
    #expect(part == 528 * mib && (big + part - 1) / part <= 10_000)
    #expect(config.partSize(forObjectOf: 0) == 8 * mib)
  }

  /// An object that would need more parts than the store takes is uploaded in fewer, larger
  /// parts (S3: 10,000 parts at most), and arrives whole.
  @Test(arguments: StoreKind.all)
  func aLargeObjectIsUploadedInLargerParts(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-parts")
    // S3 takes parts of 5 MiB at least (but for the last).
    let partSize: UInt64 = kind.isS3 ? 5 << 20 : 64 << 10
    let size = kind.isS3 ? 16 << 20 : 1 << 20
    let store = FaultInjectingStore(backing.store, seed: 7)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.multipartThreshold = 2 * partSize
      push.partSize = partSize
      push.maxPartCount = 3
    }
    var content = Data(count: size)
    for i in stride(from: 0, to: size, by: 4096) { content[i] = UInt8(truncatingIfNeeded: i >> 12) }
    try a.catalog.write(user.userID) { tx in
      let n = try tx.createNode(path: TreesystemPath(["big.bin"]))
      a.delegate.setContent(content, for: n)
      try tx.queueDataUpload(nodeID: n.id)
    }
    try a.start()
    try a.sync()
    // 16 MiB in 3 parts of at most 10 MiB: 2; 1 MiB in 3 parts of a multiple of 64 KiB: 3.
    #expect(store.counts[.uploadPart, default: 0] == (kind.isS3 ? 2 : 3))
    let b = try Device("beta", user: user, store: backing.store)
    try b.engine.pull.pull()
    #expect(try b.cloudContent("big.bin") == content)
    a.engine.stop()
  }

  /// A store that takes everything but change-log objects leaves the push side busy, and its
  /// failures show in `failures` (an unmount's drain gives up on a store making no progress
  /// by it: once, with only the change log left, the process waited the whole hour).
  @Test func failedChangeLogWritesCountAsFailures() throws {
    let backing = try StoreKind.local.make("zdc-sync-logfail")
    let store = FaultInjectingStore(backing.store, seed: 11)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.retryBase = 0.05
      push.retryCap = 0.2
    }
    try a.start()
    defer { a.engine.stop() }
    store.inject([.transientBefore], into: [.put], rate: 1, keysContaining: "/changes/")
    try a.catalog.write(user.userID) { tx in
      _ = try tx.createNode(path: TreesystemPath(["d"]), kind: .directory)
    }
    let deadline = Date().addingTimeInterval(10)
    while a.engine.push.failures < 3 && Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
    #expect(a.engine.push.failures >= 3)
    #expect(!a.engine.push.waitUntilIdle(timeout: 0.2))
    store.heal()
    #expect(a.engine.push.waitUntilIdle(timeout: 10))
  }

  @Test(arguments: StoreKind.all)
  func completionsShareChangeLogObjects(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-batch")
    let store = backing.store
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: store) { push, _ in
      push.logBatchWindow = 1.0
    }
    try a.catalog.write(user.userID) { tx in
      for i in 0..<40 { try tx.createNode(path: TreesystemPath(["n\(i)"]), kind: .directory) }
    }
    try a.start()
    try a.sync()
    let layout = CloudLayout(userID: user.userID, treeID: user.treeID)
    let logs = try store.listAll(prefix: layout.changesPrefix)
    // 40 completions share a few objects (a loaded machine spreads them over more windows).
    #expect(logs.count >= 1 && logs.count <= 10)
    a.engine.stop()
  }
}
