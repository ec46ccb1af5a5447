import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCTestSupport

/// New files of a `.soon` batch are held without a row until a statement needs one or the
/// batch commits: a file that lives a moment costs no statement, and nothing else can tell —
/// queries find held files as rows, ids are never handed out twice, a crash or a rolled-back
/// batch keeps what the journal recorded, and a taken name is refused as the index refuses it.
@Suite struct HeldRowsTests {
  let user = "alice"

  /// A batching catalog in `dir` with the user and a directory `d` made here: the cache knows
  /// its child names, which is what lets a new file in it be held.
  func makeCatalog(in dir: URL) throws -> (Catalog, Node) {
    let catalog = try openBatching(dir)
    try catalog.createLocalUser(makeUser(user))
    let d = try catalog.write(user) { tx in try tx.createNode(path: p("d"), kind: .directory) }
    return (catalog, d)
  }

  func withCatalog(_ body: (Catalog, URL, Node) throws -> Void) throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let (catalog, d) = try makeCatalog(in: dir)
    try body(catalog, dir, d)
  }

  func soon<T>(_ catalog: Catalog, _ body: (CloudTransaction) throws -> T) throws -> T {
    try catalog.write(user, commit: .soon, body)
  }

  /// `d/f` with committed content of `size` bytes, made by one `.soon` write.
  func fileWithContent(_ catalog: Catalog, size: UInt64) throws -> Node {
    try soon(catalog) { tx in
      let f = try tx.createNode(path: p("d", "f"))
      return try tx.commitData(nodeID: f.id, size: size, mtime: nil)
    }
  }

  /// A new file in `parent`, made as the file system makes one (by parent id: a path would be
  /// looked up by a query, which inserts what is held).
  func file(_ catalog: Catalog, _ parent: Node, _ name: String, kind: NodeKind = .file) throws
    -> Node
  {
    try soon(catalog) { tx in
      try tx.createNode(
        Node(
          uuid: "", localUserID: user, parentID: parent.id, name: name, kind: kind,
          shareList: .owner(user), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
          cloudID: "", mode: 0o644, mtime: FileTime(seconds: 1, nanoseconds: 0)))
    }
  }

  @Test func aFileThatLivesAMomentTouchesNoRow() throws {
    try withCatalog { catalog, _, d in
      let rows = try catalog.nodeRows()
      let queue = try queueSummary(catalog, user)
      let f = try file(catalog, d, "f")
      #expect(catalog.heldNodes == 1)
      try soon(catalog) { tx in
        _ = try tx.commitData(nodeID: f.id, size: 12, mtime: FileTime(seconds: 5, nanoseconds: 0))
      }
      try soon(catalog) { tx in _ = try tx.moveNode(f.id, toParent: d.id, name: "g") }
      try soon(catalog) { tx in
        var n = try tx.existingNode(id: f.id)
        n.mode = 0o600
        try tx.updateNode(n)
      }
      let seen = try catalog.read(user) { tx in try tx.existingNode(id: f.id) }
      #expect(seen.name == "g" && seen.dataSize == 12 && seen.mode == 0o600)
      #expect(seen.mtime == FileTime(seconds: 5, nanoseconds: 0))
      #expect(try catalog.nodeRows() == rows)
      try soon(catalog) { tx in try tx.deleteNode(f.id) }
      #expect(catalog.heldNodes == 0)
      try catalog.commitPending()
      #expect(try catalog.nodeRows() == rows)
      #expect(try queueSummary(catalog, user) == queue)
      #expect(try catalog.read(user) { tx in try tx.node(id: f.id) } == nil)
    }
  }

  @Test func aQueryFindsHeldFilesAsRows() throws {
    try withCatalog { catalog, _, d in
      let f = try fileWithContent(catalog, size: 7)
      #expect(catalog.heldNodes == 1)
      // A listing is a query: the held file is inserted before it runs.
      let listed = try catalog.read(user) { tx in try tx.children(of: d.id) }
      #expect(listed == [f])
      #expect(catalog.heldNodes == 0)
      let found = try catalog.read(user) { tx in
        (try tx.node(path: p("d", "f")), try tx.node(cloudID: f.cloudID), try tx.path(of: f.id))
      }
      #expect(found.0 == f && found.1 == f && found.2 == p("d", "f"))
      // Its first upload was deferred, and is queued as for a row.
      #expect(
        try queueSummary(catalog, user).sorted()
          == [
            "putData \(f.id) pending after [putRcrd \(f.id)]",
            "putRcrd \(f.id) pending after [putRcrd \(d.id)]",
            "putRcrd \(d.id) pending after []",
          ].sorted())
    }
  }

  @Test func aHeldFileIsCommittedAsOneRowInItsLastState() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    var f: Node
    do {
      let (catalog, d) = try makeCatalog(in: dir)
      f = try file(catalog, d, "f")
      f = try soon(catalog) { tx in
        _ = try tx.commitData(nodeID: f.id, size: 99, mtime: FileTime(seconds: 9, nanoseconds: 1))
        return try tx.moveNode(f.id, toParent: d.id, name: "F2")
      }
      #expect(catalog.heldNodes == 1)
      try catalog.commitPending()
      #expect(catalog.heldNodes == 0)
    }
    let reopened = try openBatching(dir)
    let stored = try reopened.read(user) { tx in try tx.node(path: p("d", "f2")) }
    #expect(stored == f)
    #expect(stored?.name == "F2" && stored?.dataSize == 99)
  }

  @Test func idsAreNeverHandedOutTwice() throws {
    try withCatalog { catalog, _, d in
      // Held, then deleted: its id was never a row's.
      let a = try file(catalog, d, "a")
      try soon(catalog) { tx in try tx.deleteNode(a.id) }
      // A directory is inserted at once; so is a file whose unit defers nothing.
      let e = try soon(catalog) { tx in try tx.createNode(path: p("d", "e"), kind: .directory) }
      #expect(e.id > a.id)
      let b = try file(catalog, d, "b")
      try soon(catalog) { tx in try tx.deleteNode(b.id) }
      #expect(b.id > e.id)
      try catalog.commitPending()
      let c = try catalog.write(user) { tx in try tx.createNode(path: p("d", "c")) }
      #expect(c.id > b.id)
      // Two held at once, one deleted, then a row: all distinct and rising.
      let g = try file(catalog, d, "g")
      let h = try file(catalog, d, "h")
      try soon(catalog) { tx in try tx.deleteNode(h.id) }
      let i = try soon(catalog) { tx in try tx.createNode(path: p("d", "i"), kind: .directory) }
      #expect(c.id < g.id && g.id < h.id && h.id < i.id)
    }
  }

  @Test func aTakenNameIsRefused() throws {
    try withCatalog { catalog, _, d in
      let a = try file(catalog, d, "a")
      let b = try file(catalog, d, "b")
      #expect(catalog.heldNodes == 2)
      #expect(throws: CatalogError.nameTaken(parentID: d.id, name: "A", existingID: a.id)) {
        try file(catalog, d, "A")
      }
      #expect(throws: CatalogError.nameTaken(parentID: d.id, name: "a", existingID: a.id)) {
        try soon(catalog) { tx in try tx.moveNode(b.id, toParent: d.id, name: "a") }
      }
      // Both are still there, as they were.
      let names = try catalog.read(user) { tx in try tx.children(of: d.id).map(\.name) }
      #expect(names == ["a", "b"])
    }
  }

  @Test func aCrashKeepsWhatWasHeld() throws {
    try withCatalog { catalog, dir, d in
      let f = try soon(catalog) { tx in
        let f = try tx.createNode(path: p("d", "f"))
        _ = try tx.commitData(nodeID: f.id, size: 5, mtime: nil)
        return try tx.moveNode(f.id, toParent: d.id, name: "kept")
      }
      let gone = try file(catalog, d, "gone")
      try soon(catalog) { tx in try tx.deleteNode(gone.id) }
      #expect(catalog.heldNodes == 1)
      let copy = try crashCopy(dir)
      defer { try? FileManager.default.removeItem(at: copy) }
      let reopened = try openBatching(copy)
      #expect(reopened.replayedJournalEntries > 0)
      let stored = try reopened.read(user) { tx in
        (try tx.node(path: p("d", "kept")), try tx.node(id: gone.id))
      }
      #expect(stored.0 == f)
      #expect(stored.1 == nil)
      // A node made after the crash gets an id no held node had.
      let next = try reopened.write(user) { tx in try tx.createNode(path: p("d", "next")) }
      #expect(next.id > gone.id)
    }
  }

  @Test func aRolledBackBatchMakesHeldFilesAgainAsRows() throws {
    try withCatalog { catalog, _, d in
      let f = try fileWithContent(catalog, size: 3)
      #expect(catalog.heldNodes == 1)
      // A unit that fails after changing a row: the batch is rolled back and made again from
      // the journal, where the held file's changes are.
      catalog.failpoint = "updateNode.afterUpdate"
      #expect(throws: CatalogError.injectedFailure("updateNode.afterUpdate")) {
        try soon(catalog) { tx in
          var n = try tx.existingNode(id: d.id)
          n.mode = 0o700
          try tx.updateNode(n)
        }
      }
      catalog.failpoint = nil
      #expect(catalog.rebuiltBatches == 1)
      #expect(catalog.heldNodes == 0)
      #expect(try catalog.read(user) { tx in try tx.node(path: p("d", "f")) } == f)
      #expect(try catalog.read(user) { tx in try tx.existingNode(id: d.id).mode } == d.mode)
    }
  }

  /// A unit that fails after holding a file changes no row: undoing it drops the file, and
  /// the batch goes on.
  @Test func aFailedUnitDropsWhatItHeld() throws {
    try withCatalog { catalog, _, d in
      let kept = try file(catalog, d, "kept")
      catalog.failpoint = "createNode.afterInsert"
      #expect(throws: CatalogError.injectedFailure("createNode.afterInsert")) {
        try file(catalog, d, "lost")
      }
      catalog.failpoint = nil
      #expect(catalog.rebuiltBatches == 0)
      #expect(catalog.heldNodes == 1)
      try catalog.commitPending()
      let names = try catalog.read(user) { tx in
        (try tx.node(path: p("d", "kept")), try tx.node(path: p("d", "lost")))
      }
      #expect(names.0 == kept && names.1 == nil)
    }
  }

  @Test func aDirectoryAndItsFilesAreHeldTogether() throws {
    try withCatalog { catalog, _, d in
      let rows = try catalog.nodeRows()
      // mkdir, files in it, rm of them, rmdir: no row.
      let e = try file(catalog, d, "e", kind: .directory)
      let f = try file(catalog, e, "f")
      let g = try file(catalog, e, "g")
      #expect(catalog.heldNodes == 3)
      #expect(try catalog.read(user) { tx in try tx.hasChildren(e.id) })
      try soon(catalog) { tx in
        try tx.deleteNode(f.id)
        try tx.deleteNode(g.id)
      }
      #expect(try catalog.read(user) { tx in try tx.hasChildren(e.id) } == false)
      // Renamed in place, still held; then removed.
      try soon(catalog) { tx in _ = try tx.moveNode(e.id, toParent: d.id, name: "e2") }
      #expect(catalog.heldNodes == 1)
      try soon(catalog) { tx in try tx.deleteNode(e.id) }
      #expect(catalog.heldNodes == 0)
      #expect(try catalog.nodeRows() == rows)
      // A directory with files, then a listing: all inserted, parents and children alike.
      let h = try file(catalog, d, "h", kind: .directory)
      let i = try file(catalog, h, "i", kind: .directory)
      let j = try file(catalog, i, "j")
      #expect(catalog.heldNodes == 3)
      let listed = try catalog.read(user) { tx in
        (try tx.children(of: h.id), try tx.path(of: j.id), try tx.hasChildren(i.id))
      }
      #expect(listed.0 == [i] && listed.1 == p("d", "h", "i", "j") && listed.2)
      #expect(catalog.heldNodes == 0)
      #expect(try catalog.nodeRows() == rows + 3)
    }
  }

  /// A held directory moved to another parent, or one that has children deleted, goes
  /// through the rows (inserted first): the cycle check and the subtree need them.
  @Test func aHeldDirectoryMovedAwayIsInsertedFirst() throws {
    try withCatalog { catalog, _, d in
      let a = try file(catalog, d, "a", kind: .directory)
      let b = try file(catalog, d, "b", kind: .directory)
      let f = try file(catalog, b, "f")
      #expect(catalog.heldNodes == 3)
      // Into its own child: refused as a cycle, found through the rows.
      #expect(throws: CatalogError.cycle(nodeID: d.id, newParentID: a.id)) {
        try soon(catalog) { tx in _ = try tx.moveNode(d.id, toParent: a.id, name: "x") }
      }
      #expect(catalog.heldNodes == 0)
      let b2 = try file(catalog, a, "b2", kind: .directory)
      try soon(catalog) { tx in _ = try tx.moveNode(b2.id, toParent: b.id, name: "b2") }
      try soon(catalog) { tx in try tx.deleteNode(b.id) }
      let gone = try catalog.read(user) { tx in
        [try tx.node(id: b.id), try tx.node(id: f.id), try tx.node(id: b2.id)]
      }
      #expect(gone == [nil, nil, nil])
      try catalog.commitPending()
      #expect(try catalog.read(user) { tx in try tx.children(of: d.id) } == [a])
    }
  }

  /// After a reopen the cache knows no directory's names: a directory's first whole listing
  /// gives them, and new files in it are held from then on.
  @Test func aDirectoryListedAfterAReopenHoldsNewFiles() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    var d: Node
    do {
      let catalog: Catalog
      (catalog, d) = try makeCatalog(in: dir)
      for name in ["old1", "old2", "old3"] {
        _ = try catalog.write(user) { tx in try tx.createNode(path: p("d", name)) }
      }
    }
    let catalog = try openBatching(dir)
    func lookUpAbsent() throws -> Bool {
      let answered = catalog.absentNamesAnswered
      let found = try catalog.read(user) { tx in try tx.children(of: d.id, sharingNameWith: "x") }
      #expect(found == [])
      return catalog.absentNamesAnswered == answered + 1
    }
    _ = try file(catalog, d, "before")
    #expect(catalog.heldNodes == 0)
    #expect(try lookUpAbsent() == false)
    // A listing cut short by its limit tells nothing.
    _ = try catalog.read(user) { tx in try tx.children(of: d.id, limit: 2) }
    #expect(try lookUpAbsent() == false)
    let names = try catalog.read(user) { tx in try tx.children(of: d.id).map(\.name) }
    #expect(names == ["old1", "old2", "old3", "before"])
    #expect(try lookUpAbsent())
    _ = try file(catalog, d, "after")
    #expect(catalog.heldNodes == 1)
    // Names already there are refused as before.
    #expect(throws: CatalogError.self) { try file(catalog, d, "OLD2") }
  }
}
