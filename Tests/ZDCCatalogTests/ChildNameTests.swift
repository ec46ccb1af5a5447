import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// The names the catalog keeps for directories made in this process: an absent name is
/// answered without a query, and every statement that names a node is seen (a name the sets
/// missed would be reported absent while a node holds it).
@Suite struct ChildNameTests {
  func names(_ catalog: Catalog, _ parent: NodeID, _ name: String) throws -> [String] {
    try catalog.read("alice", onWriter: true) { tx in
      try tx.children(of: parent, sharingNameWith: name).map(\.name)
    }
  }

  @Test(arguments: [false, true])
  func absentNamesOfANewDirectoryNeedNoQuery(sealed: Bool) throws {
    let catalog = try Catalog.temporary(
      options: .init(fieldKey: sealed ? SecureRandom.bytes(32) : nil))
    try catalog.createLocalUser(makeUser("alice"))
    let variant = CaseVariant.name(for: "makefile")
    let d = try catalog.write("alice") { tx in
      let d = try tx.createNode(path: p("d"), kind: .directory)
      for n in ["a", "Makefile", variant] { _ = try tx.createNode(path: p("d", n)) }
      return d.id
    }
    let before = catalog.absentNamesAnswered
    #expect(try names(catalog, d, "absent").isEmpty)
    #expect(try names(catalog, d, "b").isEmpty)
    #expect(catalog.absentNamesAnswered == before + 2)
    // Present names, up to case and through a case variant, come from the catalog.
    #expect(try names(catalog, d, "A") == ["a"])
    #expect(try names(catalog, d, "MAKEFILE") == ["Makefile", variant])
    #expect(catalog.absentNamesAnswered == before + 2)
  }

  @Test func everyStatementThatNamesANodeIsSeen() throws {
    let catalog = try makeCatalog()
    let (d, old, x, y, z) = try catalog.write("alice") { tx in
      let old = try tx.createNode(path: p("old"), kind: .directory)
      let x = try tx.createNode(path: p("old", "x"))
      let y = try tx.createNode(path: p("old", "y"))
      let z = try tx.createNode(path: p("old", "z"))
      let d = try tx.createNode(path: p("d"), kind: .directory)
      return (d.id, old.id, x.id, y.id, z.id)
    }
    // A rename in place.
    _ = try catalog.write("alice") { tx in try tx.createNode(path: p("d", "f")) }
    #expect(try names(catalog, d, "g").isEmpty)
    try catalog.write("alice") { tx in
      let f = try #require(try tx.node(path: p("d", "f")))
      _ = try tx.moveNode(f.id, toParent: d, name: "g")
    }
    #expect(try names(catalog, d, "g") == ["g"])
    // A move in from another directory.
    #expect(try names(catalog, d, "x").isEmpty)
    try catalog.write("alice") { tx in _ = try tx.moveNode(x, toParent: d, name: "x") }
    #expect(try names(catalog, d, "X") == ["x"])
    // A rename that moves no object (a first upload that lost a name race).
    try catalog.write("alice") { tx in _ = try tx.moveNode(y, toParent: d, name: "y") }
    #expect(try names(catalog, d, "y2").isEmpty)
    try catalog.write("alice") { tx in _ = try tx.renameWithoutMove(y, to: "y2") }
    #expect(try names(catalog, d, "y2") == ["y2"])
    // A version from the cloud placing a node here (a pull).
    #expect(try names(catalog, d, "z").isEmpty)
    try catalog.write("alice") { tx in
      var n = try tx.existingNode(id: z)
      n.parentID = d
      try tx.applyRemoteNode(n, cloudName: try tx.cloudName(of: z))
    }
    #expect(try names(catalog, d, "z") == ["z"])
    #expect(try names(catalog, old, "z").isEmpty)
  }

  @Test func aFailedUnitLeavesNoNameUnseen() throws {
    let catalog = try makeCatalog()
    struct Failed: Error {}
    let d = try catalog.write("alice") { tx in
      let d = try tx.createNode(path: p("d"), kind: .directory)
      _ = try tx.createNode(path: p("d", "a"))
      return d.id
    }
    // The unit renames `a` to `b`, then fails: `a` is back.
    #expect(throws: Failed.self) {
      try catalog.write("alice") { tx in
        let a = try #require(try tx.node(path: p("d", "a")))
        _ = try tx.moveNode(a.id, toParent: d, name: "b")
        throw Failed()
      }
    }
    #expect(try names(catalog, d, "a") == ["a"])
    #expect(try names(catalog, d, "b").isEmpty)
    _ = try catalog.write("alice") { tx in try tx.createNode(path: p("d", "c")) }
    #expect(try names(catalog, d, "c") == ["c"])
  }

  @Test func aDeletedDirectoryTakesItsNamesAlong() throws {
    let catalog = try makeCatalog()
    let before = catalog.directoriesWithChildNames
    let (d, e) = try catalog.write("alice") { tx in
      let d = try tx.createNode(path: p("d"), kind: .directory)
      let e = try tx.createNode(path: p("d", "e"), kind: .directory)
      _ = try tx.createNode(path: p("d", "e", "f"))
      return (d.id, e.id)
    }
    #expect(catalog.directoriesWithChildNames == before + 2)
    #expect(try names(catalog, e, "g").isEmpty)
    try catalog.write("alice") { tx in try tx.deleteNode(d) }
    #expect(catalog.directoriesWithChildNames == before)
    // A directory made again under the same name starts with no names.
    let d2 = try catalog.write("alice") { tx in
      try tx.createNode(path: p("d"), kind: .directory).id
    }
    #expect(d2 != d)
    #expect(try names(catalog, d2, "e").isEmpty)
    #expect(catalog.directoriesWithChildNames == before + 1)
  }
}
