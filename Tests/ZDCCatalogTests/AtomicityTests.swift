import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

/// An injected failure in the middle of any mutation leaves neither its node change nor its
/// operations behind.
@Suite struct AtomicityTests {
  struct Snapshot: Equatable {
    var nodes: [Node]
    var operations: [PushOperation]
    var tags: [String: TagValue]
    var link: String?
  }

  func snapshot(_ catalog: Catalog, _ ids: [NodeID]) throws -> Snapshot {
    try catalog.read("alice") { tx in
      let home = try tx.trunkNode(.home)!
      var nodes: [Node] = []
      func walk(_ id: NodeID) throws {
        for c in try tx.children(of: id) {
          nodes.append(c)
          try walk(c.id)
        }
      }
      try walk(home.id)
      return Snapshot(
        nodes: nodes, operations: try tx.allOperations(),
        tags: try tx.tags(forNodeID: ids[0]),
        link: try tx.linkedCollectionAndKey(forNodeID: ids[0]).map { $0.key })
    }
  }

  /// Builds a small tree, part of it uploaded, and returns the ids [f, dir, other].
  func setUp(_ catalog: Catalog) throws -> [NodeID] {
    try catalog.write("alice") { tx in
      let dir = try tx.createNode(path: p("dir"), kind: .directory)
      let f = try tx.createNode(path: p("dir", "f"))
      let other = try tx.createNode(path: p("other"), kind: .directory)
      try tx.drainQueue()
      try tx.queueDataUpload(nodeID: f.id)
      try tx.setTag(.string("v"), forNodeID: f.id, identifier: "t")
      return [f.id, dir.id, other.id]
    }
  }

  static let cases: [(String, @Sendable (CloudTransaction, [NodeID]) throws -> Void)] = [
    ("createNode.afterInsert", { tx, _ in try tx.createNode(path: p("dir", "new")) }),
    (
      "updateNode.afterUpdate",
      { tx, ids in
        var n = try tx.node(id: ids[0])!
        n.mode = 0o600
        try tx.updateNode(n)
      }
    ),
    ("moveNode.afterUpdate", { tx, ids in try tx.moveNode(ids[0], toParent: ids[2], name: "m") }),
    ("deleteNode.afterDelete", { tx, ids in try tx.deleteNode(ids[1]) }),
    ("queueDataUpload.afterEnqueue", { tx, ids in try tx.queueDataUpload(nodeID: ids[0]) }),
    ("setTag.afterWrite", { tx, ids in try tx.setTag(nil, forNodeID: ids[0], identifier: "t") }),
    (
      "linkNode.afterWrite", { tx, ids in try tx.linkNodeID(ids[0], toKey: "k", inCollection: "c") }
    ),
  ]

  @Test(arguments: 0..<cases.count)
  func injectedFailureRollsBack(_ index: Int) throws {
    let (point, mutation) = Self.cases[index]
    let catalog = try makeCatalog()
    let ids = try setUp(catalog)
    let before = try snapshot(catalog, ids)
    catalog.failpoint = point
    #expect(throws: CatalogError.injectedFailure(point)) {
      try catalog.write("alice") { tx in try mutation(tx, ids) }
    }
    #expect(try snapshot(catalog, ids) == before)
    // Without the failpoint the same mutation succeeds and changes something.
    catalog.failpoint = nil
    try catalog.write("alice") { tx in try mutation(tx, ids) }
    #expect(try snapshot(catalog, ids) != before)
  }

  /// A snapshot without the operations' times (operations made again are made now).
  func untimed(_ s: Snapshot) -> Snapshot {
    var s = s
    for i in s.operations.indices {
      s.operations[i].createdAt = .distantPast
      s.operations[i].nextAttemptAt = .distantPast
    }
    return s
  }

  /// A catalog whose `.soon` batches stay open until committed explicitly.
  func makeBatchingCatalog() throws -> Catalog {
    let catalog = try Catalog.temporary(
      options: Catalog.Options(durability: .normal, batchWindow: 3600))
    try catalog.createLocalUser(makeUser("alice"))
    return catalog
  }

  /// The same failures inside an open batch of `.soon` writes: the failed write leaves nothing,
  /// the writes batched before it stay, and what is committed and reopened is the same.
  @Test(arguments: 0..<cases.count)
  func injectedFailureInABatchKeepsTheBatch(_ index: Int) throws {
    let (point, mutation) = Self.cases[index]
    let catalog = try makeBatchingCatalog()
    let ids = try setUp(catalog)
    // Batched before the failure: a node, a tag and an operation.
    try catalog.write("alice", commit: .soon) { tx in
      let n = try tx.createNode(path: p("other", "batched"))
      try tx.setTag(.int(7), forNodeID: n.id, identifier: "b")
    }
    try catalog.write("alice", commit: .soon) { tx in try tx.queueDataUpload(nodeID: ids[0]) }
    let before = try snapshot(catalog, ids)
    let tags = try catalog.read("alice") { tx in
      try tx.tags(forNodeID: try #require(try tx.node(path: p("other", "batched"))).id)
    }
    catalog.failpoint = point
    #expect(throws: CatalogError.injectedFailure(point)) {
      try catalog.write("alice", commit: .soon) { tx in try mutation(tx, ids) }
    }
    catalog.failpoint = nil
    // Every case but the create fails after changing rows: the batch was made again without
    // it. The new file is held (no row: see `HeldRows`), and undoing the unit drops it.
    #expect(catalog.rebuiltBatches == (point == "createNode.afterInsert" ? 0 : 1))
    // The same rows, ids included; only the times of the operations made again differ.
    #expect(try untimed(snapshot(catalog, ids)) == untimed(before))
    #expect(
      try catalog.read("alice") { tx in
        try tx.tags(forNodeID: try #require(try tx.node(path: p("other", "batched"))).id)
      } == tags)
    // The batch goes on and commits as a whole.
    try catalog.write("alice", commit: .soon) { tx in try mutation(tx, ids) }
    let after = try snapshot(catalog, ids)
    #expect(after != before)
    try catalog.commitPending()
    #expect(try snapshot(catalog, ids) == after)
  }

  /// A `.soon` write that fails before changing anything leaves the batch untouched, without
  /// rebuilding it.
  @Test func failureBeforeAnyChangeKeepsTheBatchAsItIs() throws {
    let catalog = try makeBatchingCatalog()
    let ids = try setUp(catalog)
    try catalog.write("alice", commit: .soon) { tx in _ = try tx.createNode(path: p("x")) }
    let before = try snapshot(catalog, ids)
    #expect(throws: UserError.self) {
      try catalog.write("alice", commit: .soon) { tx in
        _ = try tx.node(id: ids[0])
        throw UserError()
      }
    }
    #expect(throws: CatalogError.self) {
      try catalog.write("alice", commit: .soon) { tx in
        _ = try tx.createNode(path: p("missing", "y"))
      }
    }
    #expect(catalog.rebuiltBatches == 0)
    #expect(try snapshot(catalog, ids) == before)
    try catalog.commitPending()
    #expect(try snapshot(catalog, ids) == before)
  }

  struct UserError: Error {}

  @Test func errorThrownByCallerRollsBackEverything() throws {
    let catalog = try makeCatalog()
    let ids = try setUp(catalog)
    let before = try snapshot(catalog, ids)
    #expect(throws: UserError.self) {
      try catalog.write("alice") { tx in
        try tx.createNode(path: p("dir", "x"))
        try tx.moveNode(ids[0], toParent: ids[2], name: "moved")
        try tx.queueDataUpload(nodeID: ids[0])
        try tx.setTag(.int(1), forNodeID: ids[0], identifier: "n")
        try tx.deleteNode(ids[1])
        throw UserError()
      }
    }
    #expect(try snapshot(catalog, ids) == before)
  }

  @Test func catalogErrorInsideWriteRollsBackEarlierChanges() throws {
    let catalog = try makeCatalog()
    let ids = try setUp(catalog)
    let before = try snapshot(catalog, ids)
    #expect(throws: CatalogError.self) {
      try catalog.write("alice") { tx in
        try tx.createNode(path: p("dir", "y"))
        try tx.createNode(path: p("dir", "Y"))  // name taken
      }
    }
    #expect(try snapshot(catalog, ids) == before)
  }
}
