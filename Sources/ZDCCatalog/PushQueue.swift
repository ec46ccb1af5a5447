public import Foundation
import GRDB
public import ZDCCore
import ZDCSQLite

/// Push operations: enqueued by the node changes, consumed by the push manager.
extension CloudTransaction {
  static let operationColumns = """
    id, localUserID, kind, nodeID, cloudID, payload, state, attempts, nextAttemptAt, createdAt, \
    generation, multipartState
    """

  func decodeOperation(_ row: Row) throws -> PushOperation {
    guard let kind = PushOperationKind(rawValue: row[2]),
      let state = PushOperationState(rawValue: row[6])
    else { throw CatalogError.corrupt("push operation \(row[0] as Int64)") }
    return PushOperation(
      id: row[0], localUserID: row[1], kind: kind, nodeID: row[3], cloudID: row[4],
      payload: try decodePayload(row[5]), state: state, attempts: row[7],
      nextAttemptAt: Date(timeIntervalSinceReferenceDate: row[8]),
      createdAt: Date(timeIntervalSinceReferenceDate: row[9]), generation: row[10],
      multipartState: (row[11] as String?).map { Data($0.utf8) })
  }

  func decodePayload(_ json: String) throws -> PushPayload {
    json == "{}" ? PushPayload() : try decoder.decode(PushPayload.self, from: Data(json.utf8))
  }

  /// An outstanding operation of one node, as the enqueue rules need it.
  struct NodeOp {
    var id: Int64
    var kind: PushOperationKind
    var state: PushOperationState
    var payload: String
  }

  /// A node's outstanding operations, oldest first (the enqueue rules read them on every change).
  @_spi(Testing) public static let nodeOperationsSQL = """
    SELECT id, kind, state, payload FROM pushOperations
    WHERE nodeID = ? AND +localUserID = ? ORDER BY id
    """

  /// A node's first RCRD upload still queued.
  @_spi(Testing) public static let firstUploadSQL = """
    SELECT id FROM pushOperations WHERE nodeID = ? AND kind = 'putRcrd' ORDER BY id LIMIT 1
    """

  static let nodeOperations = CatalogSQL(nodeOperationsSQL)
  static let firstUpload = CatalogSQL(firstUploadSQL)

  func outstandingOperations(ofNode id: NodeID) throws -> [NodeOp] {
    try queueDeferredUpload(id)
    var out: [NodeOp] = []
    try rawQuery(Self.nodeOperations, [id, userID]) { s in
      let opID = RawColumn.int(s, 0)
      guard let kind = RawColumn.text(s, 1).flatMap(PushOperationKind.init(rawValue:)),
        let state = RawColumn.text(s, 2).flatMap(PushOperationState.init(rawValue:)),
        let payload = RawColumn.text(s, 3)
      else { throw CatalogError.corrupt("push operation \(opID)") }
      out.append(NodeOp(id: opID, kind: kind, state: state, payload: payload))
      return true
    }
    return out
  }

  /// The ids and kinds of a node's outstanding operations, oldest first (as
  /// ``pendingOperations(forNodeID:)`` lists them, without decoding their payloads).
  public func operationKinds(ofNodeID id: NodeID) throws -> [(id: Int64, kind: PushOperationKind)] {
    try outstandingOperations(ofNode: id).map { ($0.id, $0.kind) }
  }

  /// Where the objects of a node were when its oldest queued move was made (that move's
  /// origin), or `nil` when no move of it is queued.
  public func queuedMoveOrigin(ofNodeID id: NodeID) throws -> CloudObjectRef? {
    guard let move = try outstandingOperations(ofNode: id).first(where: { $0.kind == .move })
    else { return nil }
    return try decodePayload(move.payload).origin
  }

  /// With `depsQueued`, the caller knows every operation in `deps` is queued (it read or
  /// inserted it in this transaction): the dependency rows go in without checking.
  func insertOperation(
    kind: PushOperationKind, nodeID: NodeID?, cloudID: String?, payload: PushPayload?,
    dependsOn deps: [Int64], depsQueued: Bool = false, createdAt: Double? = nil
  ) throws -> Int64 {
    let now = Date().timeIntervalSinceReferenceDate
    try rawExecute(
      Self.insertOperationSQL,
      [
        userID, kind.rawValue, nodeID, cloudID, payload.map(PushPayloadJSON.encode) ?? "{}", now,
        createdAt ?? now,
      ])
    let id = connection.rawLastInsertedRowID
    for dep in deps {
      if depsQueued {
        try rawExecute(Self.insertDependencySQL, [id, dep])
      } else {
        try addDependency(id, dependsOn: dep)
      }
    }
    return id
  }
  private static let insertDependencySQL = CatalogSQL(
    "INSERT OR IGNORE INTO pushOperationDeps (opID, dependsOnOpID) VALUES (?, ?)")

  private static let insertOperationSQL = CatalogSQL(
    """
    INSERT INTO pushOperations (localUserID, kind, nodeID, cloudID, payload, nextAttemptAt,
      createdAt)
    VALUES (?, ?, ?, ?, ?, ?, ?)
    """)

  func addDependency(_ opID: Int64, dependsOn other: Int64) throws {
    guard opID != other else { return }
    // Only on an operation still queued (a finished one is gone: nothing to wait for).
    try rawExecute(Self.addDependencySQL, [opID, other])
  }
  private static let addDependencySQL = CatalogSQL(
    """
    INSERT OR IGNORE INTO pushOperationDeps (opID, dependsOnOpID)
    SELECT ?, id FROM pushOperations WHERE id = ?
    """)

  func deleteOperation(_ id: Int64) throws {
    try rawExecute(Self.deleteOperationSQL, [id])
    try deleteDependencies(of: id)
  }
  private static let deleteOperationSQL = CatalogSQL("DELETE FROM pushOperations WHERE id = ?")

  /// Removes an operation's dependency rows, both ways (the catalog runs without foreign-key
  /// actions: see ``Catalog``): what waits for it is released.
  func deleteDependencies(of id: Int64) throws {
    try rawExecute(Self.deleteOwnDependenciesSQL, [id])
    try rawExecute(Self.deleteTheirDependenciesSQL, [id])
  }
  private static let deleteOwnDependenciesSQL = CatalogSQL(
    "DELETE FROM pushOperationDeps WHERE opID = ?")
  private static let deleteTheirDependenciesSQL = CatalogSQL(
    "DELETE FROM pushOperationDeps WHERE dependsOnOpID = ?")

  /// The operation that first uploads `node`, while it has never been uploaded: its oldest
  /// outstanding `putRcrd`. `nil` for trunks and uploaded nodes.
  func firstUploadOperation(of node: Node) throws -> Int64? {
    guard node.trunk == nil, node.eTagRcrd == nil else { return nil }
    try queueDeferredUpload(node.id)
    return try rawInt(Self.firstUpload, [node.id])
  }

  // MARK: Enqueue rules

  /// Enqueues an RCRD upload unless one is pending; waits for an RCRD upload in flight and for
  /// moves of the node.
  @discardableResult
  func enqueuePutRcrd(_ node: Node) throws -> Int64 {
    var ops = try outstandingOperations(ofNode: node.id)
    return try enqueuePutRcrd(node, ops: &ops)
  }

  /// ``enqueuePutRcrd(_:)`` given the node's outstanding operations, which gain the one it
  /// enqueues.
  @discardableResult
  private func enqueuePutRcrd(_ node: Node, ops: inout [NodeOp]) throws -> Int64 {
    if let pending = ops.first(where: { $0.kind == .putRcrd && $0.state == .pending }) {
      return pending.id
    }
    let deps = ops.filter { ($0.kind == .putRcrd && $0.state == .inFlight) || $0.kind == .move }
    let id = try insertOperation(
      kind: .putRcrd, nodeID: node.id, cloudID: node.cloudID, payload: nil,
      dependsOn: deps.map(\.id))
    ops.append(NodeOp(id: id, kind: .putRcrd, state: .pending, payload: "{}"))
    return id
  }

  /// Enqueues an upload of the node's DATA, coalesced into the node's pending one if any (whose
  /// `generation` and `createdAt` are then bumped). Returns the operation's id.
  ///
  /// The upload waits for the node's first RCRD upload, for a DATA upload in flight and for
  /// moves of the node.
  @discardableResult
  public func queueDataUpload(nodeID: NodeID) throws -> Int64 {
    try journaled(
      { try queueDataUploadUnjournaled(nodeID: nodeID) }, { _ in .queueDataUpload(nodeID) })
  }

  /// Stores new content of a node — its data size and, unless `nil`, mtime — and queues its
  /// uploads: the RCRD when they changed, and the DATA (each coalesced into a pending one). The
  /// same as ``updateNode(_:)`` with those fields followed by ``queueDataUpload(nodeID:)``, in one
  /// small journal record: what `close(2)` of a written file stores.
  @discardableResult
  public func commitData(nodeID: NodeID, size: UInt64, mtime: FileTime?) throws -> Node {
    try journaled(
      { try commitDataUnjournaled(nodeID: nodeID, size: size, mtime: mtime) },
      { _ in .commitData(nodeID, size: size, mtime: mtime) })
  }

  private func commitDataUnjournaled(nodeID: NodeID, size: UInt64, mtime: FileTime?) throws
    -> Node
  {
    try requireWritable()
    var node = try existingNode(id: nodeID)
    guard node.trunk == nil else { throw CatalogError.invalidOperation("trunks have no data") }
    let changed = node.dataSize != size || (mtime != nil && mtime != node.mtime)
    if changed {
      node.dataSize = size
      if let mtime { node.mtime = mtime }
      if !changeHeld(node) {
        try rawExecute(
          Self.commitDataSQL, [Int64(bitPattern: size), node.mtime.totalNanoseconds, nodeID])
      }
      sharedNodes?.put(node)
      try check("updateNode.afterUpdate")
    }
    // A new node whose first upload waits for the batch: its DATA upload goes with it.
    if isDeferred(nodeID) {
      try deferDataUpload(nodeID)
      return node
    }
    // Read once for both enqueue rules.
    var ops = try outstandingOperations(ofNode: nodeID)
    if changed { try enqueuePutRcrd(node, ops: &ops) }
    _ = try queueDataUpload(node, ops: ops)
    return node
  }

  private static let commitDataSQL = CatalogSQL(
    "UPDATE nodes SET dataSize = ?, mtime = ? WHERE id = ?")
  private static let coalesceDataUploadSQL = CatalogSQL(
    "UPDATE pushOperations SET generation = generation + 1, createdAt = ? WHERE id = ?")

  private func queueDataUploadUnjournaled(nodeID: NodeID) throws -> Int64 {
    try requireWritable()
    let node = try existingNode(id: nodeID)
    guard node.trunk == nil else { throw CatalogError.invalidOperation("trunks have no data") }
    return try queueDataUpload(node, ops: try outstandingOperations(ofNode: nodeID))
  }

  /// The DATA enqueue rule, given the node's outstanding operations.
  private func queueDataUpload(_ node: Node, ops: [NodeOp]) throws -> Int64 {
    let nodeID = node.id
    if let pending = ops.first(where: { $0.kind == .putData && $0.state == .pending }) {
      try rawExecute(
        Self.coalesceDataUploadSQL, [Date().timeIntervalSinceReferenceDate, pending.id])
      try check("queueDataUpload.afterEnqueue")
      return pending.id
    }
    let deps = ops.filter {
      ($0.kind == .putRcrd && node.eTagRcrd == nil) || $0.kind == .putData || $0.kind == .move
    }
    let id = try insertOperation(
      kind: .putData, nodeID: nodeID, cloudID: node.cloudID, payload: nil,
      dependsOn: deps.map(\.id))
    try check("queueDataUpload.afterEnqueue")
    return id
  }

  /// True when a rename of `node` may need no operation of its own (in place, never uploaded):
  /// then its operations tell (``renameJoinsFirstUpload(_:sameParent:ops:)``).
  static func renameMayJoinFirstUpload(_ node: Node, sameParent: Bool) -> Bool {
    sameParent && node.eTagRcrd == nil && node.eTagData == nil
  }

  /// True when a rename of `node` in place needs no operation of its own: the node was never
  /// uploaded and its first upload (`ops`: its outstanding operations) has not started, so
  /// that upload goes to the new name and keeps waiting for the same parent.
  static func renameJoinsFirstUpload(_ node: Node, sameParent: Bool, ops: [NodeOp]) -> Bool {
    guard renameMayJoinFirstUpload(node, sameParent: sameParent),
      let first = ops.first(where: { $0.kind == .putRcrd })
    else { return false }
    return first.state == .pending
  }

  /// The move rules (see the module documentation). `known`: the node's outstanding
  /// operations, when the caller has just read them.
  func enqueueMove(
    _ node: Node, from old: CloudObjectRef, newParent: Node, sameParent: Bool,
    operations known: [NodeOp]? = nil
  ) throws {
    let ops = try known ?? outstandingOperations(ofNode: node.id)
    if Self.renameJoinsFirstUpload(node, sameParent: sameParent, ops: ops) { return }
    let parentUpload = try firstUploadOperation(of: newParent)
    guard let current = try objectLocation(of: node.id) else { return }
    if node.eTagRcrd == nil {
      if let first = ops.first(where: { $0.kind == .putRcrd }), first.state == .pending {
        // Never uploaded: the pending first upload goes to the current location, and now
        // waits for the new parent's first upload instead of the old parent's.
        let stmt = try db.cachedStatement(sql: "DELETE FROM pushOperationDeps WHERE opID = ?")
        try rawExecute(stmt, [first.id])
        if let parentUpload { try addDependency(first.id, dependsOn: parentUpload) }
        // A node uploaded again after a remote delete may keep DATA found at its former keys
        // (its content is not here to upload): the first upload carries it (`origin`).
        guard node.eTagData != nil else { return }
        var payload = try decodePayload(first.payload)
        if payload.origin == nil, !ops.contains(where: { $0.kind == .putData }) {
          payload.origin = old
          let update = try db.cachedStatement(
            sql: "UPDATE pushOperations SET payload = ? WHERE id = ?")
          try update.execute(arguments: [PushPayloadJSON.encode(payload), first.id])
        }
        return
      }
      if ops.isEmpty { return }  // nothing in the cloud and nothing on its way there
    }
    if let pendingMove = ops.first(where: { $0.kind == .move && $0.state == .pending }) {
      let payload = try decodePayload(pendingMove.payload)
      if payload.origin?.rcrdKey == current.rcrdKey, payload.written == nil {
        // Back where it was: no move left to do, but the RCRD (name) may have changed.
        try deleteOperation(pendingMove.id)
        try enqueuePutRcrd(node)
      } else if payload.origin?.rcrdKey == current.rcrdKey {
        // Back where it was, but an attempt of the move wrote elsewhere: the move stays, to
        // write the RCRD in place and clean up what it wrote.
        if let parentUpload { try addDependency(pendingMove.id, dependsOn: parentUpload) }
      } else if let parentUpload {
        try addDependency(pendingMove.id, dependsOn: parentUpload)
      }
      return
    }
    if old.rcrdKey == current.rcrdKey {
      // Same keys (a rename that changes only case): only the RCRD's content changes.
      try enqueuePutRcrd(node)
      return
    }
    var deps = ops.filter { $0.state == .inFlight }.map(\.id)
    if let parentUpload { deps.append(parentUpload) }
    var from = old
    if ops.contains(where: { $0.kind == .move }) {
      // A move of the node is in flight: this one starts at that move's target, where nothing
      // is known yet (the node's eTags are those of the objects at that move's origin). That
      // move records what it wrote there when it completes.
      from.eTagRcrd = nil
      from.eTagData = nil
    }
    let moveID = try insertOperation(
      kind: .move, nodeID: node.id, cloudID: node.cloudID, payload: PushPayload(origin: from),
      dependsOn: deps)
    for op in ops where op.state == .pending && (op.kind == .putRcrd || op.kind == .putData) {
      try addDependency(op.id, dependsOn: moveID)
    }
  }

  struct DeletePlan {
    var objects: [CloudObjectRef] = []
    var dirPrefixes: [String] = []
    var inCloudIDs: [NodeID] = []
    var waitFor: [Int64] = []
    var drop: [Int64] = []
  }

  func planDelete(_ entries: [SubtreeEntry]) throws -> DeletePlan {
    var plan = DeletePlan()
    var seenKeys = Set<String>()
    // A node whose first upload was deferred has no operation (`deleteRows` forgets it).
    for e in entries where !isDeferred(e.id) {
      let ops = try outstandingOperations(ofNode: e.id)
      let inFlight = ops.filter { $0.state == .inFlight }
      plan.waitFor += inFlight.map(\.id)
      plan.drop += ops.filter { $0.state == .pending }.map(\.id)
      guard e.eTagRcrd != nil || !inFlight.isEmpty, let parentPrefix = e.parentDirPrefix else {
        continue
      }
      plan.inCloudIDs.append(e.id)
      plan.dirPrefixes.append(e.dirPrefix)
      let moves = ops.filter { $0.kind == .move }
      var refs = [
        objectRef(
          nodeID: e.id, cloudID: e.cloudID, dirPrefix: parentPrefix, cloudName: e.cloudName,
          eTagRcrd: moves.isEmpty ? e.eTagRcrd : nil, eTagData: moves.isEmpty ? e.eTagData : nil)
      ]
      for m in moves {
        let payload = try decodePayload(m.payload)
        if let origin = payload.origin { refs.append(origin) }
        refs += payload.written ?? []
      }
      for r in refs where seenKeys.insert(r.rcrdKey).inserted { plan.objects.append(r) }
    }
    return plan
  }

  func enqueueDelete(root: Node, plan: DeletePlan) throws {
    for id in plan.drop { try deleteOperation(id) }
    guard !plan.inCloudIDs.isEmpty else { return }
    let leaf = plan.inCloudIDs == [root.id]
    _ = try insertOperation(
      kind: leaf ? .deleteLeaf : .deleteNode, nodeID: root.id, cloudID: root.cloudID,
      payload: PushPayload(objects: plan.objects, dirPrefixes: leaf ? nil : plan.dirPrefixes),
      dependsOn: plan.waitFor)
  }

  // MARK: Push manager queries

  /// Pending operations whose retry time has come, whose dependencies have all completed and
  /// (with `settledBefore`) that were queued or last coalesced no later than that, oldest first.
  public func readyOperations(limit: Int, now: Date = Date(), settledBefore: Date? = nil) throws
    -> [PushOperation]
  {
    // New nodes' first uploads are queued once they are as settled as the operations asked
    // for, a slice at a time: after a copy of many files the writer is not held for seconds.
    try queueDeferredUploads(madeBefore: settledBefore, limit: Self.deferredUploadsPerRead)
    let stmt = try db.cachedStatement(
      sql: """
        SELECT \(Self.operationColumns) FROM pushOperations o
        WHERE localUserID = ? AND state = 'pending' AND nextAttemptAt <= ? AND createdAt <= ?
          AND NOT EXISTS (SELECT 1 FROM pushOperationDeps d WHERE d.opID = o.id)
        ORDER BY id LIMIT ?
        """)
    var out: [PushOperation] = []
    let cursor = try Row.fetchCursor(
      stmt,
      arguments: [
        userID, now.timeIntervalSinceReferenceDate,
        (settledBefore ?? now).timeIntervalSinceReferenceDate, limit,
      ])
    while let row = try cursor.next() { out.append(try decodeOperation(row)) }
    return out
  }

  /// The most deferred first uploads one ``readyOperations(limit:now:settledBefore:)`` queues.
  static let deferredUploadsPerRead = 1_024

  /// One operation, or `nil`.
  public func operation(id: Int64) throws -> PushOperation? {
    let stmt = try db.cachedStatement(
      sql: "SELECT \(Self.operationColumns) FROM pushOperations WHERE id = ? AND +localUserID = ?")
    return try Row.fetchOne(stmt, arguments: [id, userID]).map(decodeOperation)
  }

  /// The generation of an outstanding operation (see ``PushOperation/generation``), or `nil`
  /// when it is gone: ``operation(id:)`` without decoding the rest.
  public func operationGeneration(id: Int64) throws -> Int64? {
    try rawInt(Self.operationGenerationSQL, [id, userID])
  }
  private static let operationGenerationSQL = CatalogSQL(
    "SELECT generation FROM pushOperations WHERE id = ? AND +localUserID = ?")

  /// Whether an operation is still outstanding.
  public func operationExists(id: Int64) throws -> Bool {
    try operationGeneration(id: id) != nil
  }

  /// The upload state recorded in an outstanding operation (its
  /// ``PushOperation/multipartState``), or `nil` when it has none or is gone.
  public func operationUploadState(id: Int64) throws -> Data? {
    var out: Data?
    try rawQuery(Self.operationUploadStateSQL, [id, userID]) { s in
      out = RawColumn.text(s, 0).map { Data($0.utf8) }
      return false
    }
    return out
  }
  private static let operationUploadStateSQL = CatalogSQL(
    "SELECT multipartState FROM pushOperations WHERE id = ? AND +localUserID = ?")

  /// The outstanding (pending or in-flight) operations of a node, oldest first.
  public func pendingOperations(forNodeID nodeID: NodeID) throws -> [PushOperation] {
    try queueDeferredUpload(nodeID)
    let stmt = try db.cachedStatement(
      sql: """
        SELECT \(Self.operationColumns) FROM pushOperations
        WHERE nodeID = ? AND +localUserID = ? ORDER BY id
        """)
    return try Row.fetchAll(stmt, arguments: [nodeID, userID]).map(decodeOperation)
  }

  /// Every outstanding operation of the user, oldest first.
  public func allOperations() throws -> [PushOperation] {
    try queueDeferredUploads()
    let stmt = try db.cachedStatement(
      sql: "SELECT \(Self.operationColumns) FROM pushOperations WHERE localUserID = ? ORDER BY id")
    return try Row.fetchAll(stmt, arguments: [userID]).map(decodeOperation)
  }

  /// The outstanding move operations of the user, oldest first. The deferred first uploads
  /// stay deferred: a node whose first upload waits has no move (a full scan reads these
  /// while a copy may be running).
  public func moveOperations() throws -> [PushOperation] {
    let stmt = try db.cachedStatement(
      sql: """
        SELECT \(Self.operationColumns) FROM pushOperations
        WHERE localUserID = ? AND kind = ? ORDER BY id
        """)
    return try Row.fetchAll(stmt, arguments: [userID, PushOperationKind.move.rawValue]).map(
      decodeOperation)
  }

  /// The number of outstanding operations of the user, the uploads of new nodes not queued
  /// yet included.
  public func operationCount() throws -> Int {
    let stmt = try db.cachedStatement(
      sql: "SELECT COUNT(*) FROM pushOperations WHERE localUserID = ?")
    return try (Int.fetchOne(stmt, arguments: [userID]) ?? 0) + deferredOperationCount()
  }

  /// How many operations have failed at least once (and wait to be retried).
  public func retryingOperationCount() throws -> Int {
    let stmt = try db.cachedStatement(
      sql: "SELECT COUNT(*) FROM pushOperations WHERE localUserID = ? AND attempts > 0")
    return try Int.fetchOne(stmt, arguments: [userID]) ?? 0
  }

  /// The ids of the uncompleted operations `id` waits for.
  public func dependencies(ofOperation id: Int64) throws -> [Int64] {
    let stmt = try db.cachedStatement(
      sql: "SELECT dependsOnOpID FROM pushOperationDeps WHERE opID = ? ORDER BY dependsOnOpID")
    return try Int64.fetchAll(stmt, arguments: [id])
  }

  /// True when the node has local changes not yet in the cloud (any outstanding operation).
  public func isDirty(nodeID: NodeID) throws -> Bool {
    try queueDeferredUpload(nodeID)
    let stmt = try db.cachedStatement(
      sql: "SELECT EXISTS (SELECT 1 FROM pushOperations WHERE nodeID = ? AND +localUserID = ?)")
    return try Bool.fetchOne(stmt, arguments: [nodeID, userID]) ?? false
      || hasStoredDeferredUpload(nodeID)
  }

  /// Marks a pending operation as taken by the push manager.
  public func markInFlight(_ id: Int64) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: """
        UPDATE pushOperations SET state = 'inFlight'
        WHERE id = ? AND +localUserID = ? AND state = 'pending'
        """)
    try rawExecute(stmt, [id, userID])
    if connection.rawChangesCount == 0 { throw CatalogError.operationNotFound(id) }
  }

  /// Removes a finished operation, releasing the operations that wait for it.
  public func completeOperation(id: Int64) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: "DELETE FROM pushOperations WHERE id = ? AND +localUserID = ?")
    try rawExecute(stmt, [id, userID])
    if connection.rawChangesCount == 0 { throw CatalogError.operationNotFound(id) }
    try deleteDependencies(of: id)
  }

  /// Returns a failed operation to the queue, not to be retried before `retryAt`, counting the
  /// attempt. An operation on a node deleted meanwhile is dropped instead (the delete supersedes
  /// it).
  public func failOperation(id: Int64, retryAt: Date) throws {
    try requireWritable()
    guard let op = try operation(id: id) else { throw CatalogError.operationNotFound(id) }
    if try isOrphan(op) {
      try deleteOperation(id)
      return
    }
    let stmt = try db.cachedStatement(
      sql: """
        UPDATE pushOperations SET state = 'pending', attempts = attempts + 1, nextAttemptAt = ?
        WHERE id = ?
        """)
    try rawExecute(stmt, [retryAt.timeIntervalSinceReferenceDate, id])
  }

  /// After a restart: returns every in-flight operation of the user to pending (dropping those
  /// whose node was deleted meanwhile). Returns how many were returned or dropped.
  @discardableResult
  public func resetInFlightOperations() throws -> Int {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: """
        SELECT \(Self.operationColumns) FROM pushOperations
        WHERE localUserID = ? AND state = 'inFlight'
        """)
    let ops = try Row.fetchAll(stmt, arguments: [userID]).map(decodeOperation)
    for op in ops {
      if try isOrphan(op) {
        try deleteOperation(op.id)
      } else {
        try db.execute(
          sql: "UPDATE pushOperations SET state = 'pending' WHERE id = ?", arguments: [op.id])
      }
    }
    return ops.count
  }

  /// Stores (or clears) the push manager's multipart resume state of an operation.
  public func setMultipartState(_ state: Data?, forOperation id: Int64) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: "UPDATE pushOperations SET multipartState = ? WHERE id = ? AND +localUserID = ?")
    try rawExecute(stmt, [state.map { String(decoding: $0, as: UTF8.self) }, id, userID])
    if connection.rawChangesCount == 0 { throw CatalogError.operationNotFound(id) }
  }

  private func isOrphan(_ op: PushOperation) throws -> Bool {
    switch op.kind {
    case .putRcrd, .putData, .move:
      guard let nodeID = op.nodeID else { return true }
      return try node(id: nodeID) == nil
    case .deleteLeaf, .deleteNode:
      return false
    }
  }
}
