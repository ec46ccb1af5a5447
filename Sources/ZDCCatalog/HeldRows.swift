import Foundation
import GRDB
import Synchronization
import ZDCCore
import ZDCSQLite

/// New files and directories of the open batch whose rows are not inserted yet: the node, as
/// it is now, stands in for its row until a statement needs the row or the batch commits.
///
/// A file or directory created in a journaled unit of work (``Catalog/Commit/soon``), whose
/// first upload is deferred and whose name its directory's cached child names show free, is
/// held here instead of inserted. Committing its content, renaming it, changing its
/// attributes and deleting it change the held node, not a row; so a file that lives a moment
/// — an editor's swap file, a build's temporary, the create/stat/rename/unlink of a
/// benchmark — costs the catalog no statement at all, and a node that stays costs one insert,
/// at the batch's commit, instead of an insert and an update per change. The redo journal
/// records the changes as it does for rows: a crash replays them as statements on rows.
///
/// Every other statement sees the rows as if the held nodes had been inserted: before any
/// statement runs on the writer connection, ``CloudTransaction`` inserts the held nodes
/// (in id order, under their ids) and raises the table's id sequence past every id handed
/// out — so a query never misses a held node and no id is used twice. The batch's commit does
/// the same first.
///
/// Touched only on the writer connection. A rollback drops what is held (the journal's replay
/// makes the batch's changes again as rows); a unit that fails without changing a row undoes
/// what it changed here.
final class HeldRows: Sendable {
  struct Held: Sendable {
    var node: Node
    /// The cloudName the row gets (from the parent's dirSalt and the name).
    var cloudName: String
  }

  private struct State {
    var rows: [NodeID: Held] = [:]
    /// How many held nodes sit under each parent.
    var children: [NodeID: Int] = [:]
    /// The next id to hand out (`nil`: read the table's sequence first).
    var nextID: NodeID?
    /// The highest id handed out that the table's sequence does not cover yet (0: none).
    var unsequenced: NodeID = 0
    /// What the current unit changed, oldest first: each id with its entry before.
    var undo: [(NodeID, Held?)] = []
    /// True while the held rows are being inserted, or while a check reads the rows alone.
    var suspended = false
    /// The local user of the last node held (whose transaction inserts the rows at a commit).
    var userID: String?

    /// Replaces (or removes, with `nil`) `id`'s entry, keeping the child counts; returns the
    /// entry before.
    mutating func replace(_ id: NodeID, _ entry: Held?) -> Held? {
      let before: Held?
      if let entry {
        before = rows.updateValue(entry, forKey: id)
      } else {
        before = rows.removeValue(forKey: id)
      }
      if let parent = before?.node.parentID {
        children[parent, default: 0] -= 1
        if children[parent] == 0 { children[parent] = nil }
      }
      if let parent = entry?.node.parentID { children[parent, default: 0] += 1 }
      return before
    }
  }

  private let state = Mutex(State())

  /// True when a statement must find the held nodes inserted first.
  var mustInsert: Bool {
    state.withLock { !$0.suspended && (!$0.rows.isEmpty || $0.unsequenced != 0) }
  }

  var count: Int { state.withLock { $0.rows.count } }

  func held(_ id: NodeID) -> Held? { state.withLock { $0.rows[id] } }

  func contains(_ id: NodeID) -> Bool { state.withLock { $0.rows[id] != nil } }

  /// True when a held node sits under `parentID`. Every child of a held directory is held (a
  /// child with a row is inserted, or moved in, by a statement, which inserts the directory
  /// first), so for a held directory this tells whether it has children at all.
  func hasChild(of parentID: NodeID) -> Bool { state.withLock { $0.children[parentID] != nil } }

  /// The local user whose transaction may insert the rows (any: rows carry their user).
  var anyUserID: String? { state.withLock { $0.userID } }

  /// Holds `entry` (new or changed), or drops it with `nil`.
  func set(_ id: NodeID, _ entry: Held?) {
    state.withLock { s in
      if let entry { s.userID = entry.node.localUserID }
      s.undo.append((id, s.replace(id, entry)))
    }
  }

  /// The next node id, after `sequence` (the table's, read only when the next id is not known).
  func nextID(sequence: () throws -> NodeID) rethrows -> NodeID {
    let known = state.withLock { $0.nextID }
    let id = try known ?? (sequence() + 1)
    state.withLock { s in
      s.nextID = id + 1
      s.unsequenced = max(s.unsequenced, id)
    }
    return id
  }

  /// Takes every held entry (in id order) and the id the table's sequence must reach, for
  /// their insert by `body`, which runs with the barrier down. Once it has, ids are read from
  /// the table again.
  func drain(_ body: ([Held], NodeID) throws -> Void) throws {
    let (rows, sequence) = state.withLock { s -> ([Held], NodeID) in
      let rows = s.rows.values.sorted { $0.node.id < $1.node.id }
      for h in rows { s.undo.append((h.node.id, h)) }
      s.rows.removeAll(keepingCapacity: true)
      s.children.removeAll(keepingCapacity: true)
      s.suspended = true
      return (rows, s.unsequenced)
    }
    defer { state.withLock { $0.suspended = false } }
    try body(rows, sequence)
    state.withLock { s in
      s.unsequenced = 0
      s.nextID = nil
    }
  }

  /// Runs `body` with the barrier down: a check that reads the rows alone (debug builds).
  func suspended<T>(_ body: () throws -> T) rethrows -> T {
    let was = state.withLock { s -> Bool in
      defer { s.suspended = true }
      return s.suspended
    }
    defer { state.withLock { $0.suspended = was } }
    return try body()
  }

  /// A unit of work starts: what earlier units changed stays.
  func beginUnit() { state.withLock { $0.undo.removeAll(keepingCapacity: true) } }

  /// A unit failed without changing a row: the entries are as they were before the unit.
  func undoUnit() {
    state.withLock { s in
      for (id, entry) in s.undo.reversed() { _ = s.replace(id, entry) }
      s.undo.removeAll(keepingCapacity: true)
    }
  }

  /// The transaction rolled back: nothing is held (the journal makes it again, as rows), and
  /// the next id is read from the table's sequence, rewound with it.
  func didRollback() {
    state.withLock { s in
      s.rows.removeAll()
      s.children.removeAll()
      s.undo.removeAll()
      s.nextID = nil
      s.unsequenced = 0
      s.suspended = false
    }
  }
}

extension CloudTransaction {
  /// The held node with this id, if it is held for this transaction's user.
  func heldNode(_ id: NodeID) -> Node? {
    guard let heldRows, let h = heldRows.held(id), h.node.localUserID == userID else { return nil }
    return h.node
  }

  /// Inserts the held nodes' rows and raises the id sequence past every id handed out (see
  /// ``HeldRows``): before any statement on the writer connection.
  func insertHeldRows() throws {
    guard let heldRows else { return }
    try heldRows.drain { rows, sequence in
      for h in rows {
        // The caches know it already (as it is now: tags or children may have come since).
        _ = try insertNodeRow(h.node, cloudName: h.cloudName, id: h.node.id, cached: true)
      }
      if sequence != 0 {
        try rawExecute(Self.raiseSequenceSQL, [sequence])
      }
    }
  }

  /// The `nodes` table's id sequence (read with the held rows out of the way).
  func nodeSequence() throws -> NodeID {
    try rawInt(Self.nodeSequenceSQL, []) ?? 0
  }

  private static let raiseSequenceSQL = CatalogSQL(
    "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'nodes'")
  private static let nodeSequenceSQL = CatalogSQL(
    """
    SELECT max(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'nodes'), 0),
      COALESCE((SELECT max(id) FROM nodes), 0))
    """)
}
