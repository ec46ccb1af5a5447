import CSodium
import Foundation
import Logging
import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// The push manager's private state of a move, kept in the operation's `multipartState` (JSON).
struct MoveState: Codable, DefaultInitializable {
  /// A copy of the node's DATA made by this move.
  struct Copy: Codable {
    /// The eTag of the origin's DATA that was copied.
    var source: String
    /// The eTag of the copy (nil while the copy's answer is awaited: a copy has its source's
    /// eTag in stores whose eTags hash the content).
    var copy: String?

    /// The eTag the copy has in the store.
    var eTag: String { copy ?? source }
  }

  /// The origin RCRD key that `claims` and `releasing` are about.
  var origin: String?
  /// Digests of the claim bodies this move put over the origin RCRD.
  var claims: [String] = []
  /// A delete of the claimed origin RCRD was sent (it may have landed): once the origin is
  /// gone, the move is committed to `committedRcrd`.
  var releasing = false
  /// The target RCRD and DATA keys the move was committed to.
  var committedRcrd: String?
  var committedData: String?
  /// Digests of the RCRD bodies this move put at targets.
  var bodies: [String] = []
  /// Target RCRD keys where another device's RCRD of the node was found (it moved the node to
  /// the same place).
  var peers: [String] = []
  /// DATA copies this move made, by target DATA key.
  var copies: [String: Copy] = [:]
  /// An RCRD eTag at the origin that is neither known here nor a claim of this move, and when
  /// it was first seen (for the claim lease).
  var blockedETag: String?
  var blockedSince: Date?

  /// A fresh state for a new origin (what was written at targets is still known).
  mutating func restart(origin key: String) {
    self = MoveState(origin: key, bodies: bodies, peers: peers, copies: copies)
  }

  static func remember(_ digest: String, in list: inout [String]) {
    list.append(digest)
    if list.count > 16 { list.removeFirst(list.count - 16) }
  }
}

/// One run of a `move` operation.
///
/// Two devices may move one node at the same time: both find it at the origin, both write its
/// RCRD at their own target. Exactly one of them may then remove the origin, and that decides
/// the race: a move **commits** by claiming the origin RCRD (putting a fresh encoding of it,
/// `If-Match` the eTag this device knows, and remembering the new body's digest first) and then
/// deleting it `If-Match` the claim. Whoever finds the origin gone, or claimed by someone else,
/// without having released it itself has lost: it removes what it wrote at its target (unless
/// the other device put the node at the same place, which is then where the move ends) and
/// waits for a pull to show where the node went; the pull points the move's origin there and
/// the move runs again from that place (the last mover wins). The origin's DATA is copied
/// before the commit and deleted only after it, so the winner always has it.
final class MoveRun {
  let x: PushExecutor
  let node: Node
  let target: CloudObjectRef
  let origin: CloudObjectRef
  var state: MoveState
  var written: [CloudObjectRef]

  var context: SyncContext { x.context }
  var store: any CloudStore { x.store }
  var opID: Int64 { x.op.id }

  init(_ x: PushExecutor, node: Node, target: CloudObjectRef, origin: CloudObjectRef) {
    self.x = x
    self.node = node
    self.target = target
    self.origin = origin
    state = x.loadUploadState(MoveState.self)
    written = x.op.payload.written ?? []
  }

  /// Stores the state and the targets written, in one transaction. When the node was deleted
  /// here meanwhile, the delete (planned with the targets written before it, and waiting for
  /// this move) learns of the others too: whether this move completes or is dropped, nothing
  /// it wrote is left behind (e.g. a target RCRD marked `arriving`, which no pull applies and no
  /// delete of another device removes).
  func save() throws {
    let data = try JSONEncoder().encode(state)
    try x.write { tx in
      try tx.setMultipartState(data, forOperation: opID)
      try tx.setMoveWritten(written, forOperation: opID)
      if try tx.node(id: node.id) == nil {
        try tx.addDeleteObjects(written, cloudID: node.cloudID)
      }
    }
  }

  func run() throws {
    try deferUntilTargetDirectoryUploaded()
    if state.origin != origin.rcrdKey {
      // A pull pointed the move at another origin: a claim this move left at the former one
      // (a stale copy of the node's RCRD there) goes, then the move starts afresh.
      if let former = state.origin, !state.claims.isEmpty, !state.releasing {
        try removeClaim(at: former)
      }
      state.restart(origin: origin.rcrdKey)
      try save()
    }
    if origin.rcrdKey == target.rcrdKey {
      try cleanUp(except: [target.rcrdKey])
      return try inPlace()
    }
    // 0. The node must still be at the origin (or this move released it there already).
    let at = try context.fetchRcrd(origin.rcrdKey)
    if at?.decoded?.cloudID != node.cloudID {
      if state.releasing { return try committedEarlier() }
      try yield("node \(node.id) left the origin of its move")
    }
    // Targets written by earlier attempts, where the node no longer goes.
    try cleanUp(except: [target.rcrdKey, origin.rcrdKey])
    // 1. The RCRD at the target, marked `arriving` until the move commits. It describes the
    // DATA the move carries there: while a local DATA upload of the node is outstanding (it
    // follows the move), with the origin's size.
    var described = node
    if let meta = at?.decoded?.meta,
      try context.catalog.read(
        context.userID, { try $0.outstandingKinds(ofNodeID: node.id).contains(.putData) })
    {
      described.dataSize = meta.dataSize
    }
    switch try putTarget(described, markPeers: true, arriving: true) {
    case .pathConflict:
      try x.resolveMovePathConflict(node)
      throw PushIssue.retryNow
    case .written: break
    }
    // 2. The DATA copied (the origin's stays until the move is committed).
    try copyData()
    // 3. The commit: claim the origin RCRD, then delete it.
    try commit()
    // 4. The origin's DATA goes (copied again if it changed meanwhile), and the target's RCRD
    // loses its `arriving` mark: it is the node's place now.
    try finishData(origin: origin.dataKey, target: target.dataKey)
    let eTagData = try dataETag()
    let carried = try carriedData(eTag: eTagData, at: target.dataKey)
    try complete(
      eTagRcrd: try settle(
        target.rcrdKey, dataSize: describedSize(eTagData: eTagData, carried: carried)),
      eTagData: eTagData, carried: carried)
  }

  // MARK: Steps

  /// The target's directory must be in the store before the node goes there: a tree walk (a
  /// full scan elsewhere) reaches a node only through its directory. A move queued while the
  /// directory's first upload is outstanding waits for it (an enqueue rule), but a move taken
  /// earlier that runs again — towards the node's newer place, when the node moved on while it
  /// was in flight — did not: committed under a directory not uploaded yet (e.g. one whose first
  /// upload met a spurious 412 and waits for pulls), the node was found nowhere by another
  /// device's full scan, which took it for deleted (with a local change there, uploaded again as
  /// new: two RCRDs of one node; randomized seed 17833). The move now waits for that upload.
  private func deferUntilTargetDirectoryUploaded() throws {
    guard target.rcrdKey != origin.rcrdKey else { return }
    // On the writer: a new directory's first upload not queued yet is queued by the asking.
    let upload = try context.catalog.read(context.userID, onWriter: true) { tx -> Int64? in
      guard let parent = try tx.node(dirPrefix: target.dirPrefix), parent.trunk == nil,
        parent.eTagRcrd == nil
      else { return nil }
      return try tx.pendingOperations(forNodeID: parent.id).first { $0.kind == .putRcrd }?.id
    }
    guard let upload else { return }
    if try x.write({ tx in try tx.deferOperation(id: opID, until: upload) }) {
      context.logger.info(
        "move: its target's directory is not uploaded yet; the move waits for it",
        metadata: ["node": "\(node.id)"])
      throw PushIssue.deferred
    }
  }

  /// The target keys are the origin's (a case-only rename, a move back, or a move that ended
  /// where another device put the node): only the RCRD is written — `If-Match` the eTag known
  /// there. The node must still be there: an RCRD gone from the origin means that another
  /// device moved the node on or deleted it (a pull tells which); writing it `If-None-Match`
  /// would bring it back beside the other device's RCRD of it (two RCRDs of one node).
  private func inPlace() throws {
    let condition: WriteCondition =
      (origin.eTagRcrd ?? node.eTagRcrd).map { .ifMatch($0) } ?? .ifNoneMatch
    switch try putTarget(node, markPeers: false, arriving: false, condition: condition) {
    case .pathConflict:
      try x.resolveMovePathConflict(node)
      throw PushIssue.retryNow
    case .written(let e):
      try complete(eTagRcrd: e, eTagData: node.eTagData, carried: nil)
    }
  }

  private func putTarget(
    _ node: Node, markPeers: Bool, arriving: Bool, condition: WriteCondition = .ifNoneMatch
  ) throws -> PushExecutor.RcrdPutResult {
    if !written.contains(where: { $0.rcrdKey == target.rcrdKey }) {
      written.append(
        CloudObjectRef(
          nodeID: node.id, cloudID: node.cloudID, dirPrefix: target.dirPrefix,
          cloudName: target.cloudName, rcrdKey: target.rcrdKey, dataKey: target.dataKey))
    }
    let key = target.rcrdKey
    return try x.putRcrd(
      node: node, key: key, condition: condition, arriving: arriving,
      remember: { body in
        MoveState.remember(BodyDigest.of(body), in: &state.bodies)
        try save()
      },
      isOurs: { state.bodies.contains(BodyDigest.of($0)) },
      foreign: { _, remote -> Node? in
        if remote.meta.moving {
          throw PushIssue.needsPull("the node is being moved away from the target of its move")
        }
        // Another device moved the node to the same place.
        if markPeers, !state.peers.contains(key) {
          state.peers.append(key)
          try save()
        }
        return nil
      })
  }

  /// Copies the origin's DATA to the target unless the copy there is of the current version.
  private func copyData() throws {
    try copy(from: origin.dataKey, to: target.dataKey)
  }

  /// Copies the node's DATA at `source` to `destination` (unless the copy there is of that
  /// version). Returns false, copying nothing, when the object at `source` is not the node's
  /// DATA: its key was taken by another node since (a move that committed earlier, whose
  /// origin's name another node took afterwards, must not carry that node's DATA away).
  @discardableResult
  private func copy(from source: String, to destination: String) throws -> Bool {
    guard source != destination else { return true }
    for _ in 0..<3 {
      guard let src = try context.headIfExists(source) else { return true }  // nothing to copy
      let dst = try context.headIfExists(destination)
      if let c = state.copies[destination], c.source == src.eTag, dst?.eTag == c.eTag {
        return true
      }
      guard try isNodeData(src, at: source) else { return false }
      // Recorded first: a copy whose answer is lost is still recognised as this move's.
      state.copies[destination] = MoveState.Copy(source: src.eTag, copy: nil)
      try save()
      let copied: String
      do {
        copied = try store.copy(
          from: source, to: destination,
          condition: dst.map { .ifMatch($0.eTag) } ?? .ifNoneMatch)
      } catch StoreError.preconditionFailed {
        continue  // the target changed meanwhile: look again
      } catch StoreError.notFound {
        continue  // the source changed or vanished meanwhile
      }
      // A copy takes whatever the source holds when it runs: if the source changed since the
      // HEAD above, which version was copied is unknown (an empty source: the copy is made
      // again, or read from its header, rather than taken for the version the node knew).
      let after = try context.headIfExists(source)
      state.copies[destination] = MoveState.Copy(
        source: after?.eTag == src.eTag ? src.eTag : "", copy: copied)
      try save()
      return true
    }
    throw StoreError.transient("DATA of node \(node.id) kept changing during its move")
  }

  /// True when `info` at `key` is a version of the node's DATA: one this device knows, or one
  /// its node key opens (another device's edit). Another node's DATA is not.
  private func isNodeData(_ info: ObjectInfo, at key: String) throws -> Bool {
    let known = Set(
      [node.eTagData, origin.eTagData].compactMap { $0 } + state.copies.values.map(\.source))
    if known.contains(info.eTag) { return true }
    switch try store.cloudFileSizes(
      key: key, nodeKey: node.encryptionKey, ciphertextSize: info.size)
    {
    case .success: return true
    case .failure(let error):
      context.logger.warning(
        "move: the DATA at the origin is not the node's; left in place",
        metadata: ["node": "\(node.id)", "error": "\(error)"])
      return false
    }
  }

  /// Claims the origin RCRD and deletes it. Throws (after yielding) when another device
  /// removed or claimed the origin first.
  private func commit() throws {
    guard let at = try context.fetchRcrd(origin.rcrdKey), let decoded = at.decoded,
      decoded.cloudID == node.cloudID
    else {
      if state.releasing { return }
      try yield("node \(node.id) left the origin of its move")
    }
    var claimETag: String
    if state.claims.contains(BodyDigest.of(at.data)) {
      claimETag = at.info.eTag
    } else {
      let known = Set([origin.eTagRcrd, node.eTagRcrd].compactMap { $0 })
      if !known.contains(at.info.eTag) {
        // Another device's claim (its move is committing), or an RCRD change not pulled yet.
        if state.blockedETag == at.info.eTag, let since = state.blockedSince,
          Date().timeIntervalSince(since) >= x.manager.config.moveClaimLease
        {
          context.logger.warning(
            "move: the origin RCRD changed long ago and was never announced; taking it over",
            metadata: ["node": "\(node.id)"])
        } else {
          if state.blockedETag != at.info.eTag {
            state.blockedETag = at.info.eTag
            state.blockedSince = Date()
            try save()
          }
          throw PushIssue.needsPull("the origin of the move of node \(node.id) changed remotely")
        }
      }
      let claim = try Self.reencode(
        decoded, publicKeys: context.publicKeys, userID: node.localUserID, moving: true)
      MoveState.remember(BodyDigest.of(claim), in: &state.claims)
      try save()
      do {
        claimETag = try store.put(
          key: origin.rcrdKey, body: .data(claim), condition: .ifMatch(at.info.eTag))
      } catch StoreError.preconditionFailed {
        if try context.fetchRcrd(origin.rcrdKey)?.info.eTag == at.info.eTag {
          throw StoreError.transient("spurious precondition failure claiming a move's origin")
        }
        throw PushIssue.needsPull("the origin of the move of node \(node.id) changed remotely")
      }
    }
    state.releasing = true
    state.committedRcrd = target.rcrdKey
    state.committedData = target.dataKey
    try save()
    do {
      try store.delete(key: origin.rcrdKey, condition: .ifMatch(claimETag))
    } catch StoreError.preconditionFailed, StoreError.notFound {
      if let now = try context.fetchRcrd(origin.rcrdKey), now.decoded?.cloudID == node.cloudID {
        if state.claims.contains(BodyDigest.of(now.data)) {
          throw StoreError.transient("spurious precondition failure releasing a move's origin")
        }
        // Overwritten before the delete (an RCRD upload elsewhere adopted the claim): not
        // committed; the pull brings the new version, then the move claims it.
        state.releasing = false
        state.committedRcrd = nil
        state.committedData = nil
        try save()
        throw PushIssue.needsPull("the origin of the move of node \(node.id) changed remotely")
      }
      // Gone: released (by this delete or an earlier one of this move; nobody else removes an
      // origin this move claimed).
    }
  }

  /// The origin was released by an earlier run: finish there, or — when the node has moved on
  /// locally since — go on from the target the move was committed to.
  private func committedEarlier() throws {
    guard let rcrdKey = state.committedRcrd, let dataKey = state.committedData else {
      try yield("node \(node.id) left the origin of its move")
    }
    try finishData(origin: origin.dataKey, target: dataKey)
    let eTagData = try context.headIfExists(dataKey)?.eTag
    let carried = try carriedData(eTag: eTagData, at: dataKey)
    let settled = try settle(
      rcrdKey, dataSize: describedSize(eTagData: eTagData, carried: carried))
    if rcrdKey == target.rcrdKey {
      try cleanUp(except: [target.rcrdKey])
      return try complete(eTagRcrd: settled, eTagData: eTagData, carried: carried)
    }
    guard let parsed = context.layout.parse(key: rcrdKey) else {
      throw PushIssue.needsPull("the target of the move of node \(node.id) is not a node's key")
    }
    let data = try context.headIfExists(dataKey)
    let from = CloudObjectRef(
      nodeID: node.id, cloudID: node.cloudID, dirPrefix: parsed.dirPrefix,
      cloudName: parsed.cloudName, rcrdKey: rcrdKey, dataKey: dataKey, eTagRcrd: settled,
      eTagData: data?.eTag)
    written.removeAll { $0.rcrdKey == rcrdKey }
    state.restart(origin: rcrdKey)
    let encoded = try JSONEncoder().encode(state)
    let list = written
    try x.write { tx in
      try tx.setMoveOrigin(from, forNodeID: node.id)
      try tx.setMultipartState(encoded, forOperation: opID)
      try tx.setMoveWritten(list, forOperation: opID)
    }
    throw PushIssue.retryNow
  }

  /// Rewrites the committed target's RCRD without its `arriving` mark (the same content, freshly
  /// encoded) and describing the DATA the move carried there (`dataSize`, when known: it was
  /// written before the commit with the size the node knew, and another device's edit may
  /// have landed at the origin and been carried since); returns its eTag.
  private func settle(_ key: String, dataSize: UInt64?) throws -> String {
    guard let r = try context.fetchRcrd(key), let decoded = r.decoded,
      decoded.cloudID == node.cloudID
    else {
      // Removed after the commit: another device moved the node on or deleted it there (it
      // saw the target once settled, an answer of which was lost here). Its change-log entry
      // may never name this place, so a full scan decides — without seeing this move's
      // other writes, which would count as the node's presence: those go first (their DATA
      // copies stay, as for a lost race). The scan points the move at the node's new place, or
      // applies the delete (which keeps the node: a move is outstanding).
      for ref in written where ref.rcrdKey != key { try undo(ref, keepingData: true) }
      try x.write { tx in try tx.setSyncValue("1", forKey: PullManager.needsFullScanKey) }
      throw PushIssue.needsPull("the target of the committed move of node \(node.id) vanished")
    }
    let size = dataSize ?? decoded.meta.dataSize
    guard decoded.meta.arriving || size != decoded.meta.dataSize else { return r.info.eTag }
    let body = try Self.reencode(
      decoded, publicKeys: context.publicKeys, userID: node.localUserID, moving: false,
      dataSize: size)
    MoveState.remember(BodyDigest.of(body), in: &state.bodies)
    try save()
    do {
      return try store.put(key: key, body: .data(body), condition: .ifMatch(r.info.eTag))
    } catch StoreError.preconditionFailed {
      throw StoreError.transient("a move's target RCRD changed while being settled")
    }
  }

  /// Deletes the origin's DATA once the target holds a copy of its current version.
  private func finishData(origin source: String, target destination: String) throws {
    guard source != destination else { return }
    for _ in 0..<3 {
      guard try copy(from: source, to: destination) else { return }  // another node's DATA
      guard let src = try context.headIfExists(source) else { return }
      guard state.copies[destination]?.source == src.eTag else { continue }
      do {
        try store.delete(key: source, condition: .ifMatch(src.eTag))
        return
      } catch StoreError.preconditionFailed, StoreError.notFound {
        if try context.headIfExists(source) == nil { return }
        // Changed since the copy: copy again.
      }
    }
    throw StoreError.transient("DATA of node \(node.id) kept changing during its move")
  }

  /// The size the target's RCRD describes once settled: that of the DATA carried there; none
  /// when the target holds no DATA of the node (there was none at the origin to carry — e.g. the
  /// node was pulled before its creator's DATA upload landed, which then never did: an RCRD
  /// describing a size would stand beside no content for good; a DATA upload still to come
  /// describes its own size); nil when unknown (the size the RCRD has is kept).
  private func describedSize(eTagData: String?, carried: CloudDataInfo?) -> UInt64? {
    if let carried { return carried.dataSize }
    return eTagData == nil ? 0 : nil
  }

  /// The eTag of the DATA at the target after the move.
  private func dataETag() throws -> String? {
    origin.dataKey == target.dataKey
      ? node.eTagData : try context.headIfExists(target.dataKey)?.eTag
  }

  /// The DATA a move carried to `key` (a copy this move made of the origin's), with its sizes:
  /// known here when it is the version the node knows and has read or uploaded, else read from
  /// its header. Nil without a copy there, or when it cannot be read as the node's.
  private func carriedData(eTag: String?, at key: String) throws -> CloudDataInfo? {
    guard let eTag, key != origin.dataKey, let c = state.copies[key] else { return nil }
    if c.eTag == eTag, c.source == node.eTagData, let info = node.cloudDataInfo,
      info.eTag == c.source
    {
      return info.copied(eTag: eTag, lastModified: info.lastModified)
    }
    return try carriedVersion(eTag: eTag, at: key)
  }

  private func complete(eTagRcrd: String, eTagData: String?, carried data: CloudDataInfo?) throws {
    // The node takes the DATA carried, with its sizes (the target's RCRD was settled describing
    // it): it may be a version this device did not know (another device's edit landed at the
    // origin meanwhile) — unless a local DATA upload is outstanding, which must still meet that
    // version as a remote edit (a data conflict).
    var carried: CloudDataInfo? = nil
    let unknown = state.copies[target.dataKey].map { $0.source != node.eTagData } ?? false
    if let data, origin.dataKey != target.dataKey { carried = data }
    try x.write { tx in
      if let cur = try tx.node(id: node.id) {
        let editing = try tx.outstandingKinds(ofNodeID: node.id).contains(.putData)
        if let carried, !editing {
          try tx.setCloudState(
            nodeID: node.id, eTagRcrd: eTagRcrd, lastModifiedRcrd: Date(),
            eTagData: carried.eTag, lastModifiedData: carried.lastModified,
            cloudDataInfo: carried)
          var n = try tx.existingNode(id: node.id)
          if n.dataSize != carried.dataSize || unknown {
            if n.dataSize != carried.dataSize {
              n.dataSize = carried.dataSize
              n = try tx.updateNode(n)
            }
            context.delegate.didDiscoverModifiedNode(
              n, change: .data, at: try tx.path(of: node.id), transaction: tx)
          }
        } else if eTagData == nil, origin.dataKey != target.dataKey, !editing {
          // No DATA of the node was there to carry: it has none (the target's RCRD says so).
          try tx.setCloudState(
            nodeID: node.id, eTagRcrd: eTagRcrd, lastModifiedRcrd: Date(), eTagData: nil,
            lastModifiedData: nil, cloudDataInfo: nil)
          var n = try tx.existingNode(id: node.id)
          if n.dataSize != 0 {
            n.dataSize = 0
            try tx.applyRemoteNode(n, cloudName: try tx.cloudName(of: node.id))
            context.delegate.didDiscoverModifiedNode(
              n, change: .data, at: try tx.path(of: node.id), transaction: tx)
          }
        } else {
          try tx.setCloudState(
            nodeID: node.id, eTagRcrd: eTagRcrd, lastModifiedRcrd: Date(),
            eTagData: carried != nil && unknown ? cur.eTagData : eTagData ?? cur.eTagData,
            lastModifiedData: cur.lastModifiedData, cloudDataInfo: cur.cloudDataInfo)
        }
      }
      // A move or delete queued while this move ran starts from its target: it learns the
      // eTags written there (else it would take this device's own write for a remote edit).
      try tx.updateMoveOriginETags(
        nodeID: node.id, rcrdKey: target.rcrdKey, eTagRcrd: eTagRcrd, eTagData: eTagData)
      try tx.updateDeleteETags(
        cloudID: node.cloudID, rcrdKey: target.rcrdKey, eTagRcrd: eTagRcrd, eTagData: eTagData)
      try tx.completeOperation(id: opID)
      // A move queued while this one ran started from the target this one had then; this one
      // may have run again since towards the node's newer place (its target is the node's
      // place when taken), and ended here: the node is here now, and that move starts here
      // (else it waits at a key the node never reached, and a pull that checks the node there
      // takes it for deleted — uploaded again as new beside this RCRD: two RCRDs of one node).
      if try tx.pendingOperations(forNodeID: node.id).contains(where: {
        $0.kind == .move && $0.payload.origin?.rcrdKey != target.rcrdKey
      }) {
        try tx.setMoveOrigin(
          CloudObjectRef(
            nodeID: node.id, cloudID: node.cloudID, dirPrefix: target.dirPrefix,
            cloudName: target.cloudName, rcrdKey: target.rcrdKey, dataKey: target.dataKey,
            eTagRcrd: eTagRcrd, eTagData: eTagData), forNodeID: node.id)
        try dropMovesEndingHere(tx)
      }
      try x.manager.log(
        [
          ChangeLogEntry(
            cloudID: node.cloudID, kind: .move, rcrd: target.rcrdKey, data: target.dataKey,
            fromRcrd: origin.rcrdKey, eTagRcrd: eTagRcrd, eTagData: eTagData)
        ], in: tx)
    }
  }

  /// A move queued while this one ran, now starting from this move's target, that never ran
  /// and goes nowhere else (the node is here: this move ran again towards the node's newer
  /// place and ended there) has nothing left to do: it is dropped, and the RCRD is uploaded
  /// again only if the node's name changed since (in case only: the keys are the same).
  /// Left queued, it would write the RCRD in place — after another device may have moved the
  /// node on from here.
  private func dropMovesEndingHere(_ tx: CloudTransaction) throws {
    guard let cur = try tx.node(id: node.id),
      try tx.objectLocation(of: node.id)?.rcrdKey == target.rcrdKey
    else { return }
    let idle = try tx.pendingOperations(forNodeID: node.id).filter { $0.kind == .move }
    guard !idle.isEmpty,
      idle.allSatisfy({
        $0.state == .pending && $0.multipartState == nil && ($0.payload.written ?? []).isEmpty
          && $0.payload.origin?.rcrdKey == target.rcrdKey
      })
    else { return }
    try tx.dropOperations(ofNodeID: node.id, kind: .move)
    if Array(cur.name.utf8) != Array(node.name.utf8) { try tx.queueRcrdUpload(nodeID: node.id) }
    context.logger.info(
      "move: a move queued meanwhile ends where this one did; dropped",
      metadata: ["node": "\(node.id)"])
  }

  /// The DATA at the target, with its sizes, or nil when it cannot be read as the node's.
  private func carriedVersion(eTag: String, at key: String) throws -> CloudDataInfo? {
    guard let info = try context.headIfExists(key), info.eTag == eTag else { return nil }
    guard
      case .success(let sizes) = try store.cloudFileSizes(
        key: key, nodeKey: node.encryptionKey, ciphertextSize: info.size)
    else {
      context.logger.error(
        "move: the DATA carried cannot be read", metadata: ["node": "\(node.id)"])
      return nil
    }
    return CloudDataInfo(sizes, eTag: info.eTag, lastModified: info.lastModified)
  }

  // MARK: Losing the race

  /// The node's RCRD left the origin, or was claimed, without this move: another device moved
  /// (or deleted) the node first. If that device put it where this move goes, the move ends
  /// there; otherwise what this move wrote is removed and a pull tells where the node went
  /// (it points the move's origin there).
  private func yield(_ reason: String) throws -> Never {
    let here = try context.fetchRcrd(target.rcrdKey)
    if let here, here.decoded?.cloudID == node.cloudID,
      state.peers.contains(target.rcrdKey) || !state.bodies.contains(BodyDigest.of(here.data))
    {
      let data = try context.headIfExists(target.dataKey)
      let at = CloudObjectRef(
        nodeID: node.id, cloudID: node.cloudID, dirPrefix: target.dirPrefix,
        cloudName: target.cloudName, rcrdKey: target.rcrdKey, dataKey: target.dataKey,
        eTagRcrd: here.info.eTag, eTagData: data?.eTag)
      written.removeAll { $0.rcrdKey == target.rcrdKey }
      state.restart(origin: target.rcrdKey)
      let encoded = try JSONEncoder().encode(state)
      let list = written
      try x.write { tx in
        try tx.setMoveOrigin(at, forNodeID: node.id)
        try tx.setMultipartState(encoded, forOperation: opID)
        try tx.setMoveWritten(list, forOperation: opID)
      }
      context.logger.info(
        "move: another device moved the node to the same place", metadata: ["node": "\(node.id)"])
      throw PushIssue.retryNow
    }
    // The DATA copies stay: if the node was deleted elsewhere they may be the last copy of its
    // content, which then goes with the node kept here (a node with a change outstanding).
    for ref in written { try undo(ref, keepingData: true) }
    context.logger.info(
      "move: another device moved or deleted the node first", metadata: ["node": "\(node.id)"])
    throw PushIssue.needsPull(reason)
  }

  /// Deletes the RCRD at `key` if it is one of this move's claims.
  private func removeClaim(at key: String) throws {
    guard let r = try context.fetchRcrd(key), state.claims.contains(BodyDigest.of(r.data)) else {
      return
    }
    do {
      try store.delete(key: key, condition: .ifMatch(r.info.eTag))
    } catch StoreError.preconditionFailed, StoreError.notFound {
      if try context.fetchRcrd(key).map({ state.claims.contains(BodyDigest.of($0.data)) }) == true {
        throw StoreError.transient("spurious precondition failure removing a move's claim")
      }
    }
  }

  /// Removes what earlier attempts wrote at targets other than `keep`.
  private func cleanUp(except keep: Set<String>) throws {
    for ref in written where !keep.contains(ref.rcrdKey) { try undo(ref) }
  }

  /// Removes what this move wrote at a target: its RCRD (unless another device's RCRD of the
  /// node is there) and, unless `keepingData`, its DATA copy (if still that version).
  private func undo(_ ref: CloudObjectRef, keepingData: Bool = false) throws {
    if let r = try context.fetchRcrd(ref.rcrdKey), r.decoded?.cloudID == node.cloudID {
      if state.peers.contains(ref.rcrdKey) || !state.bodies.contains(BodyDigest.of(r.data)) {
        return  // the node is there because another device put it there
      }
      do {
        try store.delete(key: ref.rcrdKey, condition: .ifMatch(r.info.eTag))
      } catch StoreError.preconditionFailed, StoreError.notFound {
        if try context.headIfExists(ref.rcrdKey) != nil {
          throw StoreError.transient("a move's target RCRD changed while being removed")
        }
      }
    }
    if keepingData, state.copies[ref.dataKey] != nil { return try save() }
    if let c = state.copies[ref.dataKey], let d = try context.headIfExists(ref.dataKey),
      d.eTag == c.eTag
    {
      do {
        try store.delete(key: ref.dataKey, condition: .ifMatch(d.eTag))
      } catch StoreError.preconditionFailed, StoreError.notFound {
        if try context.headIfExists(ref.dataKey)?.eTag == d.eTag {
          throw StoreError.transient("spurious precondition failure removing a move's copy")
        }
      }
    }
    state.copies[ref.dataKey] = nil
    written.removeAll { $0.rcrdKey == ref.rcrdKey }
    try save()
  }

  /// A fresh encoding of an RCRD as found in the store (same content, new random nonces, so
  /// its bytes are this device's own), marked as a claim or not, never as arriving.
  static func reencode(
    _ r: DecodedRcrd, publicKeys: [String: Data], userID: String, moving: Bool,
    dataSize: UInt64? = nil
  ) throws -> Data {
    let n = Node(
      uuid: "", localUserID: userID, parentID: nil, name: r.meta.name, kind: r.meta.kind,
      shareList: r.shareList, burnDate: r.burnDate, encryptionKey: r.nodeKey,
      dirSalt: r.meta.dirSalt, dirPrefix: r.dirPrefix, cloudID: r.cloudID, mode: r.meta.mode,
      mtime: r.meta.mtime, xattrs: r.meta.xattrs, symlinkTarget: r.meta.symlinkTarget,
      dataSize: dataSize ?? r.meta.dataSize)
    return try Rcrd.encode(node: n, publicKeys: publicKeys, moving: moving)
  }
}

/// BLAKE2b-256 digests of object bodies (base64), to recognise objects this device wrote: an
/// encrypted body is unique (it holds random nonces).
enum BodyDigest {
  static func of(_ data: Data) -> String {
    Sodium.ensureInitialized()
    var out = [UInt8](repeating: 0, count: 32)
    let bytes = [UInt8](data)
    _ = crypto_generichash(&out, 32, bytes, UInt64(bytes.count), nil, 0)
    return Data(out).base64EncodedString()
  }
}
