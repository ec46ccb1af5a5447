import Synchronization
import ZDCCore

/// New nodes whose first upload operations are not queued yet: nodes created by the
/// ``Catalog/Commit/soon`` units of the open batch, which queue them when the batch commits, or
/// earlier when anything asks for a push operation of theirs.
///
/// A file that lives a moment — a temporary file, an editor's swap file, `configure`'s test
/// programs — is created, written, renamed and removed within one batch: it then costs its own
/// rows only, instead of queuing an RCRD and a DATA upload, rereading them at each change and
/// dropping them with their dependencies at the end.
///
/// The set describes rows of the writer connection's open transaction: a rollback empties it
/// (the redo journal then makes its units again, which queue the uploads at once), and a unit
/// that fails without changing a row undoes what it changed in the set. Touched only on the
/// writer connection.
final class DeferredUploads: Sendable {
  struct Entry: Sendable {
    var userID: String
    /// The node's content was committed (`commitData`): a DATA upload follows its RCRD.
    var data: Bool
  }

  private struct State {
    var entries: [NodeID: Entry] = [:]
    /// What the current unit changed, oldest first: each id with its entry before.
    var undo: [(NodeID, Entry?)] = []
  }

  private let state = Mutex(State())

  var isEmpty: Bool { state.withLock { $0.entries.isEmpty } }

  var count: Int { state.withLock { $0.entries.count } }

  func entry(_ id: NodeID) -> Entry? { state.withLock { $0.entries[id] } }

  func contains(_ id: NodeID) -> Bool { state.withLock { $0.entries[id] != nil } }

  /// The ids of a user's entries, oldest node first.
  func ids(of userID: String) -> [NodeID] {
    state.withLock { s in s.entries.filter { $0.value.userID == userID }.keys.sorted() }
  }

  /// The users with entries.
  var users: Set<String> { state.withLock { Set($0.entries.values.map(\.userID)) } }

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
    }
  }

  /// A unit of work starts: what earlier units changed stays.
  func beginUnit() { state.withLock { $0.undo.removeAll(keepingCapacity: true) } }

  /// A unit failed without changing a row: the set is as it was before the unit.
  func undoUnit() {
    state.withLock { s in
      for (id, entry) in s.undo.reversed() { s.entries[id] = entry }
      s.undo.removeAll(keepingCapacity: true)
    }
  }

  /// The transaction rolled back: the rows the entries describe are gone.
  func removeAll() {
    state.withLock { s in
      s.entries.removeAll()
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
    deferredUploads.set(id, .init(userID: userID, data: false))
    return true
  }

  /// Notes that a deferred node's content was committed: its DATA upload is queued with its
  /// RCRD's.
  func deferDataUpload(_ id: NodeID) {
    guard let deferredUploads, var entry = deferredUploads.entry(id), !entry.data else { return }
    entry.data = true
    deferredUploads.set(id, entry)
  }

  /// Forgets a deferred node whose row is deleted (nothing of it was queued).
  func dropDeferred(_ id: NodeID) {
    guard let deferredUploads, deferredUploads.contains(id) else { return }
    deferredUploads.set(id, nil)
  }

  /// Queues the deferred first upload of `id`, if it has one: its RCRD upload waiting for its
  /// parent's first upload (queued first when it is deferred too), then its DATA upload when
  /// its content was committed — what creating it and committing its content would have queued.
  func queueDeferredUpload(_ id: NodeID) throws {
    var parentUploads: [NodeID: Int64?] = [:]
    try queueDeferredUpload(id, parentUploads: &parentUploads)
  }

  /// `parentUploads` remembers parents' first upload operations across the calls of one
  /// writer turn (siblings share their parent's; nothing finishes an operation meanwhile).
  private func queueDeferredUpload(_ id: NodeID, parentUploads: inout [NodeID: Int64?]) throws {
    guard let deferredUploads, let entry = deferredUploads.entry(id) else { return }
    guard let node = try node(id: id) else {
      // Gone without `deleteRows` (nothing of it was queued): nothing to queue.
      deferredUploads.set(id, nil)
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
    let rcrd = try insertOperation(
      kind: .putRcrd, nodeID: id, cloudID: node.cloudID, payload: nil, dependsOn: deps,
      depsQueued: true)
    if entry.data {
      _ = try insertOperation(
        kind: .putData, nodeID: id, cloudID: node.cloudID, payload: nil, dependsOn: [rcrd],
        depsQueued: true)
    }
    deferredUploads.set(id, nil)
  }

  /// Queues every deferred first upload of this transaction's user (before a query over all
  /// of its push operations).
  func queueDeferredUploads() throws {
    guard let deferredUploads, !deferredUploads.isEmpty else { return }
    var parentUploads: [NodeID: Int64?] = [:]
    for id in deferredUploads.ids(of: userID) {
      try queueDeferredUpload(id, parentUploads: &parentUploads)
    }
  }
}
