import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCS3Store
import ZDCSync
import ZDCTestSupport

/// A delegate that serves node content from memory and records what it is told.
final class TestDelegate: SyncDelegate, @unchecked Sendable {
  // Safe: every stored property is only touched under `lock`.
  private let lock = NSLock()
  private var contents: [String: Data] = [:]  // by node uuid
  private var _events: [String] = []
  private var _conflicts: [(ConflictKind, String, String?)] = []

  func setContent(_ data: Data?, for node: Node) { lock.withLock { contents[node.uuid] = data } }
  func content(for node: Node) -> Data? { lock.withLock { contents[node.uuid] } }
  var events: [String] { lock.withLock { _events } }
  var conflicts: [(ConflictKind, String, String?)] { lock.withLock { _conflicts } }
  func clearEvents() { lock.withLock { _events.removeAll() } }
  private func record(_ s: String) { lock.withLock { _events.append(s) } }

  func data(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> NodeData? {
    lock.withLock { contents[node.uuid].map { .data($0) } }
  }
  func didPushNodeData(_ node: Node, at path: TreesystemPath, transaction: CloudTransaction) {
    record("pushed \(path)")
  }
  func didDiscoverNewNode(_ node: Node, at path: TreesystemPath, transaction: CloudTransaction) {
    record("new \(path)")
  }
  func didDiscoverModifiedNode(
    _ node: Node, change: NodeChange, at path: TreesystemPath, transaction: CloudTransaction
  ) {
    if change.contains(.data) { lock.withLock { contents[node.uuid] = nil } }
    record("modified \(path) \(change.rawValue)")
  }
  func didRenameNode(_ node: Node, oldName: String, transaction: CloudTransaction) {
    record("renamed \(oldName) -> \(node.name)")
  }
  func didDiscoverMovedNode(
    _ node: Node, from oldPath: TreesystemPath, to newPath: TreesystemPath,
    transaction: CloudTransaction
  ) {
    record("moved \(oldPath) -> \(newPath)")
  }
  func didDiscoverDeletedNode(
    _ node: Node, at path: TreesystemPath, timestamp: Date?, transaction: CloudTransaction
  ) {
    lock.withLock { contents[node.uuid] = nil }
    record("deleted \(path)")
  }
  func didDiscoverDeletedDirtyNode(
    _ node: Node, dirtyDescendants: [NodeID], timestamp: Date?, transaction: CloudTransaction
  ) {
    record("deletedDirty \(node.name)")
  }
  func didDiscoverConflict(
    _ kind: ConflictKind, node: Node, other: Node?, at path: TreesystemPath,
    transaction: CloudTransaction
  ) {
    lock.withLock {
      if kind == .data, let other {
        // The local version moves to the conflicted copy.
        contents[other.uuid] = contents[node.uuid]
        contents[node.uuid] = nil
      }
      _conflicts.append((kind, node.name, other?.name))
    }
    record("conflict \(kind.rawValue) \(path)")
  }
}

/// A store folder for sync tests: in /dev/shm when available (fsync is free there).
///
/// Never through the environment: `setenv` while other tests run would change the process's
/// environment under threads reading it (libcurl reads the proxy variables on every request),
/// which then read a freed array.
func makeStoreDirectory(_ label: String) throws -> TemporaryDirectory {
  if FileManager.default.fileExists(atPath: "/dev/shm"),
    ProcessInfo.processInfo.environment["ZDC_TEST_TMPDIR"] == nil
  {
    return try TemporaryDirectory(label, under: "/dev/shm")
  }
  return try TemporaryDirectory(label)
}

/// A kind of store the device tests run against: the same test, once per kind.
struct StoreKind: Sendable, CustomTestStringConvertible {
  let name: String
  let isS3: Bool
  var testDescription: String { name }

  /// A folder of this machine (in /dev/shm when available).
  static let local = StoreKind(name: "local folder", isS3: false)
  /// A new bucket on the suite's moto_server (`.motoServer` trait).
  static let s3 = StoreKind(name: "S3 (moto)", isS3: true)
  static let all = [local, s3]

  /// The smallest multipart part size the store accepts (S3: 5 MiB but for the last part).
  var minimumPartSize: UInt64 { isS3 ? 5 << 20 : 1 }

  /// A fresh, empty store.
  func make(_ label: String) throws -> TestStore {
    if isS3 {
      let server = try MotoServer.require()
      let s3 = try server.makeStore(transport: fastRetries())
      return TestStore(store: s3, dir: nil, s3: s3, server: server)
    }
    let dir = try makeStoreDirectory(label)
    return TestStore(store: try LocalFolderStore(root: dir.url), dir: dir, s3: nil, server: nil)
  }
}

/// A fresh store for one test, and what it takes to look inside it.
final class TestStore: @unchecked Sendable {
  // @unchecked: immutable after init; the stores are thread-safe.
  let store: any CloudStore
  /// The local folder (local stores).
  let dir: TemporaryDirectory?
  /// The S3 store on its own bucket (S3 stores).
  let s3: S3Store?
  let server: MotoServer?

  init(store: any CloudStore, dir: TemporaryDirectory?, s3: S3Store?, server: MotoServer?) {
    self.store = store
    self.dir = dir
    self.s3 = s3
    self.server = server
  }

  /// The bucket (S3 stores).
  var bucket: String? { s3?.configuration.bucket }

  /// Where the needles occur in the store: every object listed and fetched, as anyone holding
  /// the store could; for a local folder, every file under it too (unfinished uploads).
  func plaintext(_ needles: [Data]) throws -> [String] {
    var hits = try findPlaintext(needles, in: store)
    if let dir { hits += try findPlaintext(needles, under: dir.url) }
    return hits
  }
}

/// One user's identity shared by the test devices.
struct TestUser: Sendable {
  let userID: String
  let keys: UserKeyPair
  let treeID = "com.zdc.test"

  init(seed: UInt8 = 7) throws {
    keys = try UserKeyPair.fromSeed(Data(repeating: seed, count: 32))
    userID = "user\(seed)xxxxxxxxxxxxxxxxxxxxxxxxxxx"
  }
}

/// A headless device: its own catalog, delegate and sync engine on a shared store.
final class Device: @unchecked Sendable {
  // Safe: every property is immutable after init; the types are thread-safe.
  let name: String
  let user: TestUser
  let catalog: Catalog
  let delegate = TestDelegate()
  let engine: SyncEngine
  let store: any CloudStore
  let work: TemporaryDirectory

  init(
    _ name: String, user: TestUser, store: any CloudStore,
    configure: (inout PushConfiguration, inout PullConfiguration) -> Void = { _, _ in }
  ) throws {
    self.name = name
    self.user = user
    self.store = store
    work = try TemporaryDirectory("zdc-dev-\(name)")
    // Sealed fields, as the mount's catalog has.
    catalog = try Catalog.temporary(
      options: .init(durability: .normal, fieldKey: SecureRandom.bytes(32)))
    try catalog.createLocalUser(
      LocalUser(
        id: user.userID, treeID: user.treeID, boxPublicKey: user.keys.boxPublicKey,
        signPublicKey: user.keys.signPublicKey))
    var push = PushConfiguration(
      workDirectory: work.url, retryBase: 0.02, retryCap: 0.2, pollInterval: 0.02,
      logBatchWindow: 0.02)
    var pull = PullConfiguration(pullInterval: 3600)
    configure(&push, &pull)
    engine = try SyncEngine(
      catalog: catalog, store: store,
      account: SyncAccount(
        userID: user.userID, keys: user.keys, deviceID: name, deviceName: name),
      delegate: delegate, push: push, pull: pull)
  }

  deinit { engine.stop() }

  func start() throws { try engine.start() }

  func sync(_ timeout: TimeInterval = 60) throws {
    let ok = try engine.syncNow(timeout: timeout)
    if !ok {
      let ops = try catalog.read(user.userID) { tx in
        try tx.allOperations().map {
          "op \($0.id) \($0.kind.rawValue) \($0.state.rawValue) node \($0.nodeID ?? -1) "
            + "attempts \($0.attempts) deps \(try tx.dependencies(ofOperation: $0.id))"
        }
      }
      let logs = try catalog.read(user.userID) { try $0.pendingChangeCount() }
      print("sync of \(name) timed out; pending log entries \(logs)")
      for o in ops { print("  \(o)") }
    }
    if !ok { throw SyncTimeout(device: name) }
  }

  func path(_ s: String) throws -> TreesystemPath {
    try TreesystemPath(s.split(separator: "/").map(String.init))
  }

  @discardableResult
  func create(_ p: String, _ content: String? = nil, kind: NodeKind = .file) throws -> Node {
    let path = try path(p)
    return try catalog.write(user.userID) { tx in
      var n = try tx.createNode(path: path, kind: kind)
      if let content {
        delegate.setContent(Data(content.utf8), for: n)
        n.dataSize = UInt64(content.utf8.count)
        n = try tx.updateNode(n)
        try tx.queueDataUpload(nodeID: n.id)
      }
      return n
    }
  }

  func write(_ p: String, _ content: Data) throws {
    let path = try path(p)
    try catalog.write(user.userID) { tx in
      guard let n = try tx.node(path: path) else { throw CatalogError.pathNotFound(path) }
      delegate.setContent(content, for: n)
      var u = n
      u.dataSize = UInt64(content.count)
      try tx.updateNode(u)
      try tx.queueDataUpload(nodeID: n.id)
    }
  }

  func write(_ p: String, _ content: String) throws { try write(p, Data(content.utf8)) }

  func move(_ p: String, to q: String) throws {
    let from = try path(p)
    let to = try path(q)
    try catalog.write(user.userID) { tx in
      guard let n = try tx.node(path: from), let parent = try tx.node(path: to.parent!) else {
        throw CatalogError.pathNotFound(from)
      }
      try tx.moveNode(n.id, toParent: parent.id, name: to.name!)
    }
  }

  func delete(_ p: String) throws {
    let path = try path(p)
    try catalog.write(user.userID) { tx in
      guard let n = try tx.node(path: path) else { throw CatalogError.pathNotFound(path) }
      try tx.deleteNode(n.id)
    }
  }

  func node(_ p: String) throws -> Node? {
    let path = try path(p)
    return try catalog.read(user.userID) { try $0.node(path: path) }
  }

  /// The content of a node as stored in the cloud (decrypted), or nil without DATA.
  func cloudContent(_ p: String) throws -> Data? {
    guard let n = try node(p) else { return nil }
    return try cloudContent(n)
  }

  func cloudContent(_ n: Node) throws -> Data? {
    guard
      let loc = try catalog.read(user.userID, { try $0.objectLocation(of: n.id) })
    else { return nil }
    let info: ObjectInfo
    do { info = try store.head(key: loc.dataKey) } catch StoreError.notFound { return nil }
    let store = self.store
    let key = loc.dataKey
    let reader = try CloudFileReader(
      key: n.encryptionKey, ciphertextSize: info.size,
      fetch: { try store.get(key: key, range: $0) })
    return try reader.read(.data)
  }

  /// The home tree: path → (kind, cloud content) for every node.
  func tree(withContent: Bool = true) throws -> [String: String] {
    let nodes = try catalog.read(user.userID) { tx -> [(String, Node)] in
      guard let home = try tx.trunkNode(.home) else { return [] }
      var out: [(String, Node)] = []
      var queue = [(home.id, "")]
      while !queue.isEmpty {
        let (id, prefix) = queue.removeFirst()
        for c in try tx.children(of: id) {
          let p = prefix + "/" + c.name
          out.append((p, c))
          queue.append((c.id, p))
        }
      }
      return out
    }
    var result: [String: String] = [:]
    for (p, n) in nodes {
      var value = n.kind == .directory ? "dir" : n.kind.rawValue
      if withContent, n.kind != .directory {
        do {
          value += ":" + (try cloudContent(n).map { String(decoding: $0, as: UTF8.self) } ?? "-")
        } catch is CryptoError {
          // Not this node's DATA: shown (never expected) rather than thrown, to be explained.
          value += ":undecryptable cid=\(n.cloudID.prefix(6))"
        }
      }
      result[p] = value
    }
    return result
  }

  func operationCount() throws -> Int {
    try catalog.read(user.userID) { try $0.operationCount() }
  }
}

/// Two started devices, alpha and beta, of one new test user on `store`.
func startedPair(on store: any CloudStore) throws -> (Device, Device) {
  let user = try TestUser()
  let a = try Device("alpha", user: user, store: store)
  let b = try Device("beta", user: user, store: store)
  try a.start()
  try b.start()
  return (a, b)
}

/// A device did not get in sync in time.
struct SyncTimeout: Error, CustomStringConvertible {
  let device: String
  var description: String { "sync of \(device) timed out" }
}

/// The cloudIDs of the RCRDs of `user` in `store`, one per RCRD.
func storedRcrdCloudIDs(_ store: any CloudStore, user: TestUser) throws -> [String] {
  try store.listAll(prefix: "\(user.userID)/").filter { $0.key.hasSuffix(".rcrd") }.map {
    try Rcrd.decode(store.get(key: $0.key), userID: user.userID, keyPair: user.keys).cloudID
  }
}
