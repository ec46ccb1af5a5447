import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

@Suite struct SchemaTests {
  @Test func migrationsAppliedAndReopen() throws {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
      "zdc-schema-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }
    let path = dir.appendingPathComponent("catalog.sqlite").path

    #expect(Catalog.knownMigrations == ["v1", "v2", "v3"])
    var nodeID: NodeID = 0
    do {
      let catalog = try Catalog(path: path)
      #expect(try catalog.appliedMigrations() == ["v1", "v2", "v3"])
      #expect(try catalog.pragma("journal_mode") == "wal")
      #expect(try catalog.pragma("synchronous") == "2")  // FULL
      #expect(try catalog.pragma("foreign_keys") == "1")
      try catalog.createLocalUser(makeUser("alice"))
      nodeID = try catalog.write("alice") { try $0.createNode(path: p("a")).id }
    }
    let reopened = try Catalog(path: path)
    #expect(try reopened.appliedMigrations() == ["v1", "v2", "v3"])
    let node = try reopened.read("alice") { try $0.node(path: p("a")) }
    #expect(node?.id == nodeID)
    #expect(try reopened.read("alice") { try $0.operationCount() } == 1)

    let normal = try Catalog(path: path, options: .init(durability: .normal))
    #expect(try normal.pragma("synchronous") == "1")  // NORMAL
  }

  @Test func inMemoryCatalogWorks() throws {
    let catalog = try Catalog.inMemory()
    try catalog.createLocalUser(makeUser("bob"))
    let n = try catalog.write("bob") { try $0.createNode(path: p("x"), kind: .directory) }
    #expect(try catalog.read("bob") { try $0.node(id: n.id) } == n)
  }

  @Test func localUsers() throws {
    let catalog = try makeCatalog(userID: "alice")
    #expect(throws: CatalogError.userExists("alice")) {
      try catalog.createLocalUser(makeUser("alice"))
    }
    #expect(throws: CatalogError.userNotFound("nobody")) {
      try catalog.read("nobody") { _ in 1 }
    }
    let user = try #require(try catalog.localUser(id: "alice"))
    #expect(user.layout == CloudLayout(userID: "alice", treeID: "com.example.zdcfs"))
    try catalog.setSettings(Data(#"{"x":1}"#.utf8), forUserID: "alice")
    #expect(try catalog.localUser(id: "alice")?.settings == Data(#"{"x":1}"#.utf8))

    try catalog.createLocalUser(makeUser("bob"))
    #expect(try catalog.localUsers().map(\.id).sorted() == ["alice", "bob"])
    try catalog.write("bob") { tx in
      try tx.createNode(path: p("a"), kind: .directory)
      try tx.createNode(path: p("a", "b"))
    }
    try catalog.deleteLocalUser(id: "bob")
    #expect(try catalog.localUser(id: "bob") == nil)
    #expect(try catalog.localUsers().map(\.id) == ["alice"])
    #expect(throws: CatalogError.userNotFound("bob")) { try catalog.read("bob") { _ in 1 } }
    #expect(throws: CatalogError.userNotFound("bob")) { try catalog.write("bob") { _ in 1 } }
  }

  @Test func trunksCreatedWithUser() throws {
    let catalog = try Catalog.temporary()
    let trunks = try catalog.createLocalUser(makeUser("alice"))
    #expect(Set(trunks.keys) == Set(Trunk.allCases))
    try catalog.read("alice") { tx in
      for trunk in Trunk.allCases {
        let node = try #require(try tx.trunkNode(trunk))
        #expect(node == trunks[trunk])
        #expect(node.kind == .trunk)
        #expect(node.trunk == trunk)
        #expect(node.parentID == nil)
        #expect(node.dirPrefix == trunk.dirPrefix)
        #expect(node.dirSalt.count == 20)
        #expect(node.encryptionKey.count == 32)
        #expect(try tx.path(of: node.id) == TreesystemPath(trunk: trunk))
        #expect(try tx.objectLocation(of: node.id) == nil)
      }
      #expect(try tx.operationCount() == 0)
    }
  }
}
