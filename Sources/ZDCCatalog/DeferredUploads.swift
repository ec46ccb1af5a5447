import Foundation
import GRDB
import Synchronization
import ZDCCore
import ZDCSQLite

/// New nodes whose first upload operations are not queued yet. They are queued when anything
/// asks for a push operation of theirs or reads the whole queue (the push's start), and by
/// the push manager once the user's activity has been quiet for a while (see
/// ``CloudTransaction/readyOperations(limit:now:settledBefore:)``) — not while a burst of file
/// operations runs, which then costs no upload operations, dependency rows or their indexes.
///
/// A file that lives a moment — a temporary file, an editor's swap file, `configure`'s test
/// programs — is created, written, renamed and removed before then: it costs its own rows
/// only, instead of queuing an RCRD and a DATA upload, rereading them at each change and
/// dropping them with their dependencies at the end.
///
/// The entries of committed nodes are kept in the `deferredUploads` table, so that they
/// survive the process: a batch's commit inserts the entries its units made, and a change of
/// an entry already in the table (its content committed, its uploads queued, its node
/// deleted) changes the row in the unit that makes it. The table is loaded at open by the
/// process that holds the catalog's journal. A count of the queue (progress, status, a sync's
/// wait: ``CloudTransaction/operationCount()``) takes the entries, or on other connections
/// the table's rows, for the uploads they stand for, and queues nothing.
///
/// Touched only on the writer connection. A rollback brings the entries back to what the last
/// commit left, and a unit that fails without changing a row undoes what it changed here.
final class DeferredUploads: Sendable {
  struct Entry: Sendable {
    var userID: String
    /// The node's content was committed (`commitData`): a DATA upload follows its RCRD.
    var data: Bool
    /// When the node was created or its content last committed (seconds since the reference
    /// date): its operations count as queued then.
    var since: Double
  }

  private struct State {
    var entries: [NodeID: Entry] = [:]
    /// The entries as the last commit left them (the table's rows).
    var committed: [NodeID: Entry] = [:]
    /// The ids changed since the last commit or rollback.
    var changed: Set<NodeID> = []
    /// What the current unit changed, oldest first: each id with its entry before.
    var undo: [(NodeID, Entry?)] = []
  }

  private let state = Mutex(State())

  var isEmpty: Bool { state.withLock { $0.entries.isEmpty } }

  var count: Int { state.withLock { $0.entries.count } }

  func entry(_ id: NodeID) -> Entry? { state.withLock { $0.entries[id] } }

  func contains(_ id: NodeID) -> Bool { state.withLock { $0.entries[id] != nil } }

  /// True when `id`'s entry has a row in the table (it was committed and not removed since).
  func isStored(_ id: NodeID) -> Bool { state.withLock { $0.committed[id] != nil } }

  /// The ids of a user's entries made no later than `before` (all with `nil`), oldest node
  /// first, at most `limit`.
  func ids(of userID: String, madeBefore before: Double? = nil, limit: Int = .max) -> [NodeID] {
    state.withLock { s in
      Array(
        s.entries.filter { id, e in e.userID == userID && e.since <= (before ?? .infinity) }
          .keys.sorted().prefix(limit))
    }
  }

  /// How many upload operations a user's entries stand for: an RCRD each, and a DATA for those
  /// whose content was committed.
  func operationCount(of userID: String) -> Int {
    state.withLock { s in
      s.entries.values.reduce(0) { n, e in e.userID == userID ? n + (e.data ? 2 : 1) : n }
    }
  }

  func set(_ id: NodeID, _ entry: Entry?) {
    state.withLock { s in
      // One lookup: the entry before comes back from the change.
      let before: Entry?
      if let entry {
        before = s.entries.updateValue(entry, forKey: id)
      } else {
        before = s.entries.removeValue(forKey: id)
      }
      s.undo.append((id, before))
      s.changed.insert(id)
    }
  }

  /// The entries made since the last commit, which the commit inserts into the table.
  func uncommittedEntries() -> [(NodeID, Entry)] {
    state.withLock { s in
      s.changed.sorted().compactMap { id in
        guard s.committed[id] == nil, let e = s.entries[id] else { return nil }
        return (id, e)
      }
    }
  }

  /// A unit of work starts: what earlier units changed stays.
  func beginUnit() { state.withLock { $0.undo.removeAll(keepingCapacity: true) } }

  /// A unit failed without changing a row: the entries are as they were before the unit.
  func undoUnit() {
    state.withLock { s in
      for (id, entry) in s.undo.reversed() { s.entries[id] = entry }
      s.undo.removeAll(keepingCapacity: true)
    }
  }

  /// The writer committed: the table holds the entries.
  func didCommit() {
    state.withLock { s in
      for id in s.changed { s.committed[id] = s.entries[id] }
      s.changed.removeAll(keepingCapacity: true)
      s.undo.removeAll(keepingCapacity: true)
    }
  }

  /// The transaction rolled back: the entries are the committed ones again.
  func didRollback() {
    state.withLock { s in
      for id in s.changed { s.entries[id] = s.committed[id] }
      s.changed.removeAll()
      s.undo.removeAll()
    }
  }

  /// Starts over from the table's rows (at open).
  func load(_ rows: [NodeID: Entry]) {
    state.withLock { s in
      s.entries = rows
      s.committed = rows
      s.changed.removeAll()
      s.undo.removeAll()
    }
  }
}

extension CloudTransaction {
  /// True when `id` is a new node whose first upload is not queued yet.
  func isDeferred(_ id: NodeID) -> Bool { deferredUploads?.contains(id) ?? false }

  /// Queues the first upload of a new node created by this unit when its batch commits (or when
  /// asked for), if this unit may defer it; returns false when it must be queued now.
  func deferFirstUpload(_ id: NodeID) -> Bool {
    guard defersFirstUploads, let deferredUploads else { return false }
    deferredUploads.set(
      id, .init(userID: userID, data: false, since: Date().timeIntervalSinceReferenceDate))
    return true
  }

  /// Notes that a deferred node's content was committed (now): its DATA upload is queued with
  /// its RCRD's, once settled from then.
  func deferDataUpload(_ id: NodeID) throws {
    guard let deferredUploads, var entry = deferredUploads.entry(id) else { return }
    entry.data = true
    entry.since = Date().timeIntervalSinceReferenceDate
    if deferredUploads.isStored(id) {
      try rawExecute(Self.storeDeferredDataSQL, [entry.since, id])
    }
    deferredUploads.set(id, entry)
  }

  /// Removes `id`'s entry, if it has one, and its row when it has one (its uploads are queued,
  /// or its node's row is deleted with nothing of it queued).
  func dropDeferred(_ id: NodeID) throws {
    guard let deferredUploads, deferredUploads.contains(id) else { return }
    if deferredUploads.isStored(id) { try rawExecute(Self.deleteDeferredSQL, [id]) }
    deferredUploads.set(id, nil)
  }

  /// Queues the deferred first upload of `id`, if it has one: its RCRD upload waiting for its
  /// parent's first upload (queued first when it is deferred too), then its DATA upload when
  /// its content was committed — what creating it and committing its content would have queued.
  func queueDeferredUpload(_ id: NodeID) throws {
    guard let deferredUploads, deferredUploads.contains(id) else { return }
    var parentUploads: [NodeID: Int64?] = [:]
    try atomically { try queueDeferredUpload(id, parentUploads: &parentUploads) }
  }

  /// Runs `body` in the open transaction, or in one of its own (a read between batches): the
  /// operations queued and the stored entry removed commit together.
  private func atomically(_ body: () throws -> Void) throws {
    if connection.rawIsInsideTransaction { return try body() }
    try db.inTransaction(.immediate) {
      try body()
      return .commit
    }
  }

  /// `parentUploads` remembers parents' first upload operations across the calls of one
  /// writer turn (siblings share their parent's; nothing finishes an operation meanwhile).
  private func queueDeferredUpload(_ id: NodeID, parentUploads: inout [NodeID: Int64?]) throws {
    guard let deferredUploads, let entry = deferredUploads.entry(id) else { return }
    guard let node = try node(id: id) else {
      // Gone without `deleteRows` (nothing of it was queued): nothing to queue.
      try dropDeferred(id)
      return
    }
    var deps: [Int64] = []
    if let parentID = node.parentID {
      let parentUpload: Int64?
      if let known = parentUploads[parentID] {
        parentUpload = known
      } else {
        parentUpload = try self.node(id: parentID).flatMap { try firstUploadOperation(of: $0) }
        parentUploads[parentID] = parentUpload
      }
      if let parentUpload { deps.append(parentUpload) }
    }
    // Queued, as far as settling goes, when the node last changed (as at that batch's commit).
    let rcrd = try insertOperation(
      kind: .putRcrd, nodeID: id, cloudID: node.cloudID, payload: nil, dependsOn: deps,
      depsQueued: true, createdAt: entry.since)
    if entry.data {
      _ = try insertOperation(
        kind: .putData, nodeID: id, cloudID: node.cloudID, payload: nil, dependsOn: [rcrd],
        depsQueued: true, createdAt: entry.since)
    }
    try dropDeferred(id)
  }

  /// Queues every deferred first upload of this transaction's user (before a query over all
  /// of its push operations), or, oldest node first, at most `limit` of those of nodes made no
  /// later than `madeBefore`.
  func queueDeferredUploads(madeBefore: Date? = nil, limit: Int = .max) throws {
    guard let deferredUploads, !deferredUploads.isEmpty else { return }
    var parentUploads: [NodeID: Int64?] = [:]
    let ids = deferredUploads.ids(
      of: userID, madeBefore: madeBefore?.timeIntervalSinceReferenceDate, limit: limit)
    guard !ids.isEmpty else { return }
    try atomically {
      for id in ids { try queueDeferredUpload(id, parentUploads: &parentUploads) }
    }
  }

  /// How many upload operations the deferred first uploads of this user stand for (an RCRD
  /// each, and a DATA for those whose content was committed): the entries', on the connection
  /// that holds them (every stored row is an entry there), or the stored rows', on one that
  /// does not (a reader). Counting queues nothing: a progress count during a burst of file
  /// operations would otherwise queue the burst's first uploads as it goes.
  func deferredOperationCount() throws -> Int {
    if let deferredUploads { return deferredUploads.operationCount(of: userID) }
    return Int(try rawInt(Self.storedDeferredCountSQL, [userID]) ?? 0)
  }

  /// Whether `id` has a stored deferred first upload, on a connection that does not hold the
  /// entries (see ``deferredOperationCount()``).
  func hasStoredDeferredUpload(_ id: NodeID) throws -> Bool {
    guard deferredUploads == nil else { return false }
    return try rawInt(Self.storedDeferredExistsSQL, [id, userID]) != nil
  }

  /// Inserts the entries made since the last commit into the table (before the commit).
  static func storeDeferredUploads(_ deferred: DeferredUploads, _ db: Database) throws {
    let entries = deferred.uncommittedEntries()
    guard !entries.isEmpty else { return }
    let stmt = try db.cachedStatement(
      sql: """
        INSERT OR REPLACE INTO deferredUploads (nodeID, localUserID, data, since)
        VALUES (?, ?, ?, ?)
        """)
    for (id, e) in entries {
      try stmt.execute(arguments: [id, e.userID, e.data, e.since])
    }
  }

  /// The table's rows, by node.
  static func storedDeferredUploads(_ db: Database) throws -> [NodeID: DeferredUploads.Entry] {
    var out: [NodeID: DeferredUploads.Entry] = [:]
    for row in try Row.fetchAll(
      db, sql: "SELECT nodeID, localUserID, data, since FROM deferredUploads")
    {
      out[row[0]] = .init(userID: row[1], data: row[2], since: row[3])
    }
    return out
  }

  private static let storeDeferredDataSQL = CatalogSQL(
    "UPDATE deferredUploads SET data = 1, since = ? WHERE nodeID = ?")
  private static let deleteDeferredSQL = CatalogSQL(
    "DELETE FROM deferredUploads WHERE nodeID = ?")
  private static let storedDeferredCountSQL = CatalogSQL(
    "SELECT COUNT(*) + COALESCE(SUM(data), 0) FROM deferredUploads WHERE localUserID = ?")
  private static let storedDeferredExistsSQL = CatalogSQL(
    "SELECT 1 FROM deferredUploads WHERE nodeID = ? AND localUserID = ?")
}
