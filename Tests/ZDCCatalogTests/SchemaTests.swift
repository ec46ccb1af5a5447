import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCSQLite

@Suite struct SchemaTests {
  @Test func migrationsAppliedAndReopen() throws {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
      "zdc-schema-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }
    let path = dir.appendingPathComponent("catalog.sqlite").path

    #expect(Catalog.knownMigrations == ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"])
    var nodeID: NodeID = 0
    do {
      let catalog = try Catalog(path: path)
      #expect(try catalog.appliedMigrations() == ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"])
      #expect(try catalog.pragma("journal_mode") == "wal")
      #expect(try catalog.pragma("synchronous") == "2")  // FULL
      // The catalog keeps references consistent itself (see `referencesStayConsistent`).
      #expect(try catalog.pragma("foreign_keys") == "0")
      try catalog.createLocalUser(makeUser("alice"))
      nodeID = try catalog.write("alice") { try $0.createNode(path: p("a")).id }
    }
    let reopened = try Catalog(path: path)
    #expect(try reopened.appliedMigrations() == ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"])
    let node = try reopened.read("alice") { try $0.node(path: p("a")) }
    #expect(node?.id == nodeID)
    #expect(try reopened.read("alice") { try $0.operationCount() } == 1)

    let normal = try Catalog(path: path, options: .init(durability: .normal))
    #expect(try normal.pragma("synchronous") == "1")  // NORMAL
  }

  /// Making the catalog durable flushes only what a change since the last flush left to
  /// flush: the write-ahead log for commits the redo journal does not hold (never the database
  /// file: a checkpoint flushes it itself), else the journal alone, for `.soon` writes, whose
  /// batch stays open (an `fsync` through the mount costs no commit).
  @Test func makeDurableFlushesTheLogOnlyAfterAChange() throws {
    let catalog = try Catalog.temporary(options: .init(durability: .normal))
    try catalog.createLocalUser(makeUser("alice"))
    let (wal, redo) = try logPaths(catalog)
    let first = try catalog.prepareDurable()
    #expect(first.paths == [wal] && first.dataOnly.isEmpty)
    try LocalDurability.sync(paths: first.paths)
    first.done()
    // The log was lengthened with room for the next commits, its size flushed with it.
    #expect(try size(wal) > 0 && size(wal) % (1 << 20) == 0)
    #expect(try catalog.prepareDurable().isEmpty)

    // `.soon` writes: the redo journal holds them, and it is flushed instead of the log, the
    // batch left open; lengthened with room too, the first time.
    let batches = catalog.committedBatches
    try catalog.write("alice", commit: .soon) { _ = try $0.createNode(path: p("a")) }
    let second = try catalog.prepareDurable()
    #expect(second.paths == [redo] && second.dataOnly.isEmpty)
    #expect(catalog.hasOpenBatch && catalog.committedBatches == batches)
    try LocalDurability.sync(paths: second.paths)
    second.done()
    #expect(try size(redo) % (1 << 20) == 0)
    #expect(try catalog.prepareDurable().isEmpty)
    // An entry that fits: only the journal's data needs to reach stable storage, through a
    // descriptor of its own held from then on.
    try catalog.write("alice", commit: .soon) { _ = try $0.createNode(path: p("b")) }
    let third = try catalog.prepareDurable()
    #expect(third.paths.isEmpty && third.dataOnly.count == 1)
    #expect(sameFile(redo, third.dataOnly.first?.fd))
    try LocalDurability.sync(paths: [], dataOnlyDescriptors: third.dataOnly.map(\.descriptor))
    third.done()
    // The batch's commit holds journaled writes only: still nothing to flush.
    try catalog.commitPending()
    #expect(try catalog.prepareDurable().isEmpty)

    // A `.now` write is not in the journal: the batch commits and the log (held open, with
    // room) needs its data written.
    try catalog.write("alice", commit: .soon) { _ = try $0.createNode(path: p("c")) }
    try catalog.write("alice") { _ = try $0.createNode(path: p("d")) }
    let fourth = try catalog.prepareDurable()
    #expect(fourth.paths.isEmpty && fourth.dataOnly.count == 1)
    #expect(sameFile(wal, fourth.dataOnly.first?.fd))
    #expect(!catalog.hasOpenBatch)
    try LocalDurability.sync(paths: [], dataOnlyDescriptors: fourth.dataOnly.map(\.descriptor))
    fourth.done()
    // That flush covered the journal's entries too.
    #expect(try catalog.prepareDurable().isEmpty)
    try catalog.write("alice", commit: .soon) { _ = try $0.createNode(path: p("e")) }
    try catalog.makeDurable()
    #expect(try catalog.prepareDurable().isEmpty)
  }

  /// A redo journal past its size threshold is emptied at the next commit without a flush of
  /// the log on the writer, unless an `fsync` may rely on its entries: the flush is then owed to
  /// the next `fsync`, and a crash of the process loses none of the commits.
  @Test func theJournalIsEmptiedWithoutAFlushUnlessAnFsyncReliesOnIt() throws {
    let catalog = try Catalog.temporary(options: .init(durability: .normal))
    try catalog.createLocalUser(makeUser("alice"))
    let (wal, redo) = try logPaths(catalog)
    func isLog(_ flush: PendingFlush) -> Bool {
      flush.paths == [wal] || sameFile(wal, flush.dataOnly.first?.fd)
    }
    let id = try catalog.write("alice") { try $0.createNode(path: p("n")).id }
    try catalog.makeDurable()
    /// `.soon` writes until the journal passes its threshold; their batch left open.
    func fillJournal(_ round: Int) throws {
      for i in 0..<80 {
        try catalog.write("alice", commit: .soon) { tx in
          try tx.setTag(
            .data(Data(repeating: UInt8(i), count: 16 << 10)), forNodeID: id,
            identifier: "t\(round).\(i)")
        }
      }
      #expect(try size(redo) >= 1 << 20)
    }

    // No `fsync` relied on the entries: emptied at the commit, the log's flush left to the next
    // `fsync` (the journal no longer holds the commits).
    try fillJournal(1)
    try catalog.commitPending()
    #expect(try size(redo) == 0)
    let owed = try catalog.prepareDurable()
    #expect(isLog(owed))
    try LocalDurability.sync(
      paths: owed.paths, dataOnlyDescriptors: owed.dataOnly.map(\.descriptor))
    owed.done()
    #expect(try catalog.prepareDurable().isEmpty)

    // An `fsync` flushed entries: the commit flushes the log before it empties the journal.
    try fillJournal(2)
    try catalog.makeDurable()
    try catalog.write("alice", commit: .soon) { tx in
      try tx.setTag(.int(1), forNodeID: id, identifier: "last")
    }
    try catalog.commitPending()
    #expect(try size(redo) == 0)
    #expect(try catalog.prepareDurable().isEmpty)

    // What a crash of the process leaves (the log as written) holds every commit.
    let dir = try #require(
      catalog.path.map { URL(fileURLWithPath: $0).deletingLastPathComponent() })
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let reopened = try Catalog(path: copy.appendingPathComponent("catalog.sqlite").path)
    let tags = try reopened.read("alice") { try $0.tags(forNodeID: id) }
    #expect(tags.count == 161)
  }

  /// A log lengthened with zeros past its last frame (see `WALFlush`) loses nothing: a copy of
  /// the catalog taken while it is open (as a crash leaves it: no shared-memory index) reopens
  /// with every commit, also after the log outgrew the room it was given.
  @Test func aLengthenedLogKeepsEveryCommit() throws {
    let catalog = try Catalog.temporary(options: .init(durability: .normal))
    try catalog.createLocalUser(makeUser("alice"))
    let wal = try #require(catalog.path) + "-wal"
    var grew = Set<Int>()
    for batch in 0..<12 {
      try catalog.write("alice") { tx in
        for i in 0..<60 {
          var n = try tx.createNode(path: p("b\(batch)-\(i)"))
          n.xattrs["user.pad"] = Data(repeating: UInt8(i), count: 1500)
          _ = try tx.updateNode(n)
        }
      }
      try catalog.makeDurable()
      grew.insert(
        try #require(try FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int))
    }
    #expect(grew.count > 1)
    let copy = FileManager.default.temporaryDirectory.appendingPathComponent(
      "zdc-schema-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: copy, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: copy) }
    let path = copy.appendingPathComponent("catalog.sqlite").path
    try FileManager.default.copyItem(atPath: try #require(catalog.path), toPath: path)
    try FileManager.default.copyItem(atPath: wal, toPath: path + "-wal")
    let reopened = try Catalog(path: path)
    for batch in 0..<12 {
      let node = try reopened.read("alice") { try $0.node(path: p("b\(batch)-59")) }
      #expect(node != nil)
    }
    #expect(try reopened.pragma("integrity_check") == "ok")
  }

  /// Without foreign-key actions, deleting nodes, finishing and dropping operations and
  /// removing a user must leave no dangling reference behind, and an operation that waited for
  /// a finished or dropped one must become ready.
  @Test func referencesStayConsistent() throws {
    let catalog = try Catalog.temporary()
    try catalog.createLocalUser(makeUser("alice"))
    try catalog.createLocalUser(makeUser("bob"))
    for user in ["alice", "bob"] {
      try catalog.write(user) { tx in
        for d in 0..<5 {
          let dir = try tx.createNode(path: p("d\(d)"), kind: .directory)
          try tx.setTag(.int(Int64(d)), forNodeID: dir.id, identifier: "t")
          for f in 0..<5 {
            let file = try tx.createNode(path: p("d\(d)", "f\(f)"))
            try tx.setTag(.string("x"), forNodeID: file.id, identifier: "t")
            try tx.linkNodeID(file.id, toKey: "\(d)-\(f)", inCollection: "c")
            try tx.queueDataUpload(nodeID: file.id)
          }
        }
        // Half is uploaded; the rest stays queued with its dependencies.
        var done = 0
        for op in try tx.readyOperations(limit: 1000, now: .distantFuture) where done < 10 {
          try tx.markInFlight(op.id)
          try tx.completeAsUploaded(op)
          done += 1
        }
        // Deleting subtrees drops their pending operations and removes tags and links.
        try tx.deleteNode(try #require(try tx.node(path: p("d0"))).id)
        try tx.deleteNode(try #require(try tx.node(path: p("d1", "f2"))).id)
        _ = try tx.moveNode(
          try #require(try tx.node(path: p("d2"))).id,
          toParent: try #require(try tx.node(path: p("d3"))).id, name: "moved")
        try tx.drainQueue()
        #expect(try tx.operationCount() == 0)
      }
    }
    #expect(try catalog.foreignKeyViolations() == [:])
    let tagged = try catalog.read("alice") { try $0.nodeIDs(withTag: "t") }
    #expect(tagged.count == 5 * 6 - 6 - 1)

    try catalog.write("bob") { tx in
      try tx.createNode(path: p("late"))
      try tx.queueDataUpload(nodeID: try #require(try tx.node(path: p("late"))).id)
    }
    try catalog.deleteLocalUser(id: "bob")
    #expect(try catalog.foreignKeyViolations() == [:])
    #expect(try catalog.read("alice") { try $0.nodeIDs(withTag: "t") }.count == tagged.count)
  }

  /// Directory listings page through a parent's children in id order: an index must serve
  /// that order, or every page sorts the whole directory (quadratic listings).
  @Test func childrenPagesNeedNoSort() throws {
    let catalog = try Catalog.temporary()
    let plan = try catalog.queryPlan(CloudTransaction.childrenSQL)
    #expect(plan.contains { $0.contains("USING INDEX nodes_parent_id") })
    #expect(!plan.contains { $0.contains("TEMP B-TREE") })
  }

  @Test func nodeOperationsNeedNoSort() throws {
    let catalog = try Catalog.temporary()
    for sql in [CloudTransaction.nodeOperationsSQL, CloudTransaction.firstUploadSQL] {
      let plan = try catalog.queryPlan(sql)
      #expect(plan.contains { $0.contains("INDEX pushOperations_node ") }, "\(plan)")
      #expect(!plan.contains { $0.contains("TEMP B-TREE") }, "\(plan)")
    }
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

/// A catalog's write-ahead log and redo journal.
private func logPaths(_ catalog: Catalog) throws -> (wal: String, redo: String) {
  let path = try #require(catalog.path)
  return (path + "-wal", path + ".redo")
}

private func size(_ file: String) throws -> Int {
  try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
}

/// Whether `fd` is open on the file at `file`.
private func sameFile(_ file: String, _ fd: Int32?) -> Bool {
  var onDisk = stat()
  var held = stat()
  guard let fd else { return false }
  return stat(file, &onDisk) == 0 && fstat(fd, &held) == 0
    && onDisk.st_ino == held.st_ino && onDisk.st_dev == held.st_dev
}
