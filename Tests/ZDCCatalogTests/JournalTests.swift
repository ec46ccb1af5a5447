import Foundation
import GRDB
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// The redo journal: `.soon` writes survive a crash of the process before their batch commits.
///
/// A crash is simulated by copying the catalog's files (database, write-ahead log, journal) while
/// a batch is still open — what a `kill -9` would leave on disk — and opening the copy.
@Suite struct JournalTests {
  let user = "alice"

  func open(_ dir: URL) throws -> Catalog { try openBatching(dir) }

  struct Snapshot: Equatable {
    var nodes: [Node]
    var operations: [String]
    var tags: [String]
  }

  /// Every node of the home tree, the push queue (see `queueSummary`) and the tags.
  func snapshot(_ catalog: Catalog) throws -> Snapshot {
    let (nodes, tags) = try catalog.read(user) { tx -> ([Node], [String]) in
      var nodes: [Node] = []
      var stack = [try #require(try tx.trunkNode(.home)).id]
      while let id = stack.popLast() {
        for c in try tx.children(of: id) {
          nodes.append(c)
          stack.append(c.id)
        }
      }
      nodes.sort { $0.id < $1.id }
      var tags: [String] = []
      for n in nodes {
        for (k, v) in try tx.tags(forNodeID: n.id).sorted(by: { $0.key < $1.key }) {
          tags.append("\(n.id) \(k) \(v)")
        }
      }
      return (nodes, tags)
    }
    // The operations as a set with their dependencies: the ids of operations that new nodes
    // queue when their batch commits (see `DeferredUploadTests`) follow the ones queued later.
    return Snapshot(nodes: nodes, operations: try queueSummary(catalog, user), tags: tags)
  }

  /// Creates a file under home in a `.soon` write.
  func soonCreate(_ catalog: Catalog, _ name: String) throws {
    try catalog.write(user, commit: .soon) { tx in _ = try tx.createNode(path: p(name)) }
  }

  /// Which of `names` (under home) a catalog has.
  func present(_ catalog: Catalog, _ names: [String]) throws -> [String] {
    try catalog.read(user) { tx in try names.filter { try tx.node(path: p($0)) != nil } }
  }

  /// Makes changes of every journaled kind in `.soon` writes; returns how many writes.
  func soonChanges(_ catalog: Catalog, tag: String) throws -> Int {
    let d = try catalog.write(user) { try $0.createNode(path: p("d-\(tag)"), kind: .directory) }
    var writes = 0
    func soon(_ body: (CloudTransaction) throws -> Void) throws {
      try catalog.write(user, commit: .soon, body)
      writes += 1
    }
    var a = Node(
      uuid: "", localUserID: user, parentID: d.id, name: "a \(tag).txt", kind: .file,
      shareList: .owner(user), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "", cloudID: "",
      mode: 0o640, mtime: FileTime(seconds: 1_700_000_000, nanoseconds: 7))
    try soon { tx in a = try tx.createNode(a) }
    try soon { tx in _ = try tx.createNode(path: p("d-\(tag)", "b"), kind: .symlink) }
    try soon { tx in
      var n = try tx.existingNode(id: a.id)
      n.mode = 0o600
      n.mtime = FileTime(seconds: 1_800_000_000, nanoseconds: 9)
      n.xattrs["user.k"] = Data("v".utf8)
      n.dataSize = 12345
      try tx.updateNode(n)
      try tx.queueDataUpload(nodeID: n.id)
      try tx.setTag(.data(Data([1, 2, 3])), forNodeID: n.id, identifier: "zdcfs.meta")
    }
    try soon { tx in
      let b = try #require(try tx.node(path: p("d-\(tag)", "b")))
      try tx.moveNode(b.id, toParent: try #require(try tx.trunkNode(.home)).id, name: "c-\(tag)")
    }
    try soon { tx in
      let x = try tx.createNode(path: p("d-\(tag)", "x"))
      try tx.setTag(.string("s"), forNodeID: x.id, identifier: "t")
      try tx.deleteNode(x.id)
    }
    try soon { tx in try tx.setTag(nil, forNodeID: a.id, identifier: "zdcfs.meta") }
    // What close(2) of written files stores: a new file's first content, and new content of a
    // file with its mtime unchanged.
    try soon { tx in
      let e = try tx.createNode(path: p("d-\(tag)", "e"))
      try tx.commitData(
        nodeID: e.id, size: 77, mtime: FileTime(seconds: 1_900_000_000, nanoseconds: 3))
    }
    try soon { tx in try tx.commitData(nodeID: a.id, size: 54321, mtime: nil) }
    return writes
  }

  @Test func soonWritesSurviveACrashBeforeTheirCommit() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    let writes = try soonChanges(catalog, tag: "1")
    let expected = try snapshot(catalog)
    #expect(expected.nodes.count == 4)
    #expect(expected.operations.contains { $0.hasPrefix("putData") })
    try catalog.read(user) { tx in
      let e = try #require(try tx.node(path: p("d-1", "e")))
      #expect(e.dataSize == 77 && e.mtime == FileTime(seconds: 1_900_000_000, nanoseconds: 3))
      let a = try #require(try tx.node(path: p("d-1", "a 1.txt")))
      #expect(a.dataSize == 54321 && a.mtime == FileTime(seconds: 1_800_000_000, nanoseconds: 9))
      #expect(
        try tx.allOperations().filter { $0.nodeID == e.id }.map(\.kind) == [.putRcrd, .putData])
    }

    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    do {
      // Without the journal, the copy holds only what was committed.
      let raw = try DatabaseQueue(path: copy.appendingPathComponent("catalog.sqlite").path)
      #expect(try raw.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM nodes") } == 5)
    }
    do {
      let reopened = try open(copy)
      #expect(reopened.replayedJournalEntries == writes)
      #expect(reopened.failedJournalEntries == 0)
      // The same nodes (ids, keys, cloudIDs, attributes), the same push queue and tags.
      #expect(try snapshot(reopened) == expected)
    }
    // Replayed once: the next open finds nothing to do.
    let again = try open(copy)
    #expect(again.replayedJournalEntries == 0)
    #expect(try snapshot(again) == expected)
  }

  /// A process that starts on a catalog whose batches were committed (the journal emptied)
  /// numbers its journal entries after the last committed one: a crash then makes them again
  /// (they were numbered from 1 again, which the replay took for committed, and dropped).
  @Test func writesOfALaterProcessSurviveACrash() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    do {
      let first = try open(dir)
      try first.createLocalUser(makeUser(user))
      for i in 0..<3 {
        try first.write(user, commit: .soon) { tx in _ = try tx.createNode(path: p("old\(i)")) }
      }
      try first.commitPending()
    }
    // As a commit leaves it once the journal has grown past its threshold: empty.
    let redo = dir.appendingPathComponent("catalog.sqlite.redo").path
    #expect(truncate(redo, 0) == 0)
    let second = try open(dir)
    #expect(second.replayedJournalEntries == 0)
    let f = try second.write(user, commit: .soon) { tx in try tx.createNode(path: p("new")) }
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == 1)
    #expect(try reopened.read(user) { tx in try tx.node(path: p("new"))?.id } == f.id)
  }

  /// Removing a tag a node does not have changes nothing and is not journaled (a rename of a
  /// file removes its conflict tag every time); removing one it has is, and survives a crash.
  @Test func removingAnAbsentTagJournalsNothing() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    let f = try catalog.write(user) { tx in
      let f = try tx.createNode(path: p("f"))
      try tx.setTag(.int(1), forNodeID: f.id, identifier: "t")
      return f.id
    }
    let journal = dir.appendingPathComponent("catalog.sqlite.redo")
    let before = try Data(contentsOf: journal).count
    try catalog.write(user, commit: .soon) { tx in
      try tx.setTag(nil, forNodeID: f, identifier: "absent")
    }
    #expect(try Data(contentsOf: journal).count == before)
    try catalog.write(user, commit: .soon) { tx in
      try tx.setTag(nil, forNodeID: f, identifier: "t")
    }
    #expect(try Data(contentsOf: journal).count > before)
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == 1)
    #expect(try reopened.read(user) { try $0.tags(forNodeID: f) }.isEmpty)
  }

  @Test func committedBatchesAreNotReplayed() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    _ = try soonChanges(catalog, tag: "1")
    try catalog.commitPending()
    let writes = try soonChanges(catalog, tag: "2")
    let expected = try snapshot(catalog)
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == writes)
    #expect(try snapshot(reopened) == expected)
  }

  /// An `fsync` makes the journal durable instead of committing the batch
  /// (`Catalog.prepareDurable`): it is lengthened with zeros, which a reopen after a crash takes
  /// for room, not damage; entries made after it, and a torn one in that room, are read as
  /// before.
  @Test func aJournalLengthenedForItsFlushReplaysEveryEntry() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    try catalog.makeDurable()
    var writes = 0
    for i in 0..<8 {
      try soonCreate(catalog, "first \(i)")
      writes += 1
    }
    try catalog.makeDurable()
    #expect(catalog.hasOpenBatch)
    let journal = dir.appendingPathComponent("catalog.sqlite.redo")
    let length = try #require(
      try FileManager.default.attributesOfItem(atPath: journal.path)[.size] as? Int)
    #expect(length % (1 << 20) == 0)
    for i in 0..<8 {
      try soonCreate(catalog, "second \(i)")
      writes += 1
    }
    try catalog.makeDurable()
    try soonCreate(catalog, "last")
    writes += 1
    let expected = try snapshot(catalog)
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    // The room after the entries is still zeros: the journal's length did not change.
    #expect(try FileManager.default.attributesOfItem(atPath: journal.path)[.size] as? Int == length)
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == writes)
    #expect(reopened.failedJournalEntries == 0)
    #expect(try snapshot(reopened) == expected)

    // A torn last entry in the room: the entries before it are made again.
    let torn = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: torn) }
    let handle = try FileHandle(forUpdating: torn.appendingPathComponent("catalog.sqlite.redo"))
    let bytes = try handle.readToEnd() ?? Data()
    // The last entry ends where the zeros begin: its checksum's last non-zero byte changed.
    let last = try #require(bytes.lastIndex(where: { $0 != 0 }))
    try handle.seek(toOffset: UInt64(last))
    try handle.write(contentsOf: Data([bytes[last] ^ 0x01]))
    try handle.close()
    let again = try open(torn)
    #expect(again.replayedJournalEntries == writes - 1)
    #expect(try present(again, ["last"]) == [])
  }

  @Test func aTornLastEntryIsDropped() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    try soonCreate(catalog, "kept")
    try soonCreate(catalog, "torn")
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let journal = copy.appendingPathComponent("catalog.sqlite.redo")
    let bytes = try Data(contentsOf: journal)
    try bytes.dropLast(5).write(to: journal)
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == 1)
    #expect(try present(reopened, ["kept", "torn"]) == ["kept"])
  }

  @Test func aDamagedEntryStopsTheReplayThere() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    try soonCreate(catalog, "one")
    let firstEnd = try Data(
      contentsOf: dir.appendingPathComponent("catalog.sqlite.redo")
    ).count
    try soonCreate(catalog, "two")
    try soonCreate(catalog, "three")
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let journal = copy.appendingPathComponent("catalog.sqlite.redo")
    var bytes = try Data(contentsOf: journal)
    bytes[firstEnd + 20] ^= 0xFF  // inside the second entry
    try bytes.write(to: journal)
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == 1)
    #expect(try present(reopened, ["one", "two", "three"]) == ["one"])
  }

  @Test func aCatalogWhoseJournalIsHeldElsewhereCommitsAtOnce() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let first = try open(dir)
    try first.createLocalUser(makeUser(user))
    // A second opener (as another process would be) cannot take the journal.
    let second = try open(dir)
    try second.write(user, commit: .soon) { tx in _ = try tx.createNode(path: p("now")) }
    let raw = try DatabaseQueue(path: dir.appendingPathComponent("catalog.sqlite").path)
    #expect(
      try raw.read { try Int.fetchOne($0, sql: "SELECT COUNT(*) FROM nodes WHERE name = 'now'") }
        == 1)
  }

  @Test func aFailedUnitLeavesNothingInTheJournal() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    struct Stop: Error {}
    #expect(throws: Stop.self) {
      try catalog.write(user, commit: .soon) { tx in
        _ = try tx.createNode(path: p("rolled back"))
        throw Stop()
      }
    }
    // A mutator that failed inside a unit that went on is not recorded either.
    try catalog.write(user, commit: .soon) { tx in
      _ = try tx.createNode(path: p("x"))
      #expect(throws: CatalogError.self) { try tx.createNode(path: p("X")) }
    }
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    let reopened = try open(copy)
    #expect(reopened.replayedJournalEntries == 1)
    #expect(reopened.failedJournalEntries == 0)
    #expect(try present(reopened, ["rolled back", "x"]) == ["x"])
  }
}
