import Foundation
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync

/// A delegate that serves generated content and ignores discoveries (the defaults).
final class QuietDelegate: SyncDelegate {
  func data(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> NodeData? {
    .data(Self.content(node))
  }

  static func content(_ node: Node) -> Data { Data("bench content \(node.name)".utf8) }
}

/// `zdc-bench sync`: (a) one incremental pull of 10 changes on trees of 1,000 and 100,000
/// nodes; (b) a first full pull of 10,000 and 100,000 nodes; all from a `LocalFolderStore`.
enum SyncBench {
  static let keys = try! UserKeyPair.fromSeed(Data(repeating: 9, count: 32))
  static let userID = "benchuserxxxxxxxxxxxxxxxxxxxxxxx"
  static let treeID = "com.zdc.bench"

  static func device(_ name: String, store: LocalFolderStore, work: URL) throws -> (
    Catalog, SyncEngine
  ) {
    let catalog = try Catalog.temporary()
    try catalog.createLocalUser(
      LocalUser(
        id: userID, treeID: treeID, boxPublicKey: keys.boxPublicKey,
        signPublicKey: keys.signPublicKey))
    let engine = try SyncEngine(
      catalog: catalog, store: store,
      account: SyncAccount(userID: userID, keys: keys, deviceID: name, deviceName: name),
      delegate: QuietDelegate(),
      push: PushConfiguration(
        workDirectory: work.appendingPathComponent(name), pollInterval: 0.01,
        logBatchWindow: 0.01),
      pull: PullConfiguration(pullInterval: 3600, fullScanInterval: 1e9))
    return (catalog, engine)
  }

  /// Writes a tree of `count` nodes (RCRDs; one in ten files with a small DATA) straight into
  /// the store, as another device would have pushed it: directories of up to 100 children.
  static func generate(count: Int, store: LocalFolderStore) throws {
    let homeSalt = try homeDirSalt()
    let layout = CloudLayout(userID: userID, treeID: treeID)
    let pk = [userID: keys.boxPublicKey]
    struct Dir {
      var prefix: String
      var salt: Data
      var children = 0
    }
    var dirs = [Dir(prefix: Trunk.home.dirPrefix, salt: homeSalt)]
    var next = 0
    let lock = NSLock()
    var made = 0
    // Build the plan first (sequential: names and parents), then encode and put in parallel.
    var plan: [(Node, String, String)] = []  // node, parent prefix, cloudName
    while made < count {
      if dirs[next].children >= 100 { next += 1 }
      let isDir = made % 20 == 0
      let name = isDir ? "dir-\(made)" : "file-\(made).txt"
      let node = Node(
        uuid: "", localUserID: userID, parentID: 1, name: name, kind: isDir ? .directory : .file,
        shareList: .owner(userID), encryptionKey: SecureRandom.nodeKey(),
        dirSalt: SecureRandom.dirSalt(), dirPrefix: SecureRandom.dirPrefix(),
        cloudID: SecureRandom.cloudID(), mode: isDir ? 0o755 : 0o644,
        mtime: FileTime(seconds: 1_700_000_000))
      let cloudName = try CloudName.compute(name: name, parentDirSalt: dirs[next].salt)
      plan.append((node, dirs[next].prefix, cloudName))
      dirs[next].children += 1
      if isDir { dirs.append(Dir(prefix: node.dirPrefix, salt: node.dirSalt)) }
      made += 1
    }
    let items = plan
    DispatchQueue.concurrentPerform(iterations: 4) { worker in
      for i in stride(from: worker, to: items.count, by: 4) {
        let (node, prefix, cloudName) = items[i]
        do {
          let rcrd = try Rcrd.encode(node: node, publicKeys: pk)
          _ = try store.put(
            key: layout.rcrdKey(dirPrefix: prefix, cloudName: cloudName), body: .data(rcrd),
            condition: .none)
          if node.kind == .file && i % 10 == 1 {
            var body = Data()
            try CloudFileEncoder(key: node.encryptionKey).encode(
              data: .data(Data("content \(i)".utf8))
            ) { body.append($0) }
            _ = try store.put(
              key: layout.dataKey(dirPrefix: prefix, cloudName: cloudName), body: .data(body),
              condition: .none)
          }
        } catch {
          lock.withLock { FileHandle.standardError.write(Data("generate: \(error)\n".utf8)) }
        }
      }
    }
  }

  /// The home trunk's dirSalt every device of the bench user uses.
  static func homeDirSalt() throws -> Data {
    let catalog = try Catalog.inMemory()
    try catalog.createLocalUser(
      LocalUser(
        id: userID, treeID: treeID, boxPublicKey: keys.boxPublicKey,
        signPublicKey: keys.signPublicKey))
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
      "zdc-bench-salt-\(UUID().uuidString)")
    defer { try? FileManager.default.removeItem(at: dir) }
    let store = try LocalFolderStore(root: dir)
    _ = try PullManager(
      catalog: catalog, store: store,
      account: SyncAccount(userID: userID, keys: keys, deviceID: "salt", deviceName: "salt"),
      delegate: QuietDelegate())
    return try catalog.read(userID) { try $0.trunkNode(.home)!.dirSalt }
  }

  static func time(_ body: () throws -> Void) rethrows -> Double {
    let t = Date()
    try body()
    return Date().timeIntervalSince(t)
  }

  /// Where the benches' stores go: memory when there is /dev/shm.
  static let scratch =
    FileManager.default.fileExists(atPath: "/dev/shm")
    ? URL(fileURLWithPath: "/dev/shm") : FileManager.default.temporaryDirectory

  /// `zdc-bench push`: one device uploads `count` new small files (in directories of 100) to a
  /// `LocalFolderStore`, from the catalog's queue to an empty queue; with `again`, then an
  /// attribute change of each (its RCRD uploaded again).
  static func push(count: Int, again: Bool = true) throws {
    let root = scratch.appendingPathComponent("zdc-bench-push-\(getpid())")
    defer { try? FileManager.default.removeItem(at: root) }
    let store = try LocalFolderStore(root: root)
    let (catalog, writer) = try device(
      "writer", store: store, work: root.appendingPathComponent(".work"))
    try catalog.write(userID) { tx in
      var dir = try TreesystemPath([])
      for i in 0..<count {
        if i % 100 == 0 {
          dir = try TreesystemPath(["dir-\(i / 100)"])
          _ = try tx.createNode(path: dir, kind: .directory)
        }
        var node = try tx.createNode(path: try dir.appending("file-\(i).txt"))
        node.dataSize = UInt64(QuietDelegate.content(node).count)
        node = try tx.updateNode(node)
        try tx.queueDataUpload(nodeID: node.id)
      }
    }
    let seconds = try time {
      try writer.start()
      guard writer.push.waitUntilIdle(timeout: 3600) else { throw SyncError.stopped }
    }
    let objects = try store.listAll(prefix: "\(userID)/").count
    print(
      String(
        format: "zdc-bench push: %d files (%d objects) in %.2f s: %.0f files/s, %.0f us per file",
        count, objects, seconds, Double(count) / seconds, seconds * 1e6 / Double(count)))
    guard again else { return writer.stop() }
    // Then an attribute change of every file: each node's RCRD goes up again.
    try catalog.write(userID) { tx in
      for dir in try tx.children(of: try tx.trunkNode(.home)!.id) {
        for var n in try tx.children(of: dir.id) {
          n.mode = 0o600
          try tx.updateNode(n)
          try tx.queueRcrdUpload(nodeID: n.id)
        }
      }
    }
    let changed = try time {
      guard writer.push.waitUntilIdle(timeout: 3600) else { throw SyncError.stopped }
    }
    writer.stop()
    print(
      String(
        format: "zdc-bench push: the attribute change of each: %.2f s, %.0f us per file",
        changed, changed * 1e6 / Double(count)))
  }

  static func run(sizes: [Int]) throws {
    let base = scratch
    print("zdc-bench sync (store under \(base.path); catalogs in \(NSTemporaryDirectory()))")
    var incremental: [Int: Double] = [:]
    for n in sizes {
      let root = base.appendingPathComponent("zdc-bench-sync-\(getpid())-\(n)")
      defer { try? FileManager.default.removeItem(at: root) }
      let store = try LocalFolderStore(root: root)
      let gen = try time { try generate(count: n, store: store) }
      print(String(format: "  tree of %7d nodes: generated in %.1f s", n, gen))
      let work = root.appendingPathComponent(".work")
      let (_, reader) = try device("reader", store: store, work: work)
      var result = PullResult()
      let full = try time { result = try reader.pull.pull() }
      print(
        String(
          format: "  first full pull of %7d nodes: %.2f s (%d new, %.0f nodes/s)", n, full,
          result.newNodes, Double(result.newNodes) / full))
      let (wcat, writer) = try device("writer", store: store, work: work)
      try writer.start()
      var samples: [Double] = []
      for round in 0..<3 {
        try wcat.write(userID) { tx in
          for i in 0..<10 {
            let node = try tx.createNode(path: TreesystemPath(["change-\(round)-\(i).txt"]))
            try tx.queueDataUpload(nodeID: node.id)
          }
        }
        guard writer.push.waitUntilIdle(timeout: 60) else { throw SyncError.stopped }
        var r = PullResult()
        samples.append(try time { r = try reader.pull.pull() })
        guard !r.fullScan, r.newNodes == 10 else {
          throw SyncError.badRemoteObject(key: "bench", reason: "unexpected pull \(r)")
        }
      }
      writer.stop()
      let median = samples.sorted()[1]
      incremental[n] = median
      print(
        String(
          format: "  incremental pull of 10 changes on %7d nodes: %.1f ms (median of 3)", n,
          median * 1000))
    }
    if let small = incremental[sizes.min()!], let big = incremental[sizes.max()!], sizes.count > 1 {
      print(
        String(
          format: "  incremental ratio %d vs %d nodes: %.2f", sizes.max()!, sizes.min()!,
          big / small))
    }
  }
}
