import Foundation
import Logging
import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// The push manager's private resume state of a DATA upload, kept in the operation's
/// `multipartState` (JSON).
struct DataUploadState: Codable {
  /// Outer headers (base64) of the CloudFiles this operation has tried to put: each is unique
  /// (random nonce prefix), so finding one in the store proves the put landed.
  var headers: [String] = []
  /// An unfinished multipart upload.
  var multipart: MultipartState?

  struct MultipartState: Codable {
    var uploadID: String
    var key: String
    var file: String
    var generation: Int64
    var partSize: UInt64
    var size: UInt64
    var header: String
  }

  mutating func remember(_ header: Data) {
    headers.append(header.base64EncodedString())
    if headers.count > 8 { headers.removeFirst(headers.count - 8) }
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
    case .move: try move()
    case .deleteLeaf, .deleteNode: try delete()
    }
  }

  private func write<T>(_ body: (CloudTransaction) throws -> T) throws -> T {
    try context.catalog.write(context.userID, body)
  }

  /// Completes the operation when its node is gone (deleted locally while in flight). An
  /// earlier attempt may have written the store: the delete that waits for this operation
  /// learns the eTags of what is ours there, so it does not take them for remote edits.
  private func completeOrphan() throws {
    var found: [(rcrdKey: String, eTagRcrd: String?, eTagData: String?)] = []
    if let cloudID = op.cloudID, op.kind == .putRcrd || op.kind == .putData {
      let refs = try context.catalog.read(context.userID) {
        try $0.deleteOperations(referencing: cloudID).flatMap { $0.payload.objects ?? [] }
      }.filter { $0.cloudID == cloudID }
      let state = op.kind == .putData ? try loadState() : DataUploadState()
      for ref in refs {
        if op.kind == .putRcrd {
          if let r = try context.fetchRcrd(ref.rcrdKey), r.decoded?.cloudID == cloudID {
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
      if try tx.operation(id: op.id) != nil { try tx.completeOperation(id: op.id) }
    }
  }

  // MARK: RCRD

  private enum RcrdPutResult {
    case written(String)
    case pathConflict
  }

  /// Puts an RCRD; on 412, adopts the object when it is this node's (a crash window or our own
  /// earlier write), reports a path conflict when another node holds the key.
  private func putRcrd(node: Node, key: String, condition: WriteCondition) throws -> RcrdPutResult {
    let body = try Rcrd.encode(node: node, publicKeys: context.publicKeys)
    do {
      return .written(try store.put(key: key, body: .data(body), condition: condition))
    } catch StoreError.preconditionFailed {
      guard let remote = try context.fetchRcrd(key) else {
        throw PushIssue.needsPull("RCRD of node \(node.id) is gone remotely")
      }
      if remote.decoded?.cloudID == node.cloudID {
        return .written(
          try store.put(key: key, body: .data(body), condition: .ifMatch(remote.info.eTag)))
      }
      if case .ifNoneMatch = condition { return .pathConflict }
      throw PushIssue.needsPull("another node holds the key of node \(node.id)")
    }
  }

  /// Renames a never-uploaded node to the first `name n.ext` free here and in the store.
  private func resolvePathConflict(_ node: Node) throws {
    guard let parentID = node.parentID else { return }
    let parent = try context.catalog.read(context.userID) { try $0.existingNode(id: parentID) }
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
      guard try tx.node(id: node.id) != nil else { return }
      let renamed = try tx.renameWithoutMove(node.id, to: chosen)
      let path = try tx.path(of: node.id)
      context.delegate.didDiscoverConflict(
        .path, node: renamed, other: nil, at: path, transaction: tx)
    }
    context.logger.info("path conflict: node renamed", metadata: ["node": "\(node.id)"])
    manager.requestPull()
  }

  private func putRcrd() throws {
    guard let node = job.node, let loc = job.location else { return try completeOrphan() }
    let condition: WriteCondition = node.eTagRcrd.map { .ifMatch($0) } ?? .ifNoneMatch
    switch try putRcrd(node: node, key: loc.rcrdKey, condition: condition) {
    case .pathConflict:
      try resolvePathConflict(node)
      throw PushIssue.retryNow
    case .written(let eTag):
      try write { tx in
        if let cur = try tx.node(id: node.id) {
          try tx.setCloudState(
            nodeID: node.id, eTagRcrd: eTag, lastModifiedRcrd: Date(), eTagData: cur.eTagData,
            lastModifiedData: cur.lastModifiedData, cloudDataInfo: cur.cloudDataInfo)
        } else {
          try tx.updateDeleteETags(
            cloudID: node.cloudID, rcrdKey: loc.rcrdKey, eTagRcrd: eTag, eTagData: nil)
        }
        // The RCRD is written whether or not the operation is still queued: record and log it.
        if try tx.operation(id: op.id) != nil { try tx.completeOperation(id: op.id) }
        try manager.log(
          [
            ChangeLogEntry(
              cloudID: node.cloudID, kind: .put, rcrd: loc.rcrdKey, data: loc.dataKey,
              eTagRcrd: eTag)
          ], in: tx)
      }
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
      guard let op = try tx.operation(id: op.id) else { throw SyncError.nodeGone(node.id) }
      let dl = context.delegate
      return (
        dl.data(for: node, at: path, transaction: tx),
        dl.metadata(for: node, at: path, transaction: tx),
        dl.thumbnail(for: node, at: path, transaction: tx), op.generation
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
    let raw = try context.catalog.read(context.userID) {
      try $0.operation(id: op.id)?.multipartState
    }
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
    var condition: WriteCondition = node.eTagData.map { .ifMatch($0) } ?? .ifNoneMatch
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
          return try dataConflict(node: node, loc: loc, path: path)
        }
      }
    } else {
      guard
        let e = try multipart(
          node: node, loc: loc, path: path, content: content, encoder: encoder, size: size,
          generation: generation, state: &state, condition: condition)
      else { return }
      eTag = e
    }
    let info = try? store.head(key: loc.dataKey)
    try write { tx in
      guard let cur = try tx.node(id: node.id), let curOp = try tx.operation(id: op.id) else {
        try tx.updateDeleteETags(
          cloudID: node.cloudID, rcrdKey: loc.rcrdKey, eTagRcrd: nil, eTagData: eTag)
        if try tx.operation(id: op.id) != nil { try tx.completeOperation(id: op.id) }
        return
      }
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
      if curOp.generation != generation {
        // Newer data was queued while this upload ran: upload again, now.
        try tx.setMultipartState(nil, forOperation: op.id)
        try tx.failOperation(id: op.id, retryAt: Date())
        return
      }
      try tx.completeOperation(id: op.id)
      var updated = cur
      updated.eTagData = eTag
      context.delegate.didPushNodeData(updated, at: try tx.path(of: node.id), transaction: tx)
    }
  }

  private func currentGeneration() throws -> Int64? {
    try context.catalog.read(context.userID) { try $0.operation(id: op.id)?.generation }
  }

  /// Uploads in parts, resuming a recorded upload; returns the eTag, or nil when the
  /// operation was settled otherwise (conflict).
  private func multipart(
    node: Node, loc: CloudObjectRef, path: TreesystemPath, content: Content,
    encoder: CloudFileEncoder, size: UInt64, generation: Int64, state: inout DataUploadState,
    condition initial: WriteCondition
  ) throws -> String? {
    var condition = initial
    let partSize = max(manager.config.partSize, 1)
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
      try? store.abortMultipartUpload(key: m.key, uploadID: m.uploadID)
      try? FileManager.default.removeItem(atPath: m.file)
      mp = nil
    }
    if mp == nil {
      let file = manager.config.workDirectory.appendingPathComponent(
        "push-\(context.account.deviceID)-\(op.id)-\(generation).cloudfile")
      try encoder.encode(
        metadata: content.metadata, thumbnail: content.thumbnail, data: content.source,
        toFileAt: file)
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
      if manager.isStopping { throw PushIssue.stopped }
      if try currentGeneration() != generation {
        // Newer data: abandon this upload and start over with it.
        try? store.abortMultipartUpload(key: m.key, uploadID: m.uploadID)
        try? FileManager.default.removeItem(at: url)
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
      context.progress.update { p in
        p.operations.removeAll { $0.nodeID == node.id && $0.kind == "upload" }
        p.operations.append(
          OperationProgress(nodeID: node.id, kind: "upload", totalBytes: m.size, doneBytes: hi))
      }
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
        try? store.abortMultipartUpload(key: m.key, uploadID: m.uploadID)
        try? FileManager.default.removeItem(at: url)
        state.multipart = nil
        try saveState(state)
        try dataConflict(node: node, loc: loc, path: path)
        return nil
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
    context.progress.update { p in p.operations.removeAll { $0.nodeID == node.id } }
    return eTag
  }

  /// The DATA changed remotely (412 that is not ours): the remote version keeps the name, the
  /// local version becomes a conflicted copy.
  private func dataConflict(node: Node, loc: CloudObjectRef, path: TreesystemPath) throws {
    guard let remote = try context.fetchRcrd(loc.rcrdKey), let rcrd = remote.decoded,
      rcrd.cloudID == node.cloudID
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
    var sizes: CloudFileSizes? = nil
    let store = self.store
    let key = loc.dataKey
    if let reader = try? CloudFileReader(
      key: node.encryptionKey, ciphertextSize: dataInfo.size,
      fetch: { try store.get(key: key, range: $0) })
    {
      sizes = reader.sizes
    }
    let deviceName = context.account.deviceName
    try write { tx in
      guard var cur = try tx.node(id: node.id), let parentID = cur.parentID else {
        if try tx.operation(id: op.id) != nil { try tx.completeOperation(id: op.id) }
        return
      }
      let base = ConflictNames.conflictedCopy(of: cur.name, date: Date(), deviceName: deviceName)
      var name = base
      var n = 2
      while try tx.child(of: parentID, named: name) != nil {
        name = ConflictNames.numbered(base, n)
        n += 1
      }
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
      // The node now stands for the remote version (its local attributes went to the copy).
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
        CloudDataInfo(
          metadataSize: $0.metadataSize, thumbnailSize: $0.thumbnailSize, dataSize: $0.dataSize,
          eTag: dataInfo.eTag, lastModified: dataInfo.lastModified)
      }
      if let s = sizes { cur.dataSize = s.dataSize }
      try tx.applyRemoteNode(cur, cloudName: try tx.cloudName(of: cur.id))
      try tx.dropOperations(ofNodeID: cur.id, kind: .putData)
      // The RCRD is uploaded again with the remote attributes, after any RCRD upload of the
      // node still in flight (which is left to finish: dropping it would leave its write in the
      // store unrecorded and unlogged, so other devices never learn that RCRD's eTag).
      try tx.requeueRcrdUpload(nodeID: cur.id)
      context.delegate.didDiscoverModifiedNode(
        cur, change: .data, at: curPath, transaction: tx)
    }
    context.logger.info(
      "data conflict: local version kept as a copy", metadata: ["node": "\(node.id)"])
  }

  // MARK: Move

  private func move() throws {
    guard let node = job.node, let loc = job.location, let origin = op.payload.origin else {
      return try completeOrphan()
    }
    // 0. The node must still be at its origin (or already at its target, when an earlier run
    // of this move got that far): otherwise it moved or vanished remotely, and a pull decides.
    if origin.rcrdKey != loc.rcrdKey,
      try context.fetchRcrd(origin.rcrdKey)?.decoded?.cloudID != node.cloudID,
      try context.fetchRcrd(loc.rcrdKey)?.decoded?.cloudID != node.cloudID
    {
      throw PushIssue.needsPull("node \(node.id) is no longer at the origin of its move")
    }
    // 1. The RCRD at the new place.
    var eTagRcrd: String
    switch try putRcrd(node: node, key: loc.rcrdKey, condition: .ifNoneMatch) {
    case .pathConflict:
      try resolveMovePathConflict(node)
      throw PushIssue.retryNow
    case .written(let e): eTagRcrd = e
    }
    // 2. The DATA: copy, then delete the old one if it is still the copied version.
    var eTagData: String? = nil
    if origin.dataKey != loc.dataKey {
      for _ in 0..<3 {
        guard let src = try context.headIfExists(origin.dataKey) else {
          eTagData = try context.headIfExists(loc.dataKey)?.eTag
          break
        }
        let copied: String
        do {
          copied = try store.copy(from: origin.dataKey, to: loc.dataKey, condition: .ifNoneMatch)
        } catch StoreError.preconditionFailed {
          let dst = try context.headIfExists(loc.dataKey)
          if dst?.eTag == src.eTag {
            copied = src.eTag
          } else if let dst {
            copied = try store.copy(
              from: origin.dataKey, to: loc.dataKey, condition: .ifMatch(dst.eTag))
          } else {
            throw PushIssue.needsPull("copy target of node \(node.id) vanished")
          }
        } catch StoreError.notFound {
          continue
        }
        do {
          try store.delete(key: origin.dataKey, condition: .ifMatch(copied))
          eTagData = copied
          break
        } catch StoreError.preconditionFailed {
          if try context.headIfExists(origin.dataKey) == nil {
            eTagData = copied
            break
          }
          continue  // changed since the copy: copy again
        }
      }
    } else {
      eTagData = node.eTagData
    }
    // 3. The old RCRD, if it is still this node's.
    if origin.rcrdKey != loc.rcrdKey {
      try deleteIfOurs(rcrdKey: origin.rcrdKey, cloudID: node.cloudID, eTag: origin.eTagRcrd)
    } else {
      eTagRcrd = try store.head(key: loc.rcrdKey).eTag
    }
    try write { tx in
      if let cur = try tx.node(id: node.id) {
        try tx.setCloudState(
          nodeID: node.id, eTagRcrd: eTagRcrd, lastModifiedRcrd: Date(),
          eTagData: eTagData ?? cur.eTagData, lastModifiedData: cur.lastModifiedData,
          cloudDataInfo: cur.cloudDataInfo)
      }
      try tx.completeOperation(id: op.id)
      try manager.log(
        [
          ChangeLogEntry(
            cloudID: node.cloudID, kind: .move, rcrd: loc.rcrdKey, data: loc.dataKey,
            fromRcrd: origin.rcrdKey, eTagRcrd: eTagRcrd, eTagData: eTagData)
        ], in: tx)
    }
  }

  /// A moved node's new name is taken remotely: rename it (the move goes to the new name).
  private func resolveMovePathConflict(_ node: Node) throws {
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
        guard try tx.node(id: node.id) != nil else { return }
        let renamed = try tx.renameWithoutMove(node.id, to: candidate)
        context.delegate.didDiscoverConflict(
          .path, node: renamed, other: nil, at: try tx.path(of: node.id), transaction: tx)
      }
      manager.requestPull()
      return
    }
    throw PushIssue.needsPull("no free name")
  }

  /// Deletes an RCRD if it still holds `cloudID` (conditional on its eTag). With
  /// `keepIfChanged`, an RCRD changed since `eTag` is kept (a remote edit). Returns whether the
  /// RCRD is gone.
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
    guard remote.decoded?.cloudID == cloudID else { return false }
    if keepIfChanged, let eTag, remote.info.eTag != eTag { return false }
    do {
      try store.delete(key: rcrdKey, condition: .ifMatch(remote.info.eTag))
      return true
    } catch StoreError.preconditionFailed {
      if try context.headIfExists(rcrdKey) == nil { return true }
      throw StoreError.transient("RCRD changed while being deleted")
    }
  }

  // MARK: Delete

  private func delete() throws {
    var logged: [ChangeLogEntry] = []
    for ref in (op.payload.objects ?? []).reversed() {
      // An RCRD changed remotely keeps the node (RCRD and DATA) for the next pull.
      if let eTag = ref.eTagRcrd, let now = try context.headIfExists(ref.rcrdKey),
        now.eTag != eTag
      {
        context.logger.info(
          "delete skipped: node changed remotely", metadata: ["cloudID": "\(ref.cloudID)"])
        continue
      }
      // Then DATA: if it changed remotely, keep the node too.
      var keepNode = false
      if let eTag = ref.eTagData {
        do {
          try store.delete(key: ref.dataKey, condition: .ifMatch(eTag))
        } catch StoreError.preconditionFailed {
          let now = try context.headIfExists(ref.dataKey)
          if now?.eTag == eTag { throw StoreError.transient("spurious precondition failure") }
          keepNode = now != nil
        }
      } else if let info = try context.headIfExists(ref.dataKey) {
        // Unknown eTag (uploaded while the delete was queued): delete it only if the RCRD
        // beside it is still this node's.
        if let r = try context.fetchRcrd(ref.rcrdKey), r.decoded?.cloudID == ref.cloudID {
          do {
            try store.delete(key: ref.dataKey, condition: .ifMatch(info.eTag))
          } catch StoreError.preconditionFailed {
            let now = try context.headIfExists(ref.dataKey)
            if now?.eTag == info.eTag {
              throw StoreError.transient("spurious precondition failure")
            }
            keepNode = now != nil
          }
        }
      }
      if keepNode {
        context.logger.info(
          "delete skipped: data changed remotely", metadata: ["cloudID": "\(ref.cloudID)"])
        continue
      }
      if try deleteIfOurs(
        rcrdKey: ref.rcrdKey, cloudID: ref.cloudID, eTag: ref.eTagRcrd, keepIfChanged: true)
      {
        logged.append(
          ChangeLogEntry(cloudID: ref.cloudID, kind: .delete, rcrd: ref.rcrdKey, data: ref.dataKey))
      }
    }
    try write { tx in
      try tx.completeOperation(id: op.id)
      if !logged.isEmpty { try manager.log(logged, in: tx) }
    }
  }
}
