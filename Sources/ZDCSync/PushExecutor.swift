import Foundation
import Logging
import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// What an RCRD in the store says that a DATA upload checks: whose it is and the size it
/// describes (the object with eTag `eTag`).
struct RcrdSummary: Sendable, Hashable {
  var eTag: String
  var cloudID: String
  var dataSize: UInt64
}

/// The RCRD at a DATA upload's RCRD key, looked at after the upload.
enum RcrdBeside {
  /// No object there.
  case absent
  /// An object that does not decode (kept: the DATA is not taken back for it).
  case undecodable
  /// An RCRD, and what it says.
  case found(RcrdSummary)
}

/// The push manager's private resume state of a DATA upload, kept in the operation's
/// `multipartState` (JSON).
struct DataUploadState: Codable {
  /// Outer headers (base64) of the CloudFiles this operation has tried to put: each is unique
  /// (random nonce prefix), so finding one in the store proves the put landed. The newest
  /// `maxHeaders` are kept — with the 60 s backoff cap, hours of failing attempts; an own upload
  /// older than that is still recognised by its content (`dataConflict`).
  var headers: [String] = []
  /// An unfinished multipart upload.
  var multipart: MultipartState?
  /// The eTag of an object at the node's DATA key that is not the node's DATA (another
  /// node's, or corrupt): the upload replaces it (`If-Match`).
  var overwrite: String?

  struct MultipartState: Codable {
    var uploadID: String
    var key: String
    var file: String
    var generation: Int64
    var partSize: UInt64
    var size: UInt64
    var header: String
  }

  static let maxHeaders = 256

  mutating func remember(_ header: Data) {
    headers.append(header.base64EncodedString())
    if headers.count > Self.maxHeaders { headers.removeFirst(headers.count - Self.maxHeaders) }
  }
}

/// The push manager's private state of a delete, kept in the operation's `multipartState`
/// (JSON): the RCRD keys a delete request was sent for (recorded before sending).
struct DeleteState: Codable, DefaultInitializable {
  var sent: [String] = []
  /// Those of `sent` that held a move's target RCRD marked `arriving`.
  var arriving: [String] = []
}

/// A state type with a fresh value.
protocol DefaultInitializable { init() }

/// The push manager's private state of an RCRD upload, kept in the operation's `multipartState`
/// (JSON): digests of the bodies it has tried to put (each is unique: its encryption nonces are
/// random), so that a 412 caused by its own earlier write (a crash window) is recognised.
struct RcrdUploadState: Codable, DefaultInitializable {
  var bodies: [String] = []
  /// A move's claim found at the key, and when it was first seen (the claim lease).
  var blockedETag: String?
  var blockedSince: Date?
  /// When this first upload asked for a pull before writing again.
  var pullAskedAt: Date?
  /// The eTag of the DATA this first upload is carrying from its payload's `origin` (recorded
  /// before the copy), and the eTag of its copy beside the RCRD.
  var carriedSource: String?
  var carriedCopy: String?

  mutating func remember(_ digest: String) {
    bodies.append(digest)
    if bodies.count > 8 { bodies.removeFirst(bodies.count - 8) }
  }
}

/// Executes one push operation.
struct PushExecutor {
  let manager: PushManager
  let job: PushJob
  var context: SyncContext { manager.context }
  var store: any CloudStore { context.store }
  var op: PushOperation { job.op }

  func execute() throws {
    switch op.kind {
    case .putRcrd: try putRcrd()
    case .putData: try putData()
    case .move:
      guard let node = job.node, let loc = job.location, let origin = op.payload.origin else {
        return try completeOrphan()
      }
      try MoveRun(self, node: node, target: loc, origin: origin).run()
    case .deleteLeaf, .deleteNode: try delete()
    }
  }

  func write<T>(_ body: (CloudTransaction) throws -> T) throws -> T {
    try context.catalog.write(context.userID, body)
  }

  /// A short catalog read that calls no delegate (an operation's state, a node, its queued
  /// operations): on the writer connection, between writes, where no reader snapshot or page
  /// cache is refreshed after every write. Reads that call the delegate, or long ones, use
  /// the reader pool (`context.catalog.read`).
  func look<T>(_ body: (CloudTransaction) throws -> T) throws -> T {
    try context.catalog.read(context.userID, onWriter: true, body)
  }

  /// Completes the operation when its node is gone (deleted locally while in flight). An
  /// earlier attempt may have written the store: the delete that waits for this operation
  /// learns the eTags of what is ours there, so it does not take them for remote edits — and
  /// only of what is ours: an RCRD of the node another device wrote over this operation's write
  /// is a remote edit, which the delete must meet (and keep the node for), not remove.
  private func completeOrphan() throws {
    var found: [(rcrdKey: String, eTagRcrd: String?, eTagData: String?)] = []
    if let cloudID = op.cloudID, op.kind == .putRcrd || op.kind == .putData {
      let refs = try context.catalog.read(context.userID) {
        try $0.deleteOperations(referencing: cloudID).flatMap { $0.payload.objects ?? [] }
      }.filter { $0.cloudID == cloudID }
      let state = op.kind == .putData ? try loadState() : DataUploadState()
      let bodies = op.kind == .putRcrd ? loadUploadState(RcrdUploadState.self).bodies : []
      for ref in refs {
        if op.kind == .putRcrd {
          if let r = try context.fetchRcrd(ref.rcrdKey), r.decoded?.cloudID == cloudID,
            bodies.contains(BodyDigest.of(r.data))
          {
            found.append((ref.rcrdKey, r.info.eTag, nil))
          }
        } else if let mine = try ourUpload(at: ref.dataKey, state: state) {
          found.append((ref.rcrdKey, nil, mine.eTag))
        }
      }
    }
    try write { tx in
      for f in found {
        try tx.updateDeleteETags(
          cloudID: op.cloudID ?? "", rcrdKey: f.rcrdKey, eTagRcrd: f.eTagRcrd, eTagData: f.eTagData)
      }
      if try tx.operationExists(id: op.id) { try tx.completeOperation(id: op.id) }
    }
  }

  // MARK: RCRD

  enum RcrdPutResult {
    case written(String)
    case pathConflict
  }

  /// Puts an RCRD. `remember` is given each body before it is sent (so a later 412 caused by
  /// that very write is recognised by `isOurs`). On 412: the node's own earlier write is
  /// adopted; another device's version of the node's RCRD is passed to `foreign` (which throws
  /// to refrain from overwriting it, or returns the node as it must be written over it) and
  /// then overwritten; another node at the key is a path conflict under `If-None-Match`.
  func putRcrd(
    node: Node, key: String, condition: WriteCondition, arriving: Bool = false,
    remember: (Data) throws -> Void, isOurs: (Data) -> Bool,
    foreign: (ObjectInfo, DecodedRcrd) throws -> Node?
  ) throws -> RcrdPutResult {
    var body = try Rcrd.encode(node: node, publicKeys: context.publicKeys, arriving: arriving)
    try remember(body)
    var described = node
    func written(_ eTag: String) -> RcrdPutResult {
      manager.ownRcrds.put(
        key, RcrdSummary(eTag: eTag, cloudID: described.cloudID, dataSize: described.dataSize))
      return .written(eTag)
    }
    do {
      return written(try store.put(key: key, body: .data(body), condition: condition))
    } catch StoreError.preconditionFailed {
      guard let remote = try context.fetchRcrd(key) else {
        throw PushIssue.needsPull("RCRD of node \(node.id) is gone remotely")
      }
      if let decoded = remote.decoded, decoded.cloudID == node.cloudID {
        if !isOurs(remote.data), let other = try foreign(remote.info, decoded) {
          body = try Rcrd.encode(node: other, publicKeys: context.publicKeys, arriving: arriving)
          try remember(body)
          described = other
        }
        return written(
          try store.put(key: key, body: .data(body), condition: .ifMatch(remote.info.eTag)))
      }
      if case .ifNoneMatch = condition { return .pathConflict }
      throw PushIssue.needsPull("another node holds the key of node \(node.id)")
    }
  }

  /// Renames a never-uploaded node to the first `name n.ext` free here and in the store; or,
  /// when the name in the store differs from its own only in case, to its case variant.
  private func resolvePathConflict(_ node: Node) throws {
    guard let parentID = node.parentID else { return }
    let parent = try context.catalog.read(context.userID) { try $0.existingNode(id: parentID) }
    if try keepAsCaseVariant(node, parent) { return }
    var n = 2
    var chosen: String? = nil
    while chosen == nil && n < 10_000 {
      let candidate = ConflictNames.numbered(node.name, n)
      n += 1
      let localFree = try context.catalog.read(context.userID) {
        try $0.child(of: parentID, named: candidate) == nil
      }
      guard localFree else { continue }
      let cloudName = try CloudName.compute(name: candidate, parentDirSalt: parent.dirSalt)
      let key = context.layout.rcrdKey(dirPrefix: parent.dirPrefix, cloudName: cloudName)
      if try context.headIfExists(key) == nil { chosen = candidate }
    }
    guard let chosen else { throw PushIssue.needsPull("no free name") }
    try write { tx in
      guard let old = try tx.node(id: node.id) else { return }
      let renamed = try tx.renameWithoutMove(node.id, to: chosen)
      context.delegate.didRenameNode(renamed, oldName: old.name, transaction: tx)
      let path = try tx.path(of: node.id)
      context.delegate.didDiscoverConflict(
        .path, node: renamed, other: nil, at: path, transaction: tx)
    }
    context.logger.info("path conflict: node renamed", metadata: ["node": "\(node.id)"])
    manager.requestPull()
  }

  /// Another device stored a name that differs from this never-uploaded node's only in case
  /// (the same cloudName): like the mount, keep both, this one as its case variant (see
  /// ``CaseVariant``) — not a conflict, both names stay as typed. False when that does not
  /// apply (or the variant is taken).
  private func keepAsCaseVariant(_ node: Node, _ parent: Node) throws -> Bool {
    // (A case variant holds a NUL: it is never varied again.)
    guard !node.name.utf8.contains(0) else { return false }
    let here = try CloudName.compute(name: node.name, parentDirSalt: parent.dirSalt)
    guard
      let remote = try context.fetchRcrd(
        context.layout.rcrdKey(dirPrefix: parent.dirPrefix, cloudName: here)),
      let other = remote.decoded?.meta.name, Array(other.utf8) != Array(node.name.utf8),
      NameKey(other) == NameKey(node.name)
    else { return false }
    let variant = CaseVariant.name(for: node.name)
    let localFree = try context.catalog.read(context.userID) {
      try $0.child(of: parent.id, named: variant) == nil
    }
    let cloudName = try CloudName.compute(name: variant, parentDirSalt: parent.dirSalt)
    let key = context.layout.rcrdKey(dirPrefix: parent.dirPrefix, cloudName: cloudName)
    guard localFree, try context.headIfExists(key) == nil else { return false }
    try write { tx in
      guard let old = try tx.node(id: node.id) else { return }
      let renamed = try tx.renameWithoutMove(node.id, to: variant)
      context.delegate.didRenameNode(renamed, oldName: old.name, transaction: tx)
    }
    context.logger.info(
      "name differing only in case: kept beside", metadata: ["node": "\(node.id)"])
    manager.requestPull()
    return true
  }

  private func putRcrd() throws {
    guard let node = job.node, let loc = job.location else { return try completeOrphan() }
    var condition: WriteCondition = node.eTagRcrd.map { .ifMatch($0) } ?? .ifNoneMatch
    // An RCRD describes the DATA beside it (its size): it goes up after the node's DATA upload.
    try deferUntilDataUploaded(node)
    var state = loadUploadState(RcrdUploadState.self)
    var written = node
    // Another device's move of the node is committing (its claim, `eTag`, is at the key): this
    // upload goes where the move takes the node (a pull tells), unless the claim is older than
    // the claim lease (then it returns, and the claim is overwritten).
    func waitForClaim(_ eTag: String) throws {
      if state.blockedETag == eTag, let since = state.blockedSince,
        Date().timeIntervalSince(since) >= manager.config.moveClaimLease
      {
        context.logger.warning(
          "RCRD upload: a move's claim was never released; overwriting it",
          metadata: ["node": "\(node.id)"])
        return
      }
      if state.blockedETag != eTag {
        state.blockedETag = eTag
        state.blockedSince = Date()
        try saveUploadState(state)
      }
      throw PushIssue.needsPull("node \(node.id) is being moved by another device")
    }
    if case .ifMatch = condition, node.eTagData != nil,
      node.cloudDataInfo?.eTag != node.eTagData
    {
      // The DATA there is a version this device took from a pull, with the size of the RCRD
      // it found beside it — which may have described an earlier version (its writer's RCRD
      // upload follows its DATA upload), and a later pull does not bring the size to a node
      // with an RCRD upload pending: the RCRD describes the DATA's own size (its header).
      let size = try dataSize(of: node, loc: loc)
      if size != node.dataSize { written.dataSize = size }
    }
    if case .ifNoneMatch = condition, !state.bodies.isEmpty, manager.hasPullSide,
      let there = try context.fetchRcrd(loc.rcrdKey), let found = there.decoded,
      found.cloudID == node.cloudID
    {
      // An RCRD of the node is there: an earlier attempt of this first upload (its answer lost),
      // or another device's version of the node. It is written over only as it is now
      // (`If-Match`): `If-None-Match` after this look would write the node here again should
      // another device's move take it away in between — two RCRDs of one node (randomized seed
      // 8306).
      if found.meta.moving, !state.bodies.contains(BodyDigest.of(there.data)) {
        try waitForClaim(there.info.eTag)
      }
      condition = .ifMatch(there.info.eTag)
    }
    if case .ifNoneMatch = condition, !state.bodies.isEmpty, manager.hasPullSide,
      try context.headIfExists(loc.rcrdKey) == nil
    {
      // An earlier attempt of this first upload may have landed, been seen elsewhere, and the
      // node moved or deleted there since: it is written again only after a pull (which moves
      // it here, or applies its deletion).
      if let asked = state.pullAskedAt, let pulled = context.progress.snapshot.lastPull,
        pulled > asked
      {
        state.pullAskedAt = nil
      } else {
        if state.pullAskedAt == nil { state.pullAskedAt = Date() }
        try saveUploadState(state)
        throw PushIssue.needsPull("first upload of node \(node.id) may have landed before")
      }
    }
    let result: RcrdPutResult
    do {
      result = try putRcrd(
        node: written, key: loc.rcrdKey, condition: condition,
        remember: { body in
          state.remember(BodyDigest.of(body))
          try saveUploadState(state)
          // Deleted here since the operation was taken (checked after the digest is recorded,
          // just before the put): its DATA upload went with it, so the RCRD would describe a
          // version that is never uploaded. The delete that waits for this operation removes
          // what earlier attempts wrote.
          if try look({ try $0.node(id: node.id) }) == nil { throw NodeDeletedMeanwhile() }
        },
        isOurs: { state.bodies.contains(BodyDigest.of($0)) },
        foreign: { info, remote -> Node? in
          if remote.meta.moving {
            try waitForClaim(info.eTag)
            return nil
          }
          // A first upload meeting the node's own cloudID can only be this device's write.
          guard node.eTagRcrd != nil else { return nil }
          try beforeOverwritingRemoteRcrd(node: node, loc: loc)
          // The local attributes win, with the size of the DATA there (see `dataSize(of:loc:)`).
          let size = try dataSize(of: node, loc: loc)
          guard size != written.dataSize else { return nil }
          var n = written
          n.dataSize = size
          written = n
          return n
        })
    } catch is NodeDeletedMeanwhile {
      return try completeOrphan()
    }
    switch result {
    case .pathConflict:
      if try abandonMoveFromTakenOrigin(node: node, loc: loc) { throw PushIssue.retryNow }
      try resolvePathConflict(node)
      throw PushIssue.retryNow
    case .written(var eTag):
      let carried = try carryData(node: node, to: loc, state: &state)
      let keptDataGone = try keptDataGone(node: node, loc: loc, carried: carried)
      if let size = try replacedDataSize(
        node: node, loc: loc, described: carried?.eTag ?? node.eTagData, size: written.dataSize)
      {
        // Another device replaced the DATA meanwhile (keeping the RCRD: the sizes matched then):
        // the RCRD describes the DATA beside it. The node takes that version with a pull.
        var described = written
        described.dataSize = size
        let body = try Rcrd.encode(node: described, publicKeys: context.publicKeys)
        state.remember(BodyDigest.of(body))
        try saveUploadState(state)
        do {
          eTag = try store.put(key: loc.rcrdKey, body: .data(body), condition: .ifMatch(eTag))
          context.logger.info(
            "RCRD upload: the DATA beside it was replaced meanwhile; the RCRD describes it",
            metadata: ["node": "\(node.id)"])
        } catch StoreError.preconditionFailed {
          // Changed again since: its writer describes the DATA it knows. Unless the answer was
          // spurious (the RCRD is still the one written above): left, it would describe the
          // version replaced, and be logged as this device's write. The upload runs again.
          if try context.headIfExists(loc.rcrdKey)?.eTag == eTag {
            throw StoreError.transient(
              "spurious precondition failure rewriting the RCRD of node \(node.id)")
          }
        }
      }
      try write { tx in
        if var cur = try tx.node(id: node.id) {
          if let carried, cur.eTagData == node.eTagData {
            cur.eTagData = carried.eTag
            cur.lastModifiedData = carried.lastModified
            cur.cloudDataInfo = cur.cloudDataInfo?.copied(
              eTag: carried.eTag, lastModified: carried.lastModified)
          }
          try tx.setCloudState(
            nodeID: node.id, eTagRcrd: eTag, lastModifiedRcrd: Date(), eTagData: cur.eTagData,
            lastModifiedData: cur.lastModifiedData, cloudDataInfo: cur.cloudDataInfo)
          try tx.updateMoveOriginETags(
            nodeID: node.id, rcrdKey: loc.rcrdKey, eTagRcrd: eTag, eTagData: nil)
          if keptDataGone, cur.eTagData == node.eTagData,
            try !tx.outstandingKinds(ofNodeID: node.id).contains(.putData)
          {
            // The node's content goes up again: whatever the delegate has (the DATA upload
            // gives the node, and its RCRD, the size of what it uploads).
            context.logger.warning(
              "first upload: the DATA the node kept is gone; its content is uploaded again",
              metadata: ["node": "\(node.id)"])
            try tx.setCloudState(
              nodeID: node.id, eTagRcrd: eTag, lastModifiedRcrd: Date(), eTagData: nil,
              lastModifiedData: nil, cloudDataInfo: nil)
            try tx.queueDataUpload(nodeID: node.id)
          }
          if written.dataSize != node.dataSize, cur.dataSize == node.dataSize {
            // The node takes the size of the DATA it stands beside (its size here came from an
            // RCRD that described another version).
            cur = try tx.existingNode(id: node.id)
            cur.dataSize = written.dataSize
            try tx.applyRemoteNode(cur, cloudName: try tx.cloudName(of: node.id))
            context.delegate.didDiscoverModifiedNode(
              cur, change: .data, at: try tx.path(of: node.id), transaction: tx)
          }
        } else {
          try tx.updateDeleteETags(
            cloudID: node.cloudID, rcrdKey: loc.rcrdKey, eTagRcrd: eTag, eTagData: nil)
        }
        // The RCRD is written whether or not the operation is still queued: record and log it.
        if try tx.operationExists(id: op.id) { try tx.completeOperation(id: op.id) }
        try manager.log(
          [
            ChangeLogEntry(
              cloudID: node.cloudID, kind: .put, rcrd: loc.rcrdKey, data: loc.dataKey,
              eTagRcrd: eTag)
          ], in: tx)
      }
    }
  }

  /// After an RCRD upload: the size of the DATA beside it when that DATA is not the version the
  /// RCRD was written for (`described`) and has another size; nil otherwise. An RCRD upload
  /// `If-Match` guards the RCRD, not the DATA: another device may have replaced the DATA
  /// meanwhile and left the RCRD alone (it described that device's content's size then), and
  /// this upload, describing the version it replaced, would then stand beside it for good. The
  /// writer of that DATA checks the RCRD after its own upload, this upload the DATA after its
  /// own: one of the two sees the other's write.
  private func replacedDataSize(node: Node, loc: CloudObjectRef, described: String?, size: UInt64)
    throws -> UInt64?
  {
    guard let head = try context.headIfExists(loc.dataKey), head.eTag != described else {
      return nil
    }
    guard
      case .success(let sizes) = try store.cloudFileSizes(
        key: loc.dataKey, nodeKey: node.encryptionKey, ciphertextSize: head.size)
    else { return nil }  // not this node's DATA: not described by its RCRD
    return sizes.dataSize == size ? nil : sizes.dataSize
  }

  /// After a first upload of a node that keeps the DATA found at its keys (uploaded again after
  /// a remote delete, its content not uploaded from here): true when that DATA is gone. The
  /// deleting device removes the DATA after the RCRD, so a full scan here may have run between
  /// the two and kept DATA that went right after (randomized seed 3992): the RCRD would describe
  /// a size no DATA has. A delete that looks for the RCRD after it was written keeps the node
  /// and its DATA (see `delete()`); one that looked before and removes the DATA after this check
  /// is not caught.
  private func keptDataGone(node: Node, loc: CloudObjectRef, carried: ObjectInfo?) throws
    -> Bool
  {
    guard node.eTagRcrd == nil, node.kind == .file, node.eTagData != nil, carried == nil else {
      return false
    }
    let dataUpload = try look { tx in
      try tx.outstandingKinds(ofNodeID: node.id).contains(.putData)
    }
    if dataUpload { return false }
    return try context.headIfExists(loc.dataKey) == nil
  }

  /// A node deleted here after its RCRD upload was taken.
  private struct NodeDeletedMeanwhile: Error {}

  /// A first upload of a node that keeps DATA found at its former keys (uploaded again after a
  /// remote delete, its content not here) and was moved since: once its RCRD is written, that
  /// DATA is copied beside it (the copy's source recorded first, so a lost answer is
  /// recognised) and then removed from the former keys. Returns the copy, or nil when there is
  /// nothing to carry (no `origin`, the same keys, or no DATA of the node there any more).
  private func carryData(node: Node, to loc: CloudObjectRef, state: inout RcrdUploadState)
    throws -> ObjectInfo?
  {
    guard let origin = op.payload.origin, origin.dataKey != loc.dataKey,
      let known = node.eTagData
    else { return nil }
    let dst = try context.headIfExists(loc.dataKey)
    guard let src = try context.headIfExists(origin.dataKey) else {
      // Copied by an earlier attempt, which then removed the source.
      if let dst, state.carriedSource != nil, dst.eTag == state.carriedCopy ?? dst.eTag {
        return dst
      }
      context.logger.error(
        "first upload: the DATA the node kept is gone from its former keys",
        metadata: ["node": "\(node.id)"])
      return nil
    }
    if src.eTag != known, src.eTag != state.carriedSource {
      // Not the version the node kept: another node's DATA (its name taken since) is left alone.
      guard
        case .success = try store.cloudFileSizes(
          key: origin.dataKey, nodeKey: node.encryptionKey, ciphertextSize: src.size)
      else {
        context.logger.error(
          "first upload: the DATA at the node's former keys is not the node's",
          metadata: ["node": "\(node.id)"])
        return nil
      }
    }
    state.carriedSource = src.eTag
    state.carriedCopy = nil
    try saveUploadState(state)
    let copied: String
    do {
      copied = try store.copy(
        from: origin.dataKey, to: loc.dataKey,
        condition: dst.map { .ifMatch($0.eTag) } ?? .ifNoneMatch)
    } catch StoreError.preconditionFailed, StoreError.notFound {
      throw StoreError.transient("DATA changed while a first upload carried it")
    }
    state.carriedCopy = copied
    try saveUploadState(state)
    do {
      try store.delete(key: origin.dataKey, condition: .ifMatch(src.eTag))
    } catch StoreError.preconditionFailed, StoreError.notFound {
      // Changed or gone meanwhile: left to its writer.
    }
    return try context.headIfExists(loc.dataKey)
      ?? ObjectInfo(
        key: loc.dataKey, size: src.size, eTag: copied, lastModified: Date())
  }

  /// A first upload resumed at the origin of a move queued since it started (it writes where
  /// the node was then) met another node there: the node never landed at that origin, so the
  /// move, which has not run (it waits for this upload) and wrote nothing, has nothing to carry
  /// and is dropped; the upload then goes to the node's current place, after what the move
  /// waited for (its new parent's first upload). Renaming the node, as for a path conflict at
  /// its own place, would change the move's target, not this key: the upload would meet the
  /// other node again, rename again, and so on for good. Returns whether the move was dropped.
  private func abandonMoveFromTakenOrigin(node: Node, loc: CloudObjectRef) throws -> Bool {
    try write { tx in
      guard try tx.operationExists(id: op.id),
        let current = try tx.objectLocation(of: node.id), current.rcrdKey != loc.rcrdKey
      else { return false }
      let moves = try tx.pendingOperations(forNodeID: node.id).filter { $0.kind == .move }
      guard moves.count == 1, let move = moves.first, move.state == .pending,
        move.payload.origin?.rcrdKey == loc.rcrdKey, (move.payload.written ?? []).isEmpty
      else { return false }
      let waitedFor = try tx.dependencies(ofOperation: move.id).filter { $0 != op.id }
      try tx.dropOperations(ofNodeID: node.id, kind: .move)
      for other in waitedFor { _ = try tx.deferOperation(id: op.id, until: other) }
      context.logger.info(
        "first upload: the origin of the node's move holds another node; the move is dropped",
        metadata: ["node": "\(node.id)"])
      return true
    }
  }

  /// While a DATA upload of the node is outstanding (one that does not itself wait for this
  /// operation, as a first upload's does), the RCRD upload waits for it: the RCRD's size
  /// describes that new DATA, which is not in the store yet — and should it meet a remote edit
  /// (a data conflict), the node stands for the remote version, attributes included, and this
  /// upload is dropped instead of putting the local attributes over the remote version.
  private func deferUntilDataUploaded(_ node: Node) throws {
    let dataOp = try look { tx -> Int64? in
      for o in try tx.operationKinds(ofNodeID: node.id) where o.kind == .putData {
        if try !tx.waits(o.id, for: op.id) { return o.id }
      }
      return nil
    }
    guard let dataOp else { return }
    if try write({ tx in try tx.deferOperation(id: op.id, until: dataOp) }) {
      throw PushIssue.deferred
    }
  }

  /// Another device changed the node's RCRD since this device last knew it. The local
  /// attributes win and overwrite it — but an RCRD also describes the DATA beside it (its
  /// size), so not over a DATA version they do not describe: an RCRD upload waits for the
  /// node's outstanding DATA upload (see `deferUntilDataUploaded`), and when the DATA in the
  /// store is not the version the node knows, a pull comes first (it brings that version's
  /// size; the upload then runs again).
  private func beforeOverwritingRemoteRcrd(node: Node, loc: CloudObjectRef) throws {
    let cur = try look { try $0.node(id: node.id) }
    guard let cur else {
      // Deleted here meanwhile: nothing to put over another device's version (the operation is
      // dropped; the delete that waits for it finds that version and keeps the node).
      throw PushIssue.needsPull("node \(node.id) was deleted while its RCRD changed remotely")
    }
    if cur.eTagRcrd != node.eTagRcrd || cur.eTagData != node.eTagData
      || RcrdMeta(node: cur) != RcrdMeta(node: node) || cur.burnDate != node.burnDate
    {
      throw PushIssue.retryNow  // the node changed since the operation was taken
    }
    try deferUntilDataUploaded(node)
    if try context.headIfExists(loc.dataKey)?.eTag != cur.eTagData {
      throw PushIssue.needsPull("the DATA beside the RCRD of node \(node.id) changed remotely")
    }
  }

  /// The size of the node's DATA version (`eTagData`): known when this device uploaded it or
  /// read its header (`cloudDataInfo`); otherwise read from its header — a pull takes a remote
  /// DATA version with the size its RCRD gives, and that RCRD may still describe an earlier one
  /// (its writer's RCRD upload follows its DATA upload).
  private func dataSize(of node: Node, loc: CloudObjectRef) throws -> UInt64 {
    guard let eTag = node.eTagData else { return node.dataSize }
    if let info = node.cloudDataInfo, info.eTag == eTag { return info.dataSize }
    guard let head = try context.headIfExists(loc.dataKey), head.eTag == eTag else {
      return node.dataSize
    }
    guard
      case .success(let sizes) = try store.cloudFileSizes(
        key: loc.dataKey, nodeKey: node.encryptionKey, ciphertextSize: head.size)
    else {
      context.logger.error(
        "RCRD upload: the node's DATA cannot be read", metadata: ["node": "\(node.id)"])
      return node.dataSize
    }
    return sizes.dataSize
  }

  /// An upload's state in its operation's `multipartState`; a fresh one when there is none.
  func loadUploadState<S: Codable & DefaultInitializable>(_ type: S.Type) -> S {
    guard
      let raw = try? look({ try $0.operationUploadState(id: op.id) }),
      let s = try? JSONDecoder().decode(S.self, from: raw)
    else { return S() }
    return s
  }

  /// Stores an upload's state in its operation (nothing when the operation is gone).
  func saveUploadState<S: Codable>(_ s: S) throws {
    let data = try JSONEncoder().encode(s)
    try write { tx in
      if try tx.operationExists(id: op.id) { try tx.setMultipartState(data, forOperation: op.id) }
    }
  }

  // MARK: DATA

  private struct Content {
    var metadata: Data
    var thumbnail: Data
    var source: CloudFileSource
    var dataSize: UInt64
    var cleanup: () -> Void
  }

  private func resolve(_ d: NodeData?) throws -> NodeData? {
    if case .promise(let p)? = d {
      return try resolve(p.wait(timeout: manager.config.promiseTimeout))
    }
    return d
  }

  private func bytes(_ d: NodeData?) throws -> Data {
    switch try resolve(d) {
    case nil: return Data()
    case .data(let data)?: return data
    case .cleartextFile(let url)?: return try Data(contentsOf: url)
    case .cryptoFile(let url, let key)?:
      let f = try CryptoFile.open(at: url, key: key)
      defer { try? f.close() }
      return try f.read(offset: 0, count: Int(f.size))
    case .promise?: throw SyncError.dataUnavailable("nested promise")
    }
  }

  private func content(node: Node, path: TreesystemPath) throws -> (Content, Int64) {
    let (d, m, t, generation) = try context.catalog.read(context.userID) {
      tx -> (NodeData?, NodeData?, NodeData?, Int64) in
      guard let generation = try tx.operationGeneration(id: op.id) else {
        throw SyncError.nodeGone(node.id)
      }
      let dl = context.delegate
      return (
        dl.data(for: node, at: path, transaction: tx),
        dl.metadata(for: node, at: path, transaction: tx),
        dl.thumbnail(for: node, at: path, transaction: tx), generation
      )
    }
    let metadata = try bytes(m)
    let thumbnail = try bytes(t)
    switch try resolve(d) {
    case nil:
      return (
        Content(
          metadata: metadata, thumbnail: thumbnail, source: .data(Data()), dataSize: 0, cleanup: {}),
        generation
      )
    case .data(let data)?:
      return (
        Content(
          metadata: metadata, thumbnail: thumbnail, source: .data(data),
          dataSize: UInt64(data.count), cleanup: {}), generation
      )
    case .cleartextFile(let url)?:
      let size = try FileManager.default.attributesOfItem(atPath: url.path)[.size] as? NSNumber
      return (
        Content(
          metadata: metadata, thumbnail: thumbnail, source: .file(url),
          dataSize: size?.uint64Value ?? 0, cleanup: {}), generation
      )
    case .cryptoFile(let url, let key)?:
      let f = try CryptoFile.open(at: url, key: key)
      return (
        Content(
          metadata: metadata, thumbnail: thumbnail, source: f.cloudFileSource(), dataSize: f.size,
          cleanup: { try? f.close() }), generation
      )
    case .promise?:
      throw SyncError.dataUnavailable("nested promise")
    }
  }

  private func loadState() throws -> DataUploadState {
    let raw = try look { try $0.operationUploadState(id: op.id) }
    guard let raw, let s = try? JSONDecoder().decode(DataUploadState.self, from: raw) else {
      return DataUploadState()
    }
    return s
  }

  private func saveState(_ s: DataUploadState) throws {
    let data = try JSONEncoder().encode(s)
    try write { tx in try tx.setMultipartState(data, forOperation: op.id) }
  }

  /// True when the DATA object at `key` is one this operation wrote (its header is one we
  /// recorded); returns its info.
  private func ourUpload(at key: String, state: DataUploadState) throws -> ObjectInfo? {
    guard let info = try context.headIfExists(key),
      info.size >= UInt64(CloudFileFormat.outerHeaderSize)
    else { return nil }
    let header = try store.get(
      key: key, range: ByteRange(0, UInt64(CloudFileFormat.outerHeaderSize)))
    return state.headers.contains(header.base64EncodedString()) ? info : nil
  }

  private func putData() throws {
    guard let node = job.node, let loc = job.location, let path = job.path else {
      return try completeOrphan()
    }
    var state = try loadState()
    let (content, generation) = try content(node: node, path: path)
    defer { content.cleanup() }
    let encoder = try CloudFileEncoder(key: node.encryptionKey)
    let size = CloudFileEncoder.encodedSize(
      metadataSize: UInt64(content.metadata.count), thumbnailSize: UInt64(content.thumbnail.count),
      dataSize: content.dataSize)
    var condition: WriteCondition =
      (state.overwrite ?? node.eTagData).map { .ifMatch($0) } ?? .ifNoneMatch
    let eTag: String
    if size < manager.config.multipartThreshold {
      var body = Data()
      body.reserveCapacity(Int(size))
      try encoder.encode(
        metadata: content.metadata, thumbnail: content.thumbnail, data: content.source
      ) { body.append($0) }
      state.remember(body.prefix(CloudFileFormat.outerHeaderSize))
      try saveState(state)
      do {
        eTag = try store.put(key: loc.dataKey, body: .data(body), condition: condition)
      } catch StoreError.preconditionFailed {
        if let mine = try ourUpload(at: loc.dataKey, state: state) {
          condition = .ifMatch(mine.eTag)
          eTag = try store.put(key: loc.dataKey, body: .data(body), condition: condition)
        } else {
          guard let same = try dataConflict(node: node, loc: loc, path: path) else { return }
          eTag = same
        }
      }
    } else if manager.config.streamLargeUploads, let streaming = store as? any StreamingPutStore {
      guard
        let e = try streamedPut(
          streaming, node: node, loc: loc, path: path, content: content, encoder: encoder,
          size: size, generation: generation, state: &state, condition: condition)
      else { return }
      eTag = e
    } else {
      guard
        let e = try multipart(
          node: node, loc: loc, path: path, content: content, encoder: encoder, size: size,
          generation: generation, state: &state, condition: condition)
      else { return }
      eTag = e
    }
    let info = try? store.head(key: loc.dataKey)
    let beside = try rcrdBeside(loc.rcrdKey)
    switch beside {
    case .absent: try removeDataWithoutItsNode(node: node, loc: loc, eTag: eTag)
    case .found(let r) where r.cloudID != node.cloudID:
      try removeDataWithoutItsNode(node: node, loc: loc, eTag: eTag)
    default: break
    }
    let describe = try rcrdDescribesOtherSize(node: node, rcrd: beside, size: content.dataSize)
    try write { tx in
      guard let cur = try tx.node(id: node.id),
        let currentGeneration = try tx.operationGeneration(id: op.id)
      else {
        try tx.updateDeleteETags(
          cloudID: node.cloudID, rcrdKey: loc.rcrdKey, eTagRcrd: nil, eTagData: eTag)
        if try tx.operationExists(id: op.id) { try tx.completeOperation(id: op.id) }
        return
      }
      try tx.updateMoveOriginETags(
        nodeID: node.id, rcrdKey: loc.rcrdKey, eTagRcrd: nil, eTagData: eTag)
      try tx.setCloudState(
        nodeID: node.id, eTagRcrd: cur.eTagRcrd, lastModifiedRcrd: cur.lastModifiedRcrd,
        eTagData: eTag, lastModifiedData: info?.lastModified ?? Date(),
        cloudDataInfo: CloudDataInfo(
          metadataSize: UInt64(content.metadata.count),
          thumbnailSize: UInt64(content.thumbnail.count), dataSize: content.dataSize, eTag: eTag,
          lastModified: info?.lastModified))
      try manager.log(
        [
          ChangeLogEntry(
            cloudID: node.cloudID, kind: .put, rcrd: loc.rcrdKey, data: loc.dataKey,
            eTagData: eTag)
        ], in: tx)
      if currentGeneration != generation {
        // Newer data was queued while this upload ran: upload again, now.
        try tx.setMultipartState(nil, forOperation: op.id)
        try tx.failOperation(id: op.id, retryAt: Date())
        return
      }
      try tx.completeOperation(id: op.id)
      var updated = try tx.existingNode(id: node.id)
      if describe, updated.dataSize == content.dataSize {
        try tx.queueRcrdUpload(nodeID: node.id)
      }
      if updated.dataSize != content.dataSize {
        // The node's size is that of the content uploaded — the delegate's (e.g. none at all
        // for a node kept after a remote delete whose content this device never had) — and
        // its RCRD says so too.
        context.logger.warning(
          "uploaded content differs in size from the node's; the node takes the uploaded size",
          metadata: ["node": "\(node.id)"])
        updated.dataSize = content.dataSize
        updated = try tx.updateNode(updated)
      }
      context.delegate.didPushNodeData(updated, at: try tx.path(of: node.id), transaction: tx)
    }
  }

  /// A DATA upload landed where the node's RCRD no longer is: another device moved the node on
  /// (its move carried what was there before) or deleted it while this upload ran, and another
  /// node may hold the name now. The DATA just written is removed again (nobody would ever carry
  /// or delete it, and the node's RCRD elsewhere would describe content that is not beside it)
  /// and the upload waits for a pull, which takes the node to its new place (the upload then
  /// runs there) or applies the delete (which keeps the node, its content not uploaded yet, and
  /// uploads it again as new).
  private func removeDataWithoutItsNode(node: Node, loc: CloudObjectRef, eTag: String) throws
    -> Never
  {
    do {
      try store.delete(key: loc.dataKey, condition: .ifMatch(eTag))
    } catch StoreError.preconditionFailed, StoreError.notFound {
      // Carried away or replaced meanwhile: not this upload's to remove any more.
    }
    context.logger.info(
      "DATA upload: the node's RCRD left its keys meanwhile; the DATA is uploaded again after a pull",
      metadata: ["node": "\(node.id)"])
    throw PushIssue.needsPull("the RCRD of node \(node.id) left the keys of its DATA upload")
  }

  /// After a DATA upload with no RCRD upload of the node pending: true when the node's RCRD in
  /// the store (`rcrd`, found beside the DATA) describes another size (another device's RCRD
  /// landed over the one this device knew, describing that device's DATA), so the node's RCRD
  /// must be uploaded again.
  private func rcrdDescribesOtherSize(node: Node, rcrd: RcrdBeside, size: UInt64) throws
    -> Bool
  {
    guard case .found(let rcrd) = rcrd, rcrd.cloudID == node.cloudID, rcrd.dataSize != size else {
      return false
    }
    return try !look { tx in
      try tx.outstandingKinds(ofNodeID: node.id).contains(.putRcrd)
    }
  }

  /// The RCRD at `key` as far as a DATA upload checks it. When the object there is one this
  /// device wrote (its eTag is the one the put answered), what it says is known without
  /// fetching and decrypting it; otherwise it is fetched.
  private func rcrdBeside(_ key: String) throws -> RcrdBeside {
    guard let info = try context.headIfExists(key) else { return .absent }
    if let own = manager.ownRcrds.get(key), own.eTag == info.eTag { return .found(own) }
    guard let remote = try context.fetchRcrd(key) else { return .absent }
    guard let decoded = remote.decoded else { return .undecodable }
    return .found(
      RcrdSummary(eTag: remote.info.eTag, cloudID: decoded.cloudID, dataSize: decoded.meta.dataSize)
    )
  }

  private func currentGeneration() throws -> Int64? {
    try look { try $0.operationGeneration(id: op.id) }
  }

  /// Abandons an upload in parts: the store's upload and the encoded work file (best effort).
  private func discard(_ m: DataUploadState.MultipartState) {
    try? store.abortMultipartUpload(key: m.key, uploadID: m.uploadID)
    try? FileManager.default.removeItem(atPath: m.file)
  }

  /// Reports how far the DATA upload of `node` has got (`done` of `total` encoded bytes).
  private func reportUpload(of node: Node, total: UInt64, done: UInt64) {
    context.progress.update { p in
      p.operations.removeAll { $0.nodeID == node.id && $0.kind == "upload" }
      p.operations.append(
        OperationProgress(nodeID: node.id, kind: "upload", totalBytes: total, doneBytes: done))
    }
  }

  /// The DATA upload of `node` is over: its progress entry goes.
  private func endUploadReport(of node: Node) {
    context.progress.update { p in p.operations.removeAll { $0.nodeID == node.id } }
  }

  /// Uploads a large DATA object to a store that writes it as it is encoded (the local folder):
  /// one pass, no work file and no parts for the store to copy together. It gives way to the
  /// user between its chunks and, as an upload in parts does between parts, starts over when
  /// the operation's generation moved on; a crash starts it over (the store keeps nothing of an
  /// unfinished put). Returns the eTag, or nil when the operation was settled otherwise
  /// (conflict).
  private func streamedPut(
    _ streaming: any StreamingPutStore, node: Node, loc: CloudObjectRef, path: TreesystemPath,
    content first: Content, encoder: CloudFileEncoder, size: UInt64, generation: Int64,
    state: inout DataUploadState, condition initial: WriteCondition
  ) throws -> String? {
    if let m = state.multipart {
      // An upload in parts left by an earlier run: not resumed.
      discard(m)
      state.multipart = nil
      try saveState(state)
    }
    let pacer = UploadPacer(manager: manager, job: job)
    // How often the upload looks for newer data and reports its progress.
    let checkEvery = max(manager.config.partSize, 1 << 20)
    func put(_ content: Content, _ condition: WriteCondition) throws -> String {
      var done: UInt64 = 0
      var checked: UInt64 = 0
      let eTag = try streaming.put(key: loc.dataKey, condition: condition) { sink in
        try encoder.encode(
          metadata: content.metadata, thumbnail: content.thumbnail, data: content.source
        ) { piece in
          if done == 0 {
            // The outer header, recorded before any of the object can land (a put found in
            // the store after a crash is recognised as this device's by it).
            state.remember(piece.prefix(CloudFileFormat.outerHeaderSize))
            try saveState(state)
          }
          pacer.giveWay()
          if manager.isStopping { throw PushIssue.stopped }
          if done - checked >= checkEvery {
            checked = done
            // Newer data coalesced into this operation: start over with it.
            if try currentGeneration() != generation { throw PushIssue.retryNow }
            reportUpload(of: node, total: size, done: done)
          }
          try piece.withUnsafeBytes { try sink($0) }
          done += UInt64(piece.count)
        }
      }
      endUploadReport(of: node)
      return eTag
    }
    do {
      return try put(first, initial)
    } catch StoreError.preconditionFailed {
      // An upload of this operation that landed before a crash is overwritten; anything else
      // is a conflict. (The content is read again: its source reads once.)
      guard let mine = try ourUpload(at: loc.dataKey, state: state) else {
        return try dataConflict(node: node, loc: loc, path: path)
      }
      let (again, againGeneration) = try self.content(node: node, path: path)
      defer { again.cleanup() }
      guard againGeneration == generation else { throw PushIssue.retryNow }
      return try put(again, .ifMatch(mine.eTag))
    }
  }

  /// Uploads in parts, resuming a recorded upload; returns the eTag, or nil when the
  /// operation was settled otherwise (conflict).
  private func multipart(
    node: Node, loc: CloudObjectRef, path: TreesystemPath, content: Content,
    encoder: CloudFileEncoder, size: UInt64, generation: Int64, state: inout DataUploadState,
    condition initial: WriteCondition
  ) throws -> String? {
    var condition = initial
    let partSize = manager.config.partSize(forObjectOf: size)
    var mp = state.multipart
    var parts: [UploadedPart] = []
    if let m = mp, m.generation == generation, m.key == loc.dataKey,
      FileManager.default.fileExists(atPath: m.file)
    {
      do {
        parts = try store.listParts(key: m.key, uploadID: m.uploadID)
      } catch StoreError.notFound {
        mp = nil
      }
    } else if let m = mp {
      discard(m)
      mp = nil
    }
    // A large upload gives way to the user between its pieces (chunks, then parts).
    let pacer = UploadPacer(manager: manager, job: job)
    if mp == nil {
      let file = manager.config.workDirectory.appendingPathComponent(
        "push-\(context.account.deviceID)-\(op.id)-\(generation).cloudfile")
      try encoder.encode(
        metadata: content.metadata, thumbnail: content.thumbnail, data: content.source,
        toFileAt: file
      ) {
        pacer.giveWay()
        if manager.isStopping { throw PushIssue.stopped }
      }
      let fh = try FileHandle(forReadingFrom: file)
      let header = try fh.read(upToCount: CloudFileFormat.outerHeaderSize) ?? Data()
      try fh.close()
      let uploadID = try store.createMultipartUpload(key: loc.dataKey)
      mp = DataUploadState.MultipartState(
        uploadID: uploadID, key: loc.dataKey, file: file.path, generation: generation,
        partSize: partSize, size: size, header: header.base64EncodedString())
      state.remember(header)
      state.multipart = mp
      try saveState(state)
      parts = []
    }
    guard let m = mp else { return nil }
    let count = Int((m.size + m.partSize - 1) / m.partSize)
    var done: [Int: UploadedPart] = [:]
    for p in parts where p.partNumber >= 1 && p.partNumber <= count {
      let expected = min(m.partSize, m.size - UInt64(p.partNumber - 1) * m.partSize)
      if p.size == expected { done[p.partNumber] = p }
    }
    let url = URL(fileURLWithPath: m.file)
    for number in 1...max(count, 1) where done[number] == nil {
      pacer.giveWay()
      if manager.isStopping { throw PushIssue.stopped }
      if try currentGeneration() != generation {
        // Newer data: abandon this upload and start over with it.
        discard(m)
        state.multipart = nil
        try saveState(state)
        throw PushIssue.retryNow
      }
      let lo = UInt64(number - 1) * m.partSize
      let hi = min(m.size, lo + m.partSize)
      let eTag = try store.uploadPart(
        key: m.key, uploadID: m.uploadID, partNumber: number,
        body: .file(url, range: ByteRange(lo, hi)))
      done[number] = UploadedPart(partNumber: number, eTag: eTag, size: hi - lo)
      reportUpload(of: node, total: m.size, done: hi)
    }
    let all = done.values.sorted { $0.partNumber < $1.partNumber }
    let eTag: String
    do {
      eTag = try store.completeMultipartUpload(
        key: m.key, uploadID: m.uploadID, parts: all, condition: condition)
    } catch StoreError.preconditionFailed {
      if let mine = try ourUpload(at: m.key, state: state) {
        condition = .ifMatch(mine.eTag)
        if let h = Data(base64Encoded: m.header),
          try store.get(key: m.key, range: ByteRange(0, UInt64(h.count))) == h
        {
          eTag = mine.eTag  // this very upload landed before a crash
        } else {
          eTag = try store.completeMultipartUpload(
            key: m.key, uploadID: m.uploadID, parts: all, condition: condition)
        }
      } else {
        discard(m)
        state.multipart = nil
        try saveState(state)
        return try dataConflict(node: node, loc: loc, path: path)
      }
    } catch StoreError.notFound {
      // The upload is gone: completed before a crash (then the object is ours) or expired.
      if let mine = try ourUpload(at: m.key, state: state),
        let h = Data(base64Encoded: m.header),
        try store.get(key: m.key, range: ByteRange(0, UInt64(h.count))) == h
      {
        eTag = mine.eTag
      } else {
        state.multipart = nil
        try saveState(state)
        throw PushIssue.retryNow
      }
    }
    try? FileManager.default.removeItem(at: url)
    state.multipart = nil
    try saveState(state)
    endUploadReport(of: node)
    return eTag
  }

  /// The DATA changed remotely (412 that is not ours): the remote version keeps the name, the
  /// local version becomes a conflicted copy. When the remote version holds exactly the local
  /// content (an own upload no longer recognised by its header, or another device that made the
  /// same change) there is nothing to keep apart: returns its eTag, and the upload counts as
  /// done with it. Returns nil when the conflict was settled with a copy.
  private func dataConflict(node: Node, loc: CloudObjectRef, path: TreesystemPath) throws
    -> String?
  {
    guard let remote = try context.fetchRcrd(loc.rcrdKey), let rcrd = remote.decoded,
      rcrd.cloudID == node.cloudID, !rcrd.meta.moving
    else {
      throw PushIssue.needsPull("DATA of node \(node.id) changed place remotely")
    }
    guard let dataInfo = try context.headIfExists(loc.dataKey) else {
      // The node is there but its DATA is gone: nothing remote to keep; upload as new.
      try write { tx in
        guard let cur = try tx.node(id: node.id) else { return }
        try tx.setCloudState(
          nodeID: cur.id, eTagRcrd: cur.eTagRcrd, lastModifiedRcrd: cur.lastModifiedRcrd,
          eTagData: nil, lastModifiedData: nil, cloudDataInfo: nil)
      }
      throw PushIssue.retryNow
    }
    if dataInfo.eTag == node.eTagData {
      // Nothing changed remotely: the 412 was spurious (or the object changed back).
      throw StoreError.transient("spurious precondition failure for DATA of node \(node.id)")
    }
    // The sizes of the version kept come from its own header (the RCRD beside it may describe
    // another version); a store failure is retried rather than guessed around.
    var sizes: CloudFileSizes? = nil
    switch try store.cloudFileSizes(
      key: loc.dataKey, nodeKey: node.encryptionKey, ciphertextSize: dataInfo.size)
    {
    case .success(let s): sizes = s
    case .failure(let error):
      // Not a version of this node's DATA (its key does not open it): another node's, left
      // under a name it held before — e.g. a node moved away whose move has not removed its
      // DATA from there yet (it carried a copy before its commit) — or a corrupt object.
      // There is no remote version of this node to keep: the local content goes over it.
      context.logger.warning(
        "DATA upload: the object at the node's key is not its DATA; overwriting it",
        metadata: ["node": "\(node.id)", "error": "\(error)"])
      var state = try loadState()
      state.overwrite = dataInfo.eTag
      try saveState(state)
      throw PushIssue.retryNow
    }
    if let s = sizes,
      try holdsLocalContent(node: node, path: path, loc: loc, remote: dataInfo, sizes: s)
    {
      context.logger.info(
        "DATA upload: the version in the store holds this content already; no conflict",
        metadata: ["node": "\(node.id)"])
      return dataInfo.eTag
    }
    let deviceName = context.account.deviceName
    try write { tx in
      guard var cur = try tx.node(id: node.id), let parentID = cur.parentID else {
        if try tx.operationExists(id: op.id) { try tx.completeOperation(id: op.id) }
        return
      }
      let base = ConflictNames.conflictedCopy(of: cur.name, date: Date(), deviceName: deviceName)
      let name = try tx.freeChildName(base, in: parentID)
      var copy = Node(
        uuid: "", localUserID: context.userID, parentID: parentID, name: name,
        kind: cur.kind == .directory ? .file : cur.kind, shareList: cur.shareList,
        encryptionKey: Data(), dirSalt: Data(), dirPrefix: "", cloudID: "", mode: cur.mode,
        mtime: cur.mtime, xattrs: cur.xattrs, symlinkTarget: cur.symlinkTarget,
        dataSize: cur.dataSize)
      copy = try tx.createNode(copy)
      try tx.queueDataUpload(nodeID: copy.id)
      let curPath = try tx.path(of: cur.id)
      context.delegate.didDiscoverConflict(
        .data, node: cur, other: copy, at: curPath, transaction: tx)
      // The node now stands for the remote version (its local attributes went to the copy),
      // name included: a spelling that differs only in case is a rename at the same key,
      // which a pull leaves alone while this device's RCRD upload is outstanding.
      let oldName = cur.name
      if Array(rcrd.meta.name.utf8) != Array(cur.name.utf8),
        NameKey(rcrd.meta.name) == NameKey(cur.name)
      {
        cur.name = rcrd.meta.name
      }
      cur.mode = rcrd.meta.mode
      cur.mtime = rcrd.meta.mtime
      cur.xattrs = rcrd.meta.xattrs
      cur.dataSize = rcrd.meta.dataSize
      if cur.eTagRcrd == node.eTagRcrd {
        cur.eTagRcrd = remote.info.eTag
        cur.lastModifiedRcrd = remote.info.lastModified
      }
      // else: this device's own RCRD upload, running beside this one, landed (and was logged)
      // after the fetch above: its eTag is the newer one.
      cur.eTagData = dataInfo.eTag
      cur.lastModifiedData = dataInfo.lastModified
      cur.cloudDataInfo = sizes.map {
        CloudDataInfo($0, eTag: dataInfo.eTag, lastModified: dataInfo.lastModified)
      }
      if let s = sizes { cur.dataSize = s.dataSize }
      try tx.applyRemoteNode(cur, cloudName: try tx.cloudName(of: cur.id))
      try tx.dropOperations(ofNodeID: cur.id, kind: .putData)
      // The RCRD is uploaded again with the remote attributes after any RCRD upload of the
      // node still in flight (which is left to finish: dropping it would leave its write in the
      // store unrecorded and unlogged, so other devices never learn that RCRD's eTag), and
      // whenever the RCRD there does not describe the DATA kept (this device's own RCRD upload
      // landed just before, with the local size).
      try tx.requeueRcrdUpload(
        nodeID: cur.id, rewrite: rcrd.meta.dataSize != cur.dataSize)
      if Array(cur.name.utf8) != Array(oldName.utf8) {
        context.delegate.didRenameNode(cur, oldName: oldName, transaction: tx)
      }
      context.delegate.didDiscoverModifiedNode(
        cur, change: .data, at: try tx.path(of: cur.id), transaction: tx)
    }
    context.logger.info(
      "data conflict: local version kept as a copy", metadata: ["node": "\(node.id)"])
    return nil
  }

  /// True when the CloudFile at `loc.dataKey` (`remote`, whose sections are `sizes`) decrypts to
  /// the node's local metadata, thumbnail and data, compared as streams a chunk at a time. A
  /// remote object that fails to decrypt midway is not the same content.
  private func holdsLocalContent(
    node: Node, path: TreesystemPath, loc: CloudObjectRef, remote: ObjectInfo,
    sizes: CloudFileSizes
  ) throws -> Bool {
    let (local, _) = try content(node: node, path: path)
    defer { local.cleanup() }
    guard sizes.metadataSize == UInt64(local.metadata.count),
      sizes.thumbnailSize == UInt64(local.thumbnail.count), sizes.dataSize == local.dataSize
    else { return false }
    let key = loc.dataKey
    let reader: CloudFileReader
    do {
      reader = try CloudFileReader(
        key: node.encryptionKey, ciphertextSize: remote.size,
        fetch: { [store] in try store.get(key: key, range: $0) })
      guard try reader.read(.metadata) == local.metadata,
        try reader.read(.thumbnail) == local.thumbnail
      else { return false }
    } catch let e as StoreError {
      throw e
    } catch {
      return false
    }
    var stream = LocalContentStream(local.source)
    defer { stream.close() }
    do {
      try reader.stream(.data) { piece in
        guard try stream.next(piece.count) == piece else { throw ContentDiffers() }
      }
    } catch let e as StoreError {
      throw e
    } catch {
      return false
    }
    return try stream.next(1).isEmpty
  }

  // MARK: Move (see MoveExecutor.swift)

  /// A moved node's new name is taken remotely: rename it (the move goes to the new name).
  func resolveMovePathConflict(_ node: Node) throws {
    guard let parentID = node.parentID else { return }
    let parent = try context.catalog.read(context.userID) { try $0.existingNode(id: parentID) }
    var n = 2
    while n < 10_000 {
      let candidate = ConflictNames.numbered(node.name, n)
      n += 1
      let localFree = try context.catalog.read(context.userID) {
        try $0.child(of: parentID, named: candidate) == nil
      }
      guard localFree else { continue }
      let cloudName = try CloudName.compute(name: candidate, parentDirSalt: parent.dirSalt)
      let key = context.layout.rcrdKey(dirPrefix: parent.dirPrefix, cloudName: cloudName)
      guard try context.headIfExists(key) == nil else { continue }
      try write { tx in
        guard let old = try tx.node(id: node.id) else { return }
        let renamed = try tx.renameWithoutMove(node.id, to: candidate)
        context.delegate.didRenameNode(renamed, oldName: old.name, transaction: tx)
        context.delegate.didDiscoverConflict(
          .path, node: renamed, other: nil, at: try tx.path(of: node.id), transaction: tx)
      }
      manager.requestPull()
      return
    }
    throw PushIssue.needsPull("no free name")
  }

  /// Deletes an RCRD if it still holds `cloudID` (conditional on its eTag). With
  /// `keepIfChanged`, an RCRD changed since `eTag` is kept (a remote edit) — unless it is a
  /// move's claim (this device's own, left by a move the delete superseded, or another's). Returns
  /// whether the RCRD is gone.
  @discardableResult
  private func deleteIfOurs(
    rcrdKey: String, cloudID: String, eTag: String?, keepIfChanged: Bool = false
  ) throws -> Bool {
    if let eTag {
      do {
        try store.delete(key: rcrdKey, condition: .ifMatch(eTag))
        return true
      } catch StoreError.preconditionFailed {}
    }
    guard let remote = try context.fetchRcrd(rcrdKey) else { return true }
    guard let decoded = remote.decoded, decoded.cloudID == cloudID else { return false }
    if keepIfChanged, let eTag, remote.info.eTag != eTag, !decoded.meta.moving { return false }
    do {
      try store.delete(key: rcrdKey, condition: .ifMatch(remote.info.eTag))
      return true
    } catch StoreError.preconditionFailed {
      if try context.headIfExists(rcrdKey) == nil { return true }
      throw StoreError.transient("RCRD changed while being deleted")
    }
  }

  // MARK: Delete

  /// A node this delete keeps for a remote RCRD change stands beside DATA this device knows:
  /// when that RCRD describes another size (it was written over an earlier DATA version, which
  /// this device's last upload replaced), it is rewritten with the size of the DATA there (read
  /// from its header), so the node does not come back with a size its content does not have.
  /// Returns the change-log entry of the rewrite.
  private func describeKeptData(_ ref: CloudObjectRef, data: ObjectInfo) throws -> ChangeLogEntry? {
    guard let r = try context.fetchRcrd(ref.rcrdKey), let decoded = r.decoded,
      decoded.cloudID == ref.cloudID, !decoded.meta.moving, !decoded.meta.arriving
    else { return nil }
    guard
      case .success(let sizes) = try store.cloudFileSizes(
        key: ref.dataKey, nodeKey: decoded.nodeKey, ciphertextSize: data.size)
    else {
      context.logger.error(
        "delete: the DATA of a node kept cannot be read", metadata: ["cloudID": "\(ref.cloudID)"])
      return nil
    }
    let size = sizes.dataSize
    guard size != decoded.meta.dataSize else { return nil }
    let body = try MoveRun.reencode(
      decoded, publicKeys: context.publicKeys, userID: context.userID, moving: false,
      dataSize: size)
    let eTag: String
    do {
      eTag = try store.put(key: ref.rcrdKey, body: .data(body), condition: .ifMatch(r.info.eTag))
    } catch StoreError.preconditionFailed {
      return nil  // changed again meanwhile: its writer describes its own DATA
    }
    context.logger.info(
      "delete: the RCRD of a node kept now describes the DATA beside it",
      metadata: ["cloudID": "\(ref.cloudID)"])
    return keptEntry(ref, eTagRcrd: eTag, eTagData: nil)
  }

  /// The change-log entry announcing a node this delete keeps (for a remote change), as it is
  /// in the store. What is there may be this device's own write that nothing announced: an
  /// upload of the node whose answer was lost (it landed), dropped with its node by this
  /// delete — e.g. an RCRD upload that ran again after a local rename, writing the new name at
  /// the former key before the move. Devices that pull incrementally would never fetch it, and
  /// this device brings the node back from it with a full scan (randomized seed 2376).
  /// Announcing what another device wrote (and announced) is harmless: a pull finds the eTags
  /// it knows.
  private func keptEntry(_ ref: CloudObjectRef, eTagRcrd: String?, eTagData: String?)
    -> ChangeLogEntry
  {
    ChangeLogEntry(
      cloudID: ref.cloudID, kind: .put, rcrd: ref.rcrdKey, data: ref.dataKey,
      eTagRcrd: eTagRcrd, eTagData: eTagData)
  }

  private func delete() throws {
    var logged: [ChangeLogEntry] = []
    var kept = false
    // The RCRDs an attempt of this delete sent a delete request for (recorded first: an answer
    // lost is recognised). An RCRD this delete finds gone before sending anything for it is not
    // announced: it was moved away elsewhere (the node lives on there) or deleted by another
    // device (which announces it) — a delete entry for it would have devices that know the
    // node at that key take it for deleted wherever it is now.
    // A target a move wrote (marked `arriving`) is the node's place only when no other RCRD of
    // it is found: otherwise it was that move's write, and removing it is no deletion of the
    // node (announced, it would have devices take the node for deleted wherever it is).
    var state = loadUploadState(DeleteState.self)
    let sentBefore = Set(state.sent)
    var announced: [(entry: ChangeLogEntry, arriving: Bool)] = []
    var placed = Set<String>()  // cloudIDs with an RCRD found that is not a move's target
    for ref in (op.payload.objects ?? []).reversed() {
      let data = try context.headIfExists(ref.dataKey)
      var removedRcrd = false
      var removedHere = sentBefore.contains(ref.rcrdKey)
      var arriving = state.arriving.contains(ref.rcrdKey)
      if removedHere, !arriving { placed.insert(ref.cloudID) }
      if let r = try context.fetchRcrd(ref.rcrdKey) {
        arriving = r.decoded?.meta.arriving == true
        if r.decoded?.cloudID == ref.cloudID, !arriving { placed.insert(ref.cloudID) }
        // A remote edit of the DATA keeps the node (RCRD and DATA) for the next pull to bring
        // back — but a move's claim on its RCRD goes in any case (its move was superseded by
        // this delete, or loses to it): the editing device uploads the node again.
        let claim = r.decoded?.cloudID == ref.cloudID && r.decoded?.meta.moving == true
        if !claim, let eTag = ref.eTagData, let data, data.eTag != eTag {
          context.logger.info(
            "delete skipped: data changed remotely", metadata: ["cloudID": "\(ref.cloudID)"])
          kept = true
          if r.decoded?.cloudID == ref.cloudID, !arriving {
            logged.append(keptEntry(ref, eTagRcrd: r.info.eTag, eTagData: data.eTag))
          }
          continue
        }
        // The RCRD decides, as for a move (whose claim on it makes this delete fail): a node
        // moved or edited remotely keeps it, and its DATA is left alone.
        if !state.sent.contains(ref.rcrdKey) {
          state.sent.append(ref.rcrdKey)
          if arriving { state.arriving.append(ref.rcrdKey) }
          try saveUploadState(state)
        }
        guard
          try deleteIfOurs(
            rcrdKey: ref.rcrdKey, cloudID: ref.cloudID, eTag: ref.eTagRcrd, keepIfChanged: true)
        else {
          context.logger.info(
            "delete skipped: node changed remotely", metadata: ["cloudID": "\(ref.cloudID)"])
          kept = true
          // The DATA there is the version this device knows (its own last write, perhaps):
          // the RCRD changed elsewhere may describe another one.
          if let data, let eTag = ref.eTagData, data.eTag == eTag,
            let entry = try describeKeptData(ref, data: data)
          {
            logged.append(entry)
          } else if r.decoded?.cloudID == ref.cloudID, !arriving {
            logged.append(keptEntry(ref, eTagRcrd: nil, eTagData: nil))
          }
          continue
        }
        // Removed (or found gone after a request of this delete's was sent: a transport retry
        // may have answered for it): announced.
        removedRcrd = true
        removedHere = true
      }
      // Then the DATA: the version known here, or (eTag unknown: uploaded while the delete
      // waited) the one beside the RCRD just removed. A version written after the RCRD went
      // (its writer still has the node and uploads it again, with this DATA) is left in place.
      if let data, let eTag = ref.eTagData ?? (removedRcrd ? data.eTag : nil) {
        do {
          try store.delete(key: ref.dataKey, condition: .ifMatch(eTag))
        } catch StoreError.preconditionFailed, StoreError.notFound {
          let now = try context.headIfExists(ref.dataKey)
          if now?.eTag == eTag { throw StoreError.transient("spurious precondition failure") }
          if now != nil {
            context.logger.info(
              "delete: data changed remotely after the node's record was deleted; left in place",
              metadata: ["cloudID": "\(ref.cloudID)"])
          }
        }
      }
      if removedHere {
        announced.append(
          (
            ChangeLogEntry(
              cloudID: ref.cloudID, kind: .delete, rcrd: ref.rcrdKey, data: ref.dataKey),
            arriving
          ))
      }
    }
    logged += announced.filter { !$0.arriving || !placed.contains($0.entry.cloudID) }.map(\.entry)
    try write { tx in
      try tx.completeOperation(id: op.id)
      if !logged.isEmpty { try manager.log(logged, in: tx) }
      // A node kept for a remote change comes back here with a full scan: the change-log entry
      // that announced that change may have been read already (while the node was here).
      if kept { try tx.setSyncValue("1", forKey: PullManager.needsFullScanKey) }
    }
    if kept { manager.requestPull() }
  }
}

/// Thrown to stop comparing a remote version with local content at the first difference.
private struct ContentDiffers: Error {}

/// Reads a `CloudFileSource` from its start, a requested number of bytes at a time.
private struct LocalContentStream {
  private let source: CloudFileSource
  private var offset = 0
  private var handle: FileHandle?

  init(_ source: CloudFileSource) {
    self.source = source
    if case .file(let url) = source { handle = try? FileHandle(forReadingFrom: url) }
  }

  /// The next `count` bytes (fewer only at the end).
  mutating func next(_ count: Int) throws -> Data {
    switch source {
    case .data(let d):
      let lo = d.startIndex + min(offset, d.count)
      let hi = d.startIndex + min(offset + count, d.count)
      offset += hi - lo
      return d.subdata(in: lo..<hi)
    case .file:
      guard let handle else { throw SyncError.dataUnavailable("cleartext file vanished") }
      return try handle.read(upToCount: count) ?? Data()
    case .reader(let size, let read):
      let want = Int(min(UInt64(count), size - min(size, UInt64(offset))))
      var out = Data(count: want)
      var filled = 0
      try out.withUnsafeMutableBytes { b in
        while filled < want {
          let n = try read(UnsafeMutableRawBufferPointer(rebasing: b[filled..<want]))
          if n == 0 { break }
          filled += n
        }
      }
      offset += filled
      return out.prefix(filled)
    }
  }

  func close() { try? handle?.close() }
}
