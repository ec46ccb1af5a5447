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
