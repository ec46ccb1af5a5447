import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCTestSupport

/// New nodes created by `.soon` writes queue their first uploads when something asks for their
/// operations or the push takes settled work, not when their batch commits (which stores them):
/// a file that lives a moment queues nothing, and what is queued in the end is what queuing at
/// once would have queued, across commits, reopenings and crashes.
@Suite struct DeferredUploadTests {
  let user = "alice"

  func open(_ dir: URL) throws -> Catalog { try openBatching(dir) }

  func withCatalog(_ body: (Catalog, URL) throws -> Void) throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir)
    try catalog.createLocalUser(makeUser(user))
    try body(catalog, dir)
  }

  func home(_ catalog: Catalog) throws -> NodeID {
    try catalog.read(user) { tx in try #require(try tx.trunkNode(.home)).id }
  }

  @Test func aFileThatLivesAMomentQueuesNothing() throws {
    try withCatalog { catalog, _ in
      let home = try home(catalog)
      let f = try catalog.write(user, commit: .soon) { tx in
        try tx.createNode(path: p("tmp"))
      }
      #expect(catalog.deferredFirstUploads == 1)
      try catalog.write(user, commit: .soon) { tx in
        _ = try tx.commitData(nodeID: f.id, size: 12, mtime: FileTime(seconds: 5, nanoseconds: 0))
      }
      try catalog.write(user, commit: .soon) { tx in
        _ = try tx.moveNode(f.id, toParent: home, name: "tmp2")
      }
      #expect(try catalog.queuedOperationRows() == 0)
      try catalog.write(user, commit: .soon) { tx in try tx.deleteNode(f.id) }
      #expect(catalog.deferredFirstUploads == 0)
      try catalog.commitPending()
      #expect(try catalog.queuedOperationRows() == 0)
      #expect(try queueSummary(catalog, user) == [])
    }
  }

  /// A directory `d` and a file `d/f` with committed content, made by one `.soon` write.
  func makeDirectoryWithFile(_ catalog: Catalog) throws -> (Node, Node) {
    try catalog.write(user, commit: .soon) { tx in
      let d = try tx.createNode(path: p("d"), kind: .directory)
      let f = try tx.createNode(path: p("d", "f"))
      _ = try tx.commitData(nodeID: f.id, size: 3, mtime: nil)
      return (d, f)
    }
  }

  /// The push counts the queue for its progress every 0.2 s, while a copy runs: the count
  /// takes the deferred first uploads for the operations they stand for and queues none.
  @Test func aCountOfTheQueueQueuesNothing() throws {
    try withCatalog { catalog, _ in
      let (d, f) = try makeDirectoryWithFile(catalog)
      // On the writer (the batch is open), then after the commit, and from a reader.
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == 3)
      try catalog.commitPending()
      #expect(try catalog.read(user, onWriter: true) { tx in try tx.operationCount() } == 3)
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == 3)
      #expect(catalog.deferredFirstUploads == 2)
      #expect(try catalog.queuedOperationRows() == 0)
      // Nor does a full scan's read of the moves (a node whose first upload waits has none).
      #expect(try catalog.read(user) { tx in try tx.moveOperations() }.isEmpty)
      #expect(catalog.deferredFirstUploads == 2)
      // Another user's count leaves them out.
      try catalog.createLocalUser(makeUser("bob"))
      #expect(try catalog.read("bob") { tx in try tx.operationCount() } == 0)
      // Queued, they count the same.
      let all = try catalog.write(user) { tx in try tx.allOperations() }
      #expect(Set(all.map(\.nodeID)) == [d.id, f.id])
      #expect(catalog.deferredFirstUploads == 0)
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == 3)
    }
  }

  @Test func theCommitStoresWhatIsLeftForThePushToQueue() throws {
    try withCatalog { catalog, _ in
      let (d, f) = try makeDirectoryWithFile(catalog)
      let made = Date()
      #expect(catalog.deferredFirstUploads == 2)
      #expect(try catalog.queuedOperationRows() == 0)
      try catalog.commitPending()
      // Stored, not queued: a reader counts them (an RCRD each, a DATA for f) as dirty work.
      #expect(catalog.deferredFirstUploads == 2)
      #expect(try catalog.queuedOperationRows() == 0)
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == 3)
      #expect(try catalog.read(user) { tx in try tx.isDirty(nodeID: f.id) })
      // The push, busy user: nothing has settled for five minutes, nothing is queued.
      let busy = try catalog.write(user) { tx in
        try tx.readyOperations(limit: 10, settledBefore: Date().addingTimeInterval(-300))
      }
      #expect(busy.isEmpty)
      #expect(try catalog.queuedOperationRows() == 0)
      // Quiet: the push's query queues them (parents first), as queued when the nodes last
      // changed — settled as of then, as at their batch's commit —, and finds the directory's.
      Thread.sleep(forTimeInterval: 0.01)
      let ready = try catalog.write(user) { tx in
        try tx.readyOperations(limit: 10, now: Date.distantFuture, settledBefore: made)
      }
      #expect(ready.map(\.nodeID) == [d.id])
      #expect(catalog.deferredFirstUploads == 0)
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == 3)
      #expect(
        try queueSummary(catalog, user) == [
          "putData \(f.id) pending after [putRcrd \(f.id)]",
          "putRcrd \(d.id) pending after []",
          "putRcrd \(f.id) pending after [putRcrd \(d.id)]",
        ])
    }
  }

  /// The push's query queues deferred uploads a slice at a time, oldest nodes first (after a
  /// copy of many files, the writer is not held for seconds); a count counts the rest, and a
  /// read of the whole queue queues them all.
  @Test func thePushQueuesDeferredUploadsASliceAtATime() throws {
    try withCatalog { catalog, _ in
      let n = 1_100
      let ids = try catalog.write(user, commit: .soon) { tx in
        try (0..<n).map { try tx.createNode(path: p("f\($0)")).id }
      }
      try catalog.commitPending()
      let first = try catalog.write(user) { tx in
        try tx.readyOperations(limit: 5, now: Date.distantFuture, settledBefore: Date())
      }
      #expect(first.map(\.nodeID) == Array(ids.prefix(5)))
      #expect(catalog.deferredFirstUploads == n - 1_024)
      #expect(try catalog.queuedOperationRows() == 1_024)
      // A reader counts the queued and the stored alike.
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == n)
      #expect(try catalog.read(user, onWriter: true) { tx in try tx.operationCount() } == n)
      #expect(catalog.deferredFirstUploads == n - 1_024)
      #expect(try catalog.write(user) { tx in try tx.allOperations() }.count == n)
      #expect(catalog.deferredFirstUploads == 0)
    }
  }

  @Test func askingForANodesOperationsQueuesItsUploadAndItsParentsFirst() throws {
    try withCatalog { catalog, _ in
      let (d, f) = try catalog.write(user, commit: .soon) { tx in
        (
          try tx.createNode(path: p("d"), kind: .directory),
          try tx.createNode(path: p("d", "f"))
        )
      }
      let kinds = try catalog.read(user) { tx in try tx.pendingOperations(forNodeID: f.id) }
        .map(\.kind)
      #expect(kinds == [.putRcrd])
      #expect(catalog.deferredFirstUploads == 0)
      #expect(
        try queueSummary(catalog, user) == [
          "putRcrd \(d.id) pending after []",
          "putRcrd \(f.id) pending after [putRcrd \(d.id)]",
        ])
      // A node whose first upload is deferred is dirty, and counts in the queue.
      let g = try catalog.write(user, commit: .soon) { tx in try tx.createNode(path: p("g")) }
      #expect(try catalog.read(user) { tx in try tx.isDirty(nodeID: g.id) })
      let h = try catalog.write(user, commit: .soon) { tx in try tx.createNode(path: p("h")) }
      #expect(try catalog.read(user) { tx in try tx.operationCount() } == 4)
      #expect(try catalog.read(user) { tx in try tx.kinds(h.id) } == [.putRcrd])
    }
  }

  @Test func aCrashBeforeTheCommitQueuesTheUploadsWhenTheJournalIsReplayed() throws {
    try withCatalog { catalog, dir in
      let f = try catalog.write(user, commit: .soon) { tx in
        let f = try tx.createNode(path: p("f"))
        _ = try tx.commitData(nodeID: f.id, size: 9, mtime: nil)
        return f
      }
      #expect(try catalog.queuedOperationRows() == 0)
      let copy = try crashCopy(dir)
      defer { try? FileManager.default.removeItem(at: copy) }
      let reopened = try open(copy)
      #expect(reopened.replayedJournalEntries == 1)
      #expect(
        try queueSummary(reopened, user) == [
          "putData \(f.id) pending after [putRcrd \(f.id)]",
          "putRcrd \(f.id) pending after []",
        ])
    }
  }

  @Test func aFailedUnitLeavesTheDeferredUploadsAsTheyWere() throws {
    try withCatalog { catalog, _ in
      let f = try catalog.write(user, commit: .soon) { tx in try tx.createNode(path: p("f")) }
      // Content committed with the size and mtime the node has (no row changes), then the unit
      // fails: no DATA upload.
      struct Stop: Error {}
      #expect(throws: Stop.self) {
        try catalog.write(user, commit: .soon) { tx in
          let n = try tx.existingNode(id: f.id)
          _ = try tx.commitData(nodeID: f.id, size: n.dataSize, mtime: n.mtime)
          throw Stop()
        }
      }
      #expect(catalog.deferredFirstUploads == 1)
      try catalog.commitPending()
      #expect(try queueSummary(catalog, user) == ["putRcrd \(f.id) pending after []"])
      // A unit that fails after deleting a deferred node's row: the batch is made again from
      // the journal (which queues the upload at once).
      let g = try catalog.write(user, commit: .soon) { tx in try tx.createNode(path: p("g")) }
      catalog.failpoint = "deleteNode.afterDelete"
      #expect(throws: CatalogError.self) {
        try catalog.write(user, commit: .soon) { tx in try tx.deleteNode(g.id) }
      }
      catalog.failpoint = nil
      #expect(catalog.rebuiltBatches == 1)
      #expect(catalog.deferredFirstUploads == 0)
      #expect(try catalog.queuedOperationRows() == 2)
      try catalog.commitPending()
      #expect(
        try queueSummary(catalog, user) == [
          "putRcrd \(f.id) pending after []", "putRcrd \(g.id) pending after []",
        ])
    }
  }

  /// Random changes made in `.soon` writes (deferring) and in `.now` writes (queuing at once)
  /// of two catalogs end with the same queue, uploads and all.
  @Test(arguments: 1...12)
  func deferredAndImmediateQueuesAgree(seed: UInt64) throws {
    var dirA = try tempDir()
    let dirB = try tempDir()
    defer {
      try? FileManager.default.removeItem(at: dirA)
      try? FileManager.default.removeItem(at: dirB)
    }
    var a: Catalog! = try open(dirA)
    let b = try open(dirB)
    let u = makeUser(user)
    try a.createLocalUser(u)
    try b.createLocalUser(u)
    var rng = SplitMix64(seed: seed)
    let home = try self.home(a)
    #expect(try self.home(b) == home)
    var dirs: [NodeID] = [home]
    var files: [NodeID] = []
    var serial = 0
    /// The same change in both catalogs: `.soon` in `a`, `.now` in `b`; both fail or neither.
    func both<T: Equatable>(_ body: (CloudTransaction) throws -> T) {
      let ra = Result(catching: { try a.write(user, commit: .soon, body) })
      let rb = Result(catching: { try b.write(user, commit: .now, body) })
      switch (ra, rb) {
      case (.success(let x), .success(let y)): #expect(x == y, "seed \(seed)")
      case (.failure, .failure): break
      default: Issue.record("seed \(seed): \(ra) against \(rb)")
      }
    }
    for step in 0..<120 {
      serial += 1
      let pick = Int.random(in: 0..<100, using: &rng)
      switch pick {
      case 0..<35:
        // A directory or a file.
        let directory = pick < 12
        let parent = dirs.randomElement(using: &rng)!
        both { tx -> NodeID in
          let n = try tx.createNode(
            Node(
              uuid: "", localUserID: user, parentID: parent,
              name: directory ? "d\(serial)" : "f\(serial)", kind: directory ? .directory : .file,
              shareList: .owner(user), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
              cloudID: "", mode: 0o755, mtime: FileTime(seconds: 1, nanoseconds: 0)))
          return n.id
        }
        if let id = try a.read(user, { tx in try tx.children(of: parent).last?.id }) {
          if directory { dirs.append(id) } else { files.append(id) }
        }
      case 35..<55 where !files.isEmpty:
        let f = files.randomElement(using: &rng)!
        let size = UInt64.random(in: 0...3, using: &rng)
        both { tx in
          try tx.commitData(
            nodeID: f, size: size, mtime: FileTime(seconds: Int64(step), nanoseconds: 0)
          )
          .dataSize
        }
      case 55..<65:
        let all = dirs.dropFirst() + files
        guard let n = all.randomElement(using: &rng) else { break }
        let to = Bool.random(using: &rng) ? nil : dirs.randomElement(using: &rng)!
        both { tx -> NodeID? in
          let node = try tx.existingNode(id: n)
          return try tx.moveNode(n, toParent: to ?? node.parentID!, name: "m\(serial)").parentID
        }
      case 65..<72:
        let all = dirs.dropFirst() + files
        guard let n = all.randomElement(using: &rng) else { break }
        let mode = UInt32.random(in: 0o600...0o777, using: &rng)
        both { tx in
          var node = try tx.existingNode(id: n)
          node.mode = mode
          return try tx.updateNode(node).mode
        }
      case 72..<80:
        let all = dirs.dropFirst() + files
        guard let n = all.randomElement(using: &rng) else { break }
        both { tx -> Bool in
          try tx.deleteNode(n)
          return true
        }
        let left = try a.read(user) { tx in
          Set(try (dirs + files).filter { try tx.node(id: $0) != nil })
        }
        dirs = dirs.filter(left.contains)
        files = files.filter(left.contains)
      case 80..<86:
        // Uploads: everything queued is uploaded, in both.
        try a.write(user) { tx in try tx.drainQueue() }
        try b.write(user) { tx in try tx.drainQueue() }
      case 86..<93:
        // Something asks for one node's operations (a pull, the state xattr).
        guard let n = (dirs.dropFirst() + files).randomElement(using: &rng) else { break }
        let ka = try a.read(user, onWriter: true) { tx in try tx.kinds(n) }
        let kb = try b.read(user, onWriter: true) { tx in try tx.kinds(n) }
        #expect(ka.sorted { $0.rawValue < $1.rawValue } == kb.sorted { $0.rawValue < $1.rawValue })
      case 93..<96:
        // The process ends and starts again: what was deferred is stored.
        a = nil
        a = try open(dirA)
      case 96..<98:
        // A crash: the open batch comes back from the journal, the rest from the table.
        let copy = try crashCopy(dirA)
        a = nil
        try? FileManager.default.removeItem(at: dirA)
        dirA = copy
        a = try open(dirA)
      default:
        try a.commitPending()
      }
    }
    try a.commitPending()
    // Through a reader: the count includes the stored deferred uploads.
    #expect(
      try a.read(user) { tx in try tx.operationCount() }
        == b.read(user) { tx in try tx.operationCount() }, "seed \(seed)")
    #expect(try queueSummary(a, user) == queueSummary(b, user), "seed \(seed)")
    #expect(a.deferredFirstUploads == 0)
    try a.write(user) { tx in try tx.drainQueue() }
    try b.write(user) { tx in try tx.drainQueue() }
    #expect(try queueSummary(a, user) == [])
    #expect(try queueSummary(b, user) == [])
  }
}
