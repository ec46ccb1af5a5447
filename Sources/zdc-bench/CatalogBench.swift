import Foundation
import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// Per-transaction costs of the catalog, the unit of work of every FUSE metadata operation.
enum CatalogBench {
  static func run(count: Int) throws {
    try FieldCryptoBench.run(count: count * 10)
    for sealed in [false, true] { try run(count: count, sealed: sealed) }
  }

  /// The operations on a plain catalog, or on one that seals its fields (as the mount's does).
  /// Writes commit in batches (`.soon`, journaled), as the mount's do.
  static func run(count: Int, sealed: Bool) throws {
    print(
      "zdc-bench catalog, \(sealed ? "sealed" : "plain") (\(count) operations each; µs per "
        + "operation, one thread)")
    let catalog = try Catalog.temporary(
      options: Catalog.Options(
        durability: .normal, fieldKey: sealed ? SecureRandom.bytes(32) : nil))
    let user = "benchuser"
    try catalog.createLocalUser(
      LocalUser(
        id: user, treeID: "bench", boxPublicKey: SecureRandom.bytes(32),
        signPublicKey: SecureRandom.bytes(32)))
    let dir = try catalog.write(user) { tx in
      try tx.createNode(path: TreesystemPath(["dir"]), kind: .directory)
    }
    func perOp(_ what: String, _ body: (Int) throws -> Void) rethrows {
      let t = try time { for i in 0..<count { try body(i) } }
      print(
        what.padding(toLength: 60, withPad: " ", startingAt: 0)
          + String(format: "%8.1f µs", t / Double(count) * 1e6))
    }
    var ids: [NodeID] = []
    try perOp("write tx: create a file node (+ its putRcrd)") { i in
      let n = try catalog.write(user, commit: .soon) { tx in
        try tx.createNode(path: TreesystemPath(["dir", "f\(i)"]))
      }
      ids.append(n.id)
    }
    try perOp("write tx: update size + queue the data upload") { i in
      try catalog.write(user, commit: .soon) { tx -> Void in
        guard var n = try tx.node(id: ids[i]) else { return }
        n.dataSize = 100
        _ = try tx.updateNode(n)
        _ = try tx.queueDataUpload(nodeID: n.id)
      }
    }
    try perOp("write tx: commit data (size, mtime, uploads queued)") { i in
      _ = try catalog.write(user, commit: .soon) { tx in
        try tx.commitData(nodeID: ids[i], size: 200, mtime: FileTime(Date()))
      }
    }
    try perOp("read tx: node by id") { i in
      _ = try catalog.read(user) { tx in try tx.node(id: ids[i]) }
    }
    try perOp("read tx: child by name") { i in
      _ = try catalog.read(user) { tx in try tx.child(of: dir.id, named: "f\(i)") }
    }
    try perOp("read tx: empty") { _ in
      _ = try catalog.read(user) { _ in 0 }
    }
    try perOp("write tx: empty") { _ in
      _ = try catalog.write(user, commit: .soon) { _ in 0 }
    }
    try perOp("write tx: rename a node") { i in
      _ = try catalog.write(user, commit: .soon) { tx in
        try tx.moveNode(ids[i], toParent: dir.id, name: "g\(i)")
      }
    }
    try perOp("write tx: delete a node") { i in
      try catalog.write(user, commit: .soon) { tx in try tx.deleteNode(ids[i]) }
    }
  }
}

/// The costs of what a sealed catalog adds per field: one AEAD seal and open of a short value,
/// and one keyed digest (the name index).
enum FieldCryptoBench {
  static func run(count: Int) throws {
    let key = SecureRandom.bytes(32)
    let nonce = SecureRandom.bytes(24)
    let value = Data("a-file-name.txt".utf8)
    var sealed = Data()
    let tSeal = try time {
      for _ in 0..<count {
        sealed = try AEAD.seal(value, nonce: nonce, associatedData: Data([1]), key: key)
      }
    }
    let tOpen = try time {
      for _ in 0..<count {
        _ = try AEAD.open(sealed, nonce: nonce, associatedData: Data([1]), key: key)
      }
    }
    let digester = try KeyedDigest(key: key)
    let tDigest = time { for i in 0..<count { _ = digester.digest("a-file-name-\(i & 7).txt") } }
    for (what, t) in [
      ("AEAD seal, 15 bytes", tSeal), ("AEAD open, 15 bytes", tOpen),
      ("keyed digest of a name", tDigest),
    ] {
      print(
        what.padding(toLength: 60, withPad: " ", startingAt: 0)
          + String(format: "%8.2f µs", t / Double(count) * 1e6))
    }
  }
}
