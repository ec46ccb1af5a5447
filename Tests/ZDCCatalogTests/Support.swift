import Foundation
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// A fresh on-disk catalog in a temporary directory with one local user; its fields are sealed,
/// as the mount's are.
func makeCatalog(userID: String = "alice", key: Data = SecureRandom.bytes(32)) throws -> Catalog {
  let catalog = try Catalog.temporary(options: .init(fieldKey: key))
  try catalog.createLocalUser(makeUser(userID))
  return catalog
}

func makeUser(_ id: String, treeID: String = "com.example.zdcfs") -> LocalUser {
  LocalUser(
    id: id, treeID: treeID, boxPublicKey: SecureRandom.bytes(32),
    signPublicKey: SecureRandom.bytes(32))
}

/// The catalog in `dir` with batches that only an explicit commit ends (a copy of its files
/// is then taken with the batch open, as a crash would leave them).
func openBatching(_ dir: URL) throws -> Catalog {
  try Catalog(
    path: dir.appendingPathComponent("catalog.sqlite").path,
    options: Catalog.Options(durability: .normal, batchWindow: 3600))
}

/// A fresh temporary directory for a catalog's files.
func tempDir() throws -> URL {
  let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
    "zdc-catalog-files-\(UUID().uuidString)")
  try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
  return dir
}

/// The catalog's files in `dir` as a crash would leave them (no shared-memory index: rebuilt
/// on open), copied to a fresh directory.
func crashCopy(_ dir: URL) throws -> URL {
  let copy = try tempDir()
  for name in ["catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite.redo"] {
    let from = dir.appendingPathComponent(name)
    if FileManager.default.fileExists(atPath: from.path) {
      try FileManager.default.copyItem(at: from, to: copy.appendingPathComponent(name))
    }
  }
  return copy
}

/// Each operation of a user's push queue as its kind, node and state, with the kinds and nodes of the
/// operations it waits for: what does not depend on operation ids and times.
func queueSummary(_ catalog: Catalog, _ user: String) throws -> [String] {
  // On the writer, as the push reads it: new nodes' deferred first uploads are queued first.
  try catalog.read(user, onWriter: true) { tx in
    let ops = try tx.allOperations()
    let byID = Dictionary(uniqueKeysWithValues: ops.map { ($0.id, $0) })
    return try ops.map { op in
      let deps = try tx.dependencies(ofOperation: op.id).map { id in
        byID[id].map { "\($0.kind) \($0.nodeID ?? -1)" } ?? "gone"
      }.sorted()
      return "\(op.kind) \(op.nodeID ?? -1) \(op.state) after [\(deps.joined(separator: ", "))]"
    }.sorted()
  }
}

/// A home path from its components.
func p(_ components: String...) -> TreesystemPath {
  try! TreesystemPath(components)
}

extension CloudTransaction {
  /// Pretends the push manager uploaded every ready operation, repeatedly, until the queue is
  /// empty; records eTags for the nodes it touched.
  func drainQueue() throws {
    var rounds = 0
    while true {
      let ready = try readyOperations(limit: 1000, now: Date.distantFuture)
      if ready.isEmpty { break }
      for op in ready {
        try markInFlight(op.id)
        try completeAsUploaded(op)
      }
      rounds += 1
      precondition(rounds < 10_000)
    }
  }

  /// Completes an in-flight operation as the push manager would after a successful upload.
  func completeAsUploaded(_ op: PushOperation) throws {
    if let id = op.nodeID, let node = try node(id: id) {
      switch op.kind {
      case .putRcrd, .move:
        try setCloudState(
          nodeID: id, eTagRcrd: "r\(op.id)", lastModifiedRcrd: Date(), eTagData: node.eTagData,
          lastModifiedData: node.lastModifiedData)
      case .putData:
        try setCloudState(
          nodeID: id, eTagRcrd: node.eTagRcrd, lastModifiedRcrd: node.lastModifiedRcrd,
          eTagData: "d\(op.id)", lastModifiedData: Date())
      case .deleteLeaf, .deleteNode:
        break
      }
    }
    try completeOperation(id: op.id)
  }

  func kinds(_ nodeID: NodeID) throws -> [PushOperationKind] {
    try pendingOperations(forNodeID: nodeID).map(\.kind)
  }
}
