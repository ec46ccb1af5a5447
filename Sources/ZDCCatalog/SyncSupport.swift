public import Foundation
import GRDB
public import ZDCCore
import ZDCCrypto

/// Migration "v2": the sync engine's per-user state (pull cursor, …) and the change-log entries
/// waiting to be written to the store.
enum SyncSchema {
  static func v2(_ db: Database) throws {
    try db.execute(
      sql: """
        CREATE TABLE syncState (
          localUserID TEXT NOT NULL REFERENCES localUsers(id) ON DELETE CASCADE,
          key TEXT NOT NULL,
          value TEXT NOT NULL,
          PRIMARY KEY (localUserID, key)
        ) WITHOUT ROWID;

        CREATE TABLE changeLogPending (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          localUserID TEXT NOT NULL REFERENCES localUsers(id) ON DELETE CASCADE,
          entry TEXT NOT NULL
        );
        CREATE INDEX changeLogPending_user ON changeLogPending(localUserID, id);
        """)
  }
}

/// What the pull side needs to know about one stored node to compare it with a listing.
public struct SyncIndexEntry: Sendable, Hashable {
  /// The node.
  public var id: NodeID
  /// Its parent (nil for a trunk).
  public var parentID: NodeID?
  /// Its cloudID.
  public var cloudID: String
  /// Where its children live.
  public var dirPrefix: String
  /// Its parent's dirPrefix: where its own objects live (nil for a trunk).
  public var parentDirPrefix: String?
  /// Its cloudName under that parent.
  public var cloudName: String
  /// Last known RCRD eTag.
  public var eTagRcrd: String?
  /// Last known DATA eTag.
  public var eTagData: String?
  /// When its RCRD was last written (as known here).
  public var lastModifiedRcrd: Date?
  /// The trunk, for trunk nodes.
  public var trunk: Trunk?
}

/// One pending change-log entry (JSON owned by the sync engine).
public struct PendingChange: Sendable, Hashable {
  /// Queue order.
  public var id: Int64
  /// The entry, as the sync engine encoded it.
  public var entry: Data
}

/// Sync-engine support: pull cursor and settings, pending change-log entries, and applying
/// remote changes without enqueueing push operations.
extension CloudTransaction {
  // MARK: Sync state

  /// A value of the sync engine's per-user state, or `nil`.
  public func syncValue(forKey key: String) throws -> String? {
    let stmt = try db.cachedStatement(
      sql: "SELECT value FROM syncState WHERE localUserID = ? AND key = ?")
    return try String.fetchOne(stmt, arguments: [userID, key])
  }

  /// Sets (or with `nil`, removes) a value of the sync engine's per-user state.
  public func setSyncValue(_ value: String?, forKey key: String) throws {
    try requireWritable()
    if let value {
      let stmt = try db.cachedStatement(
        sql: "INSERT OR REPLACE INTO syncState (localUserID, key, value) VALUES (?, ?, ?)")
      try rawExecute(stmt, [userID, key, value])
    } else {
      let stmt = try db.cachedStatement(
        sql: "DELETE FROM syncState WHERE localUserID = ? AND key = ?")
      try rawExecute(stmt, [userID, key])
    }
  }

  // MARK: Pending change-log entries

  /// Queues a change-log entry to be written to the store.
  public func appendPendingChange(_ entry: Data) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: "INSERT INTO changeLogPending (localUserID, entry) VALUES (?, ?)")
    try rawExecute(stmt, [userID, String(decoding: entry, as: UTF8.self)])
  }

  /// The oldest pending change-log entries.
  public func pendingChanges(limit: Int) throws -> [PendingChange] {
    let stmt = try db.cachedStatement(
      sql: "SELECT id, entry FROM changeLogPending WHERE localUserID = ? ORDER BY id LIMIT ?")
    return try Row.fetchAll(stmt, arguments: [userID, limit]).map {
      PendingChange(id: $0[0], entry: Data(($0[1] as String).utf8))
    }
  }

  /// The number of pending change-log entries.
  public func pendingChangeCount() throws -> Int {
    let stmt = try db.cachedStatement(
      sql: "SELECT COUNT(*) FROM changeLogPending WHERE localUserID = ?")
    return try Int.fetchOne(stmt, arguments: [userID]) ?? 0
  }

  /// Removes pending change-log entries (once written).
  public func removePendingChanges(ids: [Int64]) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: "DELETE FROM changeLogPending WHERE id = ? AND localUserID = ?")
    for id in ids { try rawExecute(stmt, [id, userID]) }
  }

  // MARK: Queries for the pull side

  /// The node whose children live under `dirPrefix`, or `nil`.
  public func node(dirPrefix: String) throws -> Node? {
    try fetchNode(
      "SELECT \(Self.nodeColumns) FROM nodes WHERE dirPrefix = ? AND localUserID = ? LIMIT 1",
      [dirPrefix, userID])
  }

  /// Every node of the user, with where its objects live and their last known eTags.
  public func syncIndex() throws -> [SyncIndexEntry] {
    let stmt = try db.cachedStatement(
      sql: """
        SELECT n.id, n.parentID, n.cloudID, n.dirPrefix, p.dirPrefix, n.cloudName, n.eTagRcrd,
          n.eTagData, n.lastModifiedRcrd, n.trunk
        FROM nodes n LEFT JOIN nodes p ON p.id = n.parentID
        WHERE n.localUserID = ?
        """)
    var out: [SyncIndexEntry] = []
    let cursor = try Row.fetchCursor(stmt, arguments: [userID])
    while let row = try cursor.next() {
      out.append(
        SyncIndexEntry(
          id: row[0], parentID: row[1], cloudID: row[2], dirPrefix: row[3], parentDirPrefix: row[4],
          cloudName: row[5], eTagRcrd: row[6], eTagData: row[7],
          lastModifiedRcrd: (row[8] as Double?).map(Date.init(timeIntervalSinceReferenceDate:)),
          trunk: (row[9] as String?).flatMap(Trunk.init(rawValue:))))
    }
    return out
  }

  /// The kinds of the node's outstanding operations.
  public func outstandingKinds(ofNodeID nodeID: NodeID) throws -> Set<PushOperationKind> {
    Set(try outstandingOperations(ofNode: nodeID).map(\.kind))
  }

  /// The ids of the nodes of a subtree (root first) that have outstanding operations.
  public func dirtyNodes(inSubtreeOf id: NodeID) throws -> [NodeID] {
    try subtree(of: id).map(\.id).filter { try isDirty(nodeID: $0) }
  }

  /// The ids of a subtree's nodes, root first, breadth-first.
  public func subtreeIDs(of id: NodeID) throws -> [NodeID] {
    try subtree(of: id).map(\.id)
  }

  // MARK: Applying remote changes (nothing enqueued)

  /// Inserts a node discovered in the cloud, with its cloud state, under `node.parentID`.
  /// `cloudName` is where its objects were found (kept as `explicitCloudName` when it is not
  /// the hash of the name). Enqueues nothing.
  @discardableResult
  public func insertRemoteNode(_ node: Node, cloudName: String) throws -> Node {
    try requireWritable()
    guard let parentID = node.parentID else {
      throw CatalogError.invalidOperation("a remote node needs a parent")
    }
    let parent = try existingNode(id: parentID)
    if let existing = try existingChildID(of: parentID, nameKey: node.nameKey) {
      throw CatalogError.nameTaken(parentID: parentID, name: node.name, existingID: existing)
    }
    var n = node
    n.localUserID = userID
    if n.uuid.isEmpty { n.uuid = SecureRandom.uuid() }
    let computed = try CloudName.compute(name: n.name, parentDirSalt: parent.dirSalt)
    n.explicitCloudName = computed == cloudName ? nil : cloudName
    n.id = try insertNodeRow(n, cloudName: cloudName)
    return n
  }

  /// Replaces every field of a stored node (placement, attributes, cloud state) with a remote
  /// version; `cloudName` is where its objects now are. Enqueues nothing.
  public func applyRemoteNode(_ node: Node, cloudName: String) throws {
    try requireWritable()
    let stored = try existingNode(id: node.id)
    guard stored.trunk == nil, let parentID = node.parentID else {
      throw CatalogError.invalidOperation("trunks are not applied from the cloud")
    }
    let parent = try existingNode(id: parentID)
    if let existing = try existingChildID(of: parentID, nameKey: node.nameKey),
      existing != node.id
    {
      throw CatalogError.nameTaken(parentID: parentID, name: node.name, existingID: existing)
    }
    if parentID != stored.parentID, try isAncestor(node.id, of: parentID) {
      throw CatalogError.cycle(nodeID: node.id, newParentID: parentID)
    }
    let computed = try CloudName.compute(name: node.name, parentDirSalt: parent.dirSalt)
    let stmt = try db.cachedStatement(
      sql: """
        UPDATE nodes SET parentID = ?, name = ?, nameKey = ?, cloudName = ?, explicitCloudName = ?,
          kind = ?, shareList = ?, burnDate = ?, encryptionKey = ?, dirSalt = ?, dirPrefix = ?,
          eTagRcrd = ?, eTagData = ?, lastModifiedRcrd = ?, lastModifiedData = ?,
          cloudDataInfo = ?, mode = ?, mtime = ?, xattrs = ?, symlinkTarget = ?, dataSize = ?
        WHERE id = ? AND localUserID = ?
        """)
    let args: [(any DatabaseValueConvertible)?] = [
      parentID, try fields.storedText(node.name), try fields.nameKey(node.nameKey), cloudName,
      computed == cloudName ? nil : cloudName,
      node.kind.rawValue, try shareListJSON(node.shareList),
      node.burnDate?.timeIntervalSinceReferenceDate, try fields.seal(node.encryptionKey),
      try fields.seal(node.dirSalt), node.dirPrefix, node.eTagRcrd, node.eTagData,
      node.lastModifiedRcrd?.timeIntervalSinceReferenceDate,
      node.lastModifiedData?.timeIntervalSinceReferenceDate,
      try node.cloudDataInfo.map { try json($0) }, Int64(node.mode), node.mtime.totalNanoseconds,
      try storedXattrs(node.xattrs), try fields.storedText(node.symlinkTarget),
      Int64(bitPattern: node.dataSize), node.id, userID,
    ]
    try rawExecute(stmt, args)
    rowChanged(node.id)
    sharedNodes?.placed(under: parentID, named: node.nameKey)
  }

  /// Renames a node in place without enqueueing a move: for a node whose objects are not (yet)
  /// at its current keys, e.g. a first upload that lost a name race. Returns the stored node.
  @discardableResult
  public func renameWithoutMove(_ id: NodeID, to newName: String) throws -> Node {
    try requireWritable()
    var node = try existingNode(id: id)
    guard let parentID = node.parentID else {
      throw CatalogError.invalidOperation("trunks cannot be renamed")
    }
    if let existing = try existingChildID(of: parentID, nameKey: NameKey(newName)),
      existing != id
    {
      throw CatalogError.nameTaken(parentID: parentID, name: newName, existingID: existing)
    }
    let parent = try existingNode(id: parentID)
    let cloudName = try CloudName.compute(name: newName, parentDirSalt: parent.dirSalt)
    let stmt = try db.cachedStatement(
      sql: """
        UPDATE nodes SET name = ?, nameKey = ?, cloudName = ?, explicitCloudName = NULL
        WHERE id = ?
        """)
    try rawExecute(
      stmt, [try fields.storedText(newName), try fields.nameKey(of: newName), cloudName, id])
    rowChanged(id)
    sharedNodes?.placed(under: parentID, named: NameKey(newName))
    node.name = newName
    node.explicitCloudName = nil
    return node
  }

  /// Deletes the rows of a subtree deleted in the cloud, dropping its operations. Enqueues
  /// nothing.
  public func deleteRemoteSubtree(_ id: NodeID) throws {
    try requireWritable()
    let entries = try subtree(of: id)
    for e in entries {
      for op in try outstandingOperations(ofNode: e.id) { try deleteOperation(op.id) }
    }
    try deleteRows(entries)
  }

  /// Gives a node without children a new cloudID, so that its next upload stores a node of its
  /// own. For a node kept after the store took it elsewhere (another device moved it where this
  /// device cannot place it): uploaded again under its old cloudID, it would be a second RCRD of
  /// that node, which devices would each take for where the node is. Not journaled (the unit of
  /// work commits before it returns).
  @discardableResult
  public func assignNewCloudID(to id: NodeID) throws -> Node {
    try requireWritable()
    var n = try existingNode(id: id)
    guard try childCount(of: id) == 0 else {
      throw CatalogError.invalidOperation("assignNewCloudID: node \(id) has children")
    }
    n.cloudID = SecureRandom.cloudID()
    let stmt = try db.cachedStatement(sql: "UPDATE nodes SET cloudID = ? WHERE id = ?")
    try rawExecute(stmt, [n.cloudID, id])
    rowChanged(id)
    return n
  }

  /// Makes a subtree that was deleted in the cloud new again: clears its cloud state, drops its
  /// operations and enqueues a first upload of every node (RCRD, and DATA for the dirty nodes
  /// that had or were uploading data), parents first. `existingData` names nodes with no local
  /// content change whose DATA is still at their keys (e.g. a copy their move made before the
  /// delete): they keep it, with its sizes, instead of uploading the content again.
  ///
  /// `leaving` names nodes of the subtree that keep their cloud state and operations (e.g. one
  /// moving in from where the store still holds it: its move brings it, and what is below it).
  public func reuploadSubtree(
    _ id: NodeID, existingData: [NodeID: CloudDataInfo] = [:], leaving: Set<NodeID> = []
  ) throws {
    try requireWritable()
    let entries = try subtree(of: id).filter { !leaving.contains($0.id) }
    var hadData: Set<NodeID> = []
    var existing = existingData
    var strays: [(cloudID: String, refs: [CloudObjectRef])] = []
    for e in entries {
      let ops = try outstandingOperations(ofNode: e.id)
      // Only dirty nodes have content here worth uploading; clean ones' data was remote. A
      // dirty node with DATA found at its keys keeps it even if it never knew a DATA version
      // (it pulled the node before its DATA landed, and its move carried a copy of it).
      if !ops.isEmpty,
        e.eTagData != nil || existing[e.id] != nil || ops.contains(where: { $0.kind == .putData })
      {
        hadData.insert(e.id)
      }
      if ops.contains(where: { $0.kind == .putData }) {
        existing[e.id] = nil  // local content to upload
      }
      // Targets a dropped move wrote elsewhere than where the node is uploaded again.
      let here = e.parentDirPrefix.map {
        objectRef(
          nodeID: e.id, cloudID: e.cloudID, dirPrefix: $0, cloudName: e.cloudName, eTagRcrd: nil,
          eTagData: nil
        ).rcrdKey
      }
      for op in ops where op.kind == .move {
        let refs = (try decodePayload(op.payload).written ?? []).filter { $0.rcrdKey != here }
        if !refs.isEmpty { strays.append((e.cloudID, refs)) }
      }
      for op in ops { try deleteOperation(op.id) }
    }
    for s in strays {
      _ = try insertOperation(
        kind: .deleteLeaf, nodeID: nil, cloudID: s.cloudID, payload: PushPayload(objects: s.refs),
        dependsOn: [])
    }
    let clear = try db.cachedStatement(
      sql: """
        UPDATE nodes SET eTagRcrd = NULL, eTagData = NULL, lastModifiedRcrd = NULL,
          lastModifiedData = NULL, cloudDataInfo = NULL
        WHERE id = ?
        """)
    let keep = try db.cachedStatement(
      sql: """
        UPDATE nodes SET eTagRcrd = NULL, eTagData = ?, lastModifiedRcrd = NULL,
          lastModifiedData = ?, cloudDataInfo = ?, dataSize = ?
        WHERE id = ?
        """)
    for e in entries {
      // A node with DATA found at its keys keeps that version, dirty or clean (a clean one's
      // content is known only by it).
      if let kept = existing[e.id] {
        hadData.remove(e.id)
        try rawExecute(
          keep,
          [
            kept.eTag, kept.lastModified?.timeIntervalSinceReferenceDate, try json(kept),
            Int64(bitPattern: kept.dataSize), e.id,
          ])
      } else {
        try rawExecute(clear, [e.id])
      }
      rowChanged(e.id)
    }
    for e in entries {
      let node = try existingNode(id: e.id)
      var deps: [Int64] = []
      if let parentID = node.parentID, let parent = try self.node(id: parentID),
        let up = try firstUploadOperation(of: parent)
      {
        deps.append(up)
      }
      _ = try insertOperation(
        kind: .putRcrd, nodeID: node.id, cloudID: node.cloudID, payload: nil, dependsOn: deps)
      if hadData.contains(e.id) { _ = try queueDataUpload(nodeID: e.id) }
    }
  }

  /// Drops a node's outstanding operations of one kind (in flight included: the caller owns
  /// them).
  public func dropOperations(ofNodeID nodeID: NodeID, kind: PushOperationKind) throws {
    try requireWritable()
    for op in try outstandingOperations(ofNode: nodeID) where op.kind == kind {
      try deleteOperation(op.id)
    }
  }

  /// Queues an upload of a node's RCRD as it is (coalesced into a pending one), e.g. when the
  /// RCRD in the store no longer describes the node's DATA.
  public func queueRcrdUpload(nodeID: NodeID) throws {
    try requireWritable()
    let node = try existingNode(id: nodeID)
    guard node.trunk == nil else { return }
    try enqueuePutRcrd(node)
  }

  /// Settles the RCRD uploads of a node that now stands for a remote version (a data
  /// conflict): its pending RCRD uploads are dropped (they hold the local attributes, which went
  /// to the conflicted copy). One still in flight cannot be recalled — it may yet write the
  /// local attributes (and size) over the remote version, and the device must still record and
  /// log that write — so a new upload of the node's (remote) attributes is queued to wait for
  /// it. The RCRD in the store thus ends up holding the node's attributes, under an eTag this
  /// device knows and has logged. With no RCRD upload in flight the store already holds them,
  /// and nothing is queued unless `rewrite` asks for it. Returns whether an upload was queued.
  @discardableResult
  public func requeueRcrdUpload(nodeID: NodeID, rewrite: Bool = false) throws -> Bool {
    try requireWritable()
    let node = try existingNode(id: nodeID)
    let ops = try outstandingOperations(ofNode: nodeID)
    for op in ops where op.kind == .putRcrd && op.state == .pending {
      try deleteOperation(op.id)
    }
    guard rewrite || ops.contains(where: { $0.kind == .putRcrd && $0.state == .inFlight }) else {
      return false
    }
    try enqueuePutRcrd(node)
    return true
  }

  /// The outstanding delete operations whose payload lists objects of `cloudID`.
  public func deleteOperations(referencing cloudID: String) throws -> [PushOperation] {
    let stmt = try db.cachedStatement(
      sql: """
        SELECT \(Self.operationColumns) FROM pushOperations
        WHERE localUserID = ? AND kind IN ('deleteLeaf', 'deleteNode') ORDER BY id
        """)
    return try Row.fetchAll(stmt, arguments: [userID]).map(decodeOperation).filter {
      ($0.payload.objects ?? []).contains { $0.cloudID == cloudID }
    }
  }

  /// Records, in the outstanding delete operations listing `cloudID` at `rcrdKey`, eTags that
  /// an upload still in flight when the node was deleted has just written (nil: unchanged).
  public func updateDeleteETags(
    cloudID: String, rcrdKey: String, eTagRcrd: String?, eTagData: String?
  ) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(sql: "UPDATE pushOperations SET payload = ? WHERE id = ?")
    for op in try deleteOperations(referencing: cloudID) {
      var payload = op.payload
      var changed = false
      for i in (payload.objects ?? []).indices
      where payload.objects![i].cloudID == cloudID && payload.objects![i].rcrdKey == rcrdKey {
        if let eTagRcrd { payload.objects![i].eTagRcrd = eTagRcrd }
        if let eTagData { payload.objects![i].eTagData = eTagData }
        changed = true
      }
      if changed { try rawExecute(stmt, [PushPayloadJSON.encode(payload), op.id]) }
    }
  }

  /// Adds to the outstanding delete operations listing `cloudID` the objects in `refs` they do
  /// not list yet: places where a move of the node, in flight when the node was deleted here,
  /// writes after the delete was planned (the delete waits for that move, then removes them).
  public func addDeleteObjects(_ refs: [CloudObjectRef], cloudID: String) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(sql: "UPDATE pushOperations SET payload = ? WHERE id = ?")
    for op in try deleteOperations(referencing: cloudID) {
      var payload = op.payload
      var objects = payload.objects ?? []
      let known = Set(objects.map(\.rcrdKey))
      let added = refs.filter { $0.cloudID == cloudID && !known.contains($0.rcrdKey) }
      guard !added.isEmpty else { continue }
      // Listed first: a delete removes its objects in reverse order, a move's targets last.
      objects.insert(contentsOf: added, at: 0)
      payload.objects = objects
      try rawExecute(stmt, [try json(payload), op.id])
    }
  }

  /// Has the store's copy of a node, found at `origin`, moved to where this device has the node:
  /// its outstanding `move` starts from there, or a new one is queued (when the device already
  /// has the node elsewhere, e.g. where a pull that broke a loop put it).
  public func moveFromStoreLocation(_ origin: CloudObjectRef, forNodeID nodeID: NodeID) throws {
    try requireWritable()
    if try outstandingOperations(ofNode: nodeID).contains(where: { $0.kind == .move }) {
      return try setMoveOrigin(origin, forNodeID: nodeID)
    }
    let node = try existingNode(id: nodeID)
    guard node.trunk == nil, let parentID = node.parentID,
      try objectLocation(of: nodeID)?.rcrdKey != origin.rcrdKey
    else { return }
    try enqueueMove(
      node, from: origin, newParent: try existingNode(id: parentID), sameParent: false)
  }

  /// Points a node's outstanding `move` at a new origin (where the node's objects really are,
  /// after the cloud moved them too). What the move wrote so far (`written`) is kept; a target
  /// that is now the origin is no longer listed there.
  public func setMoveOrigin(_ origin: CloudObjectRef, forNodeID nodeID: NodeID) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: "UPDATE pushOperations SET payload = ? WHERE id = ?")
    for op in try outstandingOperations(ofNode: nodeID) where op.kind == .move {
      var payload = try decodePayload(op.payload)
      payload.origin = origin
      payload.written?.removeAll { $0.rcrdKey == origin.rcrdKey }
      if payload.written?.isEmpty == true { payload.written = nil }
      try rawExecute(stmt, [PushPayloadJSON.encode(payload), op.id])
    }
  }

  /// Records eTags this device just wrote at the origin of the node's outstanding `move` (an
  /// upload resumed where the node was when it started), so that they are not taken for remote
  /// changes there (nil: unchanged).
  public func updateMoveOriginETags(
    nodeID: NodeID, rcrdKey: String, eTagRcrd: String?, eTagData: String?
  ) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(sql: "UPDATE pushOperations SET payload = ? WHERE id = ?")
    for op in try outstandingOperations(ofNode: nodeID) where op.kind == .move {
      var payload = try decodePayload(op.payload)
      guard var origin = payload.origin, origin.rcrdKey == rcrdKey else { continue }
      if let eTagRcrd { origin.eTagRcrd = eTagRcrd }
      if let eTagData { origin.eTagData = eTagData }
      payload.origin = origin
      try rawExecute(stmt, [PushPayloadJSON.encode(payload), op.id])
    }
  }

  /// Records the target locations a `move` operation has written to so far (see
  /// ``PushPayload/written``); an empty list clears them.
  public func setMoveWritten(_ written: [CloudObjectRef], forOperation id: Int64) throws {
    try requireWritable()
    guard let op = try operation(id: id), op.kind == .move else {
      throw CatalogError.operationNotFound(id)
    }
    var payload = op.payload
    payload.written = written.isEmpty ? nil : written
    let stmt = try db.cachedStatement(
      sql: "UPDATE pushOperations SET payload = ? WHERE id = ? AND +localUserID = ?")
    try rawExecute(stmt, [PushPayloadJSON.encode(payload), id, userID])
  }

  /// Returns an operation taken by the push manager to the queue, to run again once `other`
  /// has completed (or been dropped), without counting a failed attempt. Returns false and
  /// changes nothing when `other` is gone or itself waits, directly or not, for `id`.
  public func deferOperation(id: Int64, until other: Int64) throws -> Bool {
    try requireWritable()
    guard try operation(id: id) != nil else { throw CatalogError.operationNotFound(id) }
    guard other != id, try operation(id: other) != nil else { return false }
    if try waits(other, for: id) { return false }
    try addDependency(id, dependsOn: other)
    let stmt = try db.cachedStatement(
      sql: "UPDATE pushOperations SET state = 'pending' WHERE id = ? AND +localUserID = ?")
    try rawExecute(stmt, [id, userID])
    return true
  }

  /// True when operation `id` waits, directly or through others, for operation `other`.
  public func waits(_ id: Int64, for other: Int64) throws -> Bool {
    let stmt = try db.cachedStatement(
      sql: """
        WITH RECURSIVE d(id) AS (
          SELECT dependsOnOpID FROM pushOperationDeps WHERE opID = ?
          UNION
          SELECT p.dependsOnOpID FROM pushOperationDeps p JOIN d ON p.opID = d.id
        )
        SELECT EXISTS (SELECT 1 FROM d WHERE id = ?)
        """)
    return try Bool.fetchOne(stmt, arguments: [id, other]) ?? false
  }

  /// Sets a trunk's dirSalt (shared by the user's devices). Children already stored keep their
  /// cloudNames (as explicit cloudNames), so their objects are still found.
  public func setTrunkDirSalt(_ trunk: Trunk, dirSalt: Data) throws {
    try requireWritable()
    guard let node = try trunkNode(trunk) else { throw CatalogError.userNotFound(userID) }
    if node.dirSalt == dirSalt { return }
    try db.execute(
      sql: """
        UPDATE nodes SET explicitCloudName = cloudName
        WHERE parentID = ? AND explicitCloudName IS NULL
        """, arguments: [node.id])
    try db.execute(
      sql: "UPDATE nodes SET dirSalt = ? WHERE id = ?",
      arguments: [try fields.seal(dirSalt), node.id])
    rowsChanged()
  }
}
