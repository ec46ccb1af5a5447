import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

@Suite struct TagLinkTests {
  @Test func tags() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let f = try tx.createNode(path: p("f"))
      #expect(try tx.tag(forNodeID: f.id, identifier: "a") == nil)
      try tx.setTag(.string("task-1"), forNodeID: f.id, identifier: "taskID")
      try tx.setTag(.int(-7), forNodeID: f.id, identifier: "n")
      try tx.setTag(.data(Data([0, 1])), forNodeID: f.id, identifier: "d")
      #expect(try tx.tag(forNodeID: f.id, identifier: "taskID") == .string("task-1"))
      #expect(try tx.tag(forNodeID: f.id, identifier: "n") == .int(-7))
      #expect(try tx.tag(forNodeID: f.id, identifier: "d") == .data(Data([0, 1])))
      try tx.setTag(.int(8), forNodeID: f.id, identifier: "n")
      #expect(try tx.tag(forNodeID: f.id, identifier: "n") == .int(8))
      try tx.setTag(nil, forNodeID: f.id, identifier: "d")
      #expect(
        try tx.tags(forNodeID: f.id) == ["taskID": .string("task-1"), "n": .int(8)])
      #expect(throws: CatalogError.nodeNotFound(55_555)) {
        try tx.setTag(.int(1), forNodeID: 55_555, identifier: "x")
      }
      try tx.deleteNode(f.id)
      #expect(try tx.tags(forNodeID: f.id).isEmpty)
      let again = try tx.createNode(path: p("f"))
      #expect(try tx.tags(forNodeID: again.id).isEmpty)
    }
  }

  /// A node made here has no tag or link to remove until it is given one (its removals then
  /// take no statement); one given a tag or a link loses it as any node does.
  @Test func aNewNodeGivenTagsAndLinksLosesThem() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let f = try tx.createNode(path: p("f"))
      try tx.setTag(nil, forNodeID: f.id, identifier: "conflict")
      try tx.setTag(.string("x"), forNodeID: f.id, identifier: "conflict")
      try tx.setTag(nil, forNodeID: f.id, identifier: "conflict")
      #expect(try tx.tag(forNodeID: f.id, identifier: "conflict") == nil)
      try tx.setTag(.int(1), forNodeID: f.id, identifier: "kept")
      try tx.linkNodeID(f.id, toKey: "k", inCollection: "c")
      try tx.deleteNode(f.id)
      #expect(try tx.linkedNodeID(forKey: "k", inCollection: "c") == nil)
      let g = try tx.createNode(path: p("g"))
      try tx.linkNodeID(g.id, toKey: "k", inCollection: "c")
      #expect(try tx.linkedNodeID(forKey: "k", inCollection: "c") == g.id)
    }
    // In a later unit too (the cache outlives the transaction).
    try catalog.write("alice") { tx in
      let g = try #require(try tx.node(path: p("g")))
      try tx.deleteNode(g.id)
      #expect(try tx.linkedNodeID(forKey: "k", inCollection: "c") == nil)
    }
    #expect(try catalog.foreignKeyViolations().isEmpty)
  }

  @Test func links() throws {
    let catalog = try makeCatalog()
    try catalog.createLocalUser(makeUser("bob"))
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let b = try tx.createNode(path: p("a", "b"))
      try tx.linkNodeID(a.id, toKey: "k1", inCollection: "tasks")
      try tx.linkNodeID(a.id, toKey: "k1", inCollection: "tasks")  // same pair: fine
      #expect(try tx.linkedNodeID(forKey: "k1", inCollection: "tasks") == a.id)
      #expect(try tx.linkedNodeID(forKey: "k1", inCollection: "lists") == nil)
      let pair = try #require(try tx.linkedCollectionAndKey(forNodeID: a.id))
      #expect(pair.collection == "tasks" && pair.key == "k1")
      #expect(throws: CatalogError.alreadyLinked(nodeID: a.id, collection: "tasks", key: "k2")) {
        try tx.linkNodeID(a.id, toKey: "k2", inCollection: "tasks")
      }
      #expect(throws: CatalogError.alreadyLinked(nodeID: b.id, collection: "tasks", key: "k1")) {
        try tx.linkNodeID(b.id, toKey: "k1", inCollection: "tasks")
      }
      try tx.linkNodeID(b.id, toKey: "k1", inCollection: "lists")
      try tx.unlinkNodeID(a.id)
      #expect(try tx.linkedCollectionAndKey(forNodeID: a.id) == nil)
      #expect(throws: CatalogError.self) {
        try tx.linkNodeID(b.id, toKey: "k9", inCollection: "lists")
      }
    }
    // Links are per local user; deleting a subtree removes its links.
    try catalog.write("bob") { tx in
      let x = try tx.createNode(path: p("x"))
      try tx.linkNodeID(x.id, toKey: "k1", inCollection: "lists")
      #expect(try tx.linkedNodeID(forKey: "k1", inCollection: "lists") == x.id)
    }
    try catalog.write("alice") { tx in
      let b = try #require(try tx.node(path: p("a", "b")))
      #expect(try tx.linkedNodeID(forKey: "k1", inCollection: "lists") == b.id)
      try tx.deleteNode(b.parentID!)
      #expect(try tx.linkedNodeID(forKey: "k1", inCollection: "lists") == nil)
      #expect(try tx.linkedCollectionAndKey(forNodeID: b.id) == nil)
      let c = try tx.createNode(path: p("c"))
      try tx.linkNodeID(c.id, toKey: "k1", inCollection: "lists")
    }
  }
}
