public import Foundation
import Logging
public import ZDCCatalog
public import ZDCCore
import ZDCDisk
public import ZDCSync

/// What `zdc status` reports about a mount.
public struct MountStatus: Sendable, Hashable, Codable {
  /// Outstanding push operations.
  public var pendingItems: Int
  /// Bytes of committed content waiting for upload.
  public var pendingBytes: UInt64
  /// Conflicted copies not yet dealt with (renamed or deleted).
  public var conflicts: Int
  /// Paths of the first conflicted copies, as shown through the mount (relative to its root).
  public var conflictPaths: [String]
  /// Operations that failed at least once and wait for a retry.
  public var errors: Int
  /// Open files.
  public var openFiles: Int
  /// Bytes on disk of the local cache and staging files (content not uploaded yet included).
  public var cacheBytes: UInt64
  /// The cap eviction keeps the local cache under (`zdc mount --cache-size`).
  public var cacheCapBytes: UInt64

  public init(
    pendingItems: Int, pendingBytes: UInt64, conflicts: Int, conflictPaths: [String] = [],
    errors: Int, openFiles: Int, cacheBytes: UInt64, cacheCapBytes: UInt64
  ) {
    self.pendingItems = pendingItems
    self.pendingBytes = pendingBytes
    self.conflicts = conflicts
    self.conflictPaths = conflictPaths
    self.errors = errors
    self.openFiles = openFiles
    self.cacheBytes = cacheBytes
    self.cacheCapBytes = cacheCapBytes
  }
}

extension FileSystem {
  /// Counts for `zdc status`.
  public func status() throws -> MountStatus {
    let (pending, retrying, conflicted, paths) = try read { tx in
      let ids = try tx.nodeIDs(withTag: Self.conflictTag)
      let paths = try ids.prefix(Self.statusConflictPaths).map { id in
        try tx.path(of: id).components.map(NameEscape.shown).joined(separator: "/")
      }
      return (try tx.operationCount(), try tx.retryingOperationCount(), ids.count, paths)
    }
    let usage = disk.usage
    return MountStatus(
      pendingItems: pending, pendingBytes: usage.dirtyBytes, conflicts: conflicted,
      conflictPaths: paths, errors: retrying, openFiles: lock.withLock { handles.count },
      cacheBytes: usage.bytes, cacheCapBytes: usage.capBytes)
  }

  /// How many conflicted copies `status` names.
  static let statusConflictPaths = 10

  // MARK: Invalidation (called by the sync side after a pull changed the catalog)

  /// A pull added a node: the kernel forgets any negative entry for its name.
  public func nodeAppeared(_ node: Node) {
    guard let parent = node.parentID else { return }
    let p = inode(of: parent)
    let names = NameEscape.shownForms(node.name)
    // The plain name may shadow a case variant beside it, now shown escaped.
    let variant =
      NameEscape.isPlain(node.name) ? NameEscape.escaped(CaseVariant.name(for: node.name)) : nil
    post { n in
      for name in names { n.invalidateEntry(parent: p, name: name) }
      if let variant { n.invalidateEntry(parent: p, name: variant) }
      n.invalidateInode(p)
    }
  }

  /// A pull changed a node's content or attributes: the kernel re-reads them.
  public func nodeChanged(_ node: Node, change: NodeChange) {
    forgetCommit(node.id)
    let ino = inode(of: node.id)
    let parent = node.parentID.map { inode(of: $0) }
    post { n in
      n.invalidateInode(ino)
      if change.contains(.kind), let parent {
        for name in NameEscape.shownForms(node.name) {
          n.invalidateEntry(parent: parent, name: name)
        }
        n.invalidateInode(parent)
      }
    }
  }

  /// A pull moved or renamed a node.
  public func nodeMoved(_ node: Node, fromParent oldParent: NodeID, oldName: String) {
    let old = inode(of: oldParent)
    let oldShown = NameEscape.shownForms(oldName)
    let new = node.parentID.map { inode(of: $0) }
    let newShown = NameEscape.shownForms(node.name)
    post { n in
      for name in oldShown { n.invalidateEntry(parent: old, name: name) }
      n.invalidateInode(old)
      if let new {
        for name in newShown { n.invalidateEntry(parent: new, name: name) }
        n.invalidateInode(new)
      }
    }
  }

  /// A pull deleted a node (before or after its row left the catalog).
  public func nodeDeleted(_ node: Node) {
    guard let parent = node.parentID else { return }
    let p = inode(of: parent)
    let c = inode(of: node.id)
    let names = NameEscape.shownForms(node.name)
    afterDelete(node)
    post { n in
      for name in names { n.deleteEntry(parent: p, child: c, name: name) }
      // The kernel forgets a listing it keeps only when it held the entry itself.
      n.invalidateInode(p)
    }
  }
}

/// The engine's side of sync: gives the push side the staged content and sections of a node,
/// and turns the pull side's discoveries into kernel invalidations. Once a node's data is
/// uploaded, the staged version that was handed out becomes its clean cached copy.
public final class FileSystemSyncDelegate: SyncDelegate, @unchecked Sendable {
  // @unchecked: `handedOut` is only touched under `lock`.
  /// The engine.
  public let fileSystem: FileSystem
  private let lock = NSLock()
  /// The staged version last given to the push side, per node.
  private var handedOut: [NodeID: Int64] = [:]

  public init(fileSystem: FileSystem) { self.fileSystem = fileSystem }

  public func data(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  {
    guard let staged = stagedOrStagingCached(node) else { return nil }
    lock.withLock { handedOut[node.id] = staged.version }
    return .cryptoFile(staged.url, key: staged.key)
  }

  public func willAssignNewCloudID(
    to node: Node, at path: TreesystemPath, transaction: CloudTransaction
  ) {
    // Cached content is found by cloudID: staged now, it stays the node's.
    _ = stagedOrStagingCached(node)
  }

  /// A node's staged content; with nothing staged but its content cached (a node kept and
  /// uploaded again after another device deleted it, say: its version is no longer named, and
  /// the cache holds the one it had here), the cached content staged first, so that an upload
  /// carries it (a cache entry could be evicted under the upload) and a new cloudID keeps it.
  /// Before, such a node's content went up empty.
  private func stagedOrStagingCached(_ node: Node) -> StagedData? {
    let disk = fileSystem.disk
    if let staged = disk.stagedData(forNode: node.id, exporting: true) { return staged }
    guard let cached = cachedForUpload(node) else { return nil }
    defer { cached.close() }
    do {
      let w = try disk.stagingFile(forNode: node.id, base: .cached(cached))
      defer { w.close() }
      try disk.commitStaging(w)
    } catch {
      Logger(label: "zdc.sync").warning(
        "cannot stage cached content for upload", metadata: ["error": "\(error)"])
      return nil
    }
    return disk.stagedData(forNode: node.id, exporting: true)
  }

  public func hasContent(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> Bool
  {
    if fileSystem.disk.hasStagedData(forNode: node.id) { return true }
    guard let cached = cachedForUpload(node) else { return false }
    cached.close()
    return true
  }

  /// The cached content an upload of `node` carries when nothing is staged, complete: the
  /// version it names, or, when it names none, the newest complete version of its cloudID
  /// (`nil` for a node without content).
  private func cachedForUpload(_ node: Node) -> CachedFileHandle? {
    guard node.dataSize > 0 else { return nil }
    let disk = fileSystem.disk
    guard let eTag = node.eTagData else {
      return disk.newestCompleteCachedFile(cloudID: node.cloudID)
    }
    guard let cached = disk.cachedFile(cloudID: node.cloudID, eTag: eTag) else { return nil }
    guard cached.isComplete else {
      cached.close()
      return nil
    }
    return cached
  }

  public func didPushNodeData(_ node: Node, at path: TreesystemPath, transaction: CloudTransaction)
  {
    // Only a version known to be the uploaded one is marked: an upload resumed after a restart
    // may not have asked for its data again, and a newer version must stay dirty.
    guard let version = lock.withLock({ handedOut.removeValue(forKey: node.id) }),
      let eTag = node.eTagData
    else { return }
    // Only after the catalog records the new eTag: moving the staged file into the cache
    // earlier would let a concurrent open see neither the staged content nor the eTag that
    // names the cached copy, and read the file as empty.
    let disk = fileSystem.disk
    let (nodeID, cloudID) = (node.id, node.cloudID)
    transaction.afterCommit {
      do {
        try disk.markUploaded(nodeID: nodeID, version: version, cloudID: cloudID, eTag: eTag)
      } catch {
        Logger(label: "zdc.sync").warning(
          "cannot record an upload in the cache", metadata: ["error": "\(error)"])
      }
    }
  }

  public func metadata(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  {
    section(node, "zdcfs.meta", transaction)
  }

  public func thumbnail(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  {
    section(node, "zdcfs.thumb", transaction)
  }

  /// Gives the local content of a node that lost a data conflict to its conflicted copy: the
  /// copy uploads it, and the node goes back to the remote version.
  ///
  /// The copy's size becomes the content's: a close may have committed a newer version than
  /// the one whose upload met the conflict, its catalog write still waiting (that write then
  /// leaves the node alone: see `FileSystem.commitsInFlight`).
  func moveStagedContent(from nodeID: NodeID, to copyID: NodeID, _ tx: CloudTransaction) {
    let disk = fileSystem.disk
    lock.withLock { _ = handedOut.removeValue(forKey: nodeID) }
    let source: StagingFile
    do {
      guard let s = try disk.openStaged(forNode: nodeID) else { return }
      source = s
    } catch {
      Logger(label: "zdc.sync").warning(
        "cannot read the content of a conflicted node", metadata: ["error": "\(error)"])
      return
    }
    do {
      let copy = try disk.stagingFile(forNode: copyID, truncate: true)
      do {
        var offset: UInt64 = 0
        while offset < source.size {
          let chunk = try source.read(offset: offset, count: 1 << 20)
          if chunk.isEmpty { break }
          try copy.write(chunk, at: offset)
          offset += UInt64(chunk.count)
        }
        try disk.commitStaging(copy)
        copy.close()
      } catch {
        disk.discardStaging(copy)
        throw error
      }
      if let node = try tx.node(id: copyID), node.dataSize != source.size {
        _ = try tx.commitData(nodeID: copyID, size: source.size, mtime: nil)
      }
      // Only now is the version the copy's (a failure above leaves it the node's).
      let fs = fileSystem
      fs.lock.withLock {
        if let c = fs.commitsInFlight[nodeID], c.version == source.version {
          fs.commitsInFlight[nodeID] = (c.version, true)
        }
      }
      disk.discardStaging(source)
    } catch {
      source.close()
      Logger(label: "zdc.sync").warning(
        "cannot move the content of a conflicted node to its copy",
        metadata: ["error": "\(error)"])
    }
  }

  func section(_ node: Node, _ tag: String, _ tx: CloudTransaction) -> NodeData? {
    if case .data(let d)? = try? tx.tag(forNodeID: node.id, identifier: tag), !d.isEmpty {
      return .data(d)
    }
    return nil
  }

  public func didDiscoverNewNode(
    _ node: Node, at path: TreesystemPath, transaction: CloudTransaction
  ) {
    fileSystem.nodeAppeared(node)
  }

  public func didDiscoverModifiedNode(
    _ node: Node, change: NodeChange, at path: TreesystemPath, transaction: CloudTransaction
  ) {
    if change.contains(.data) {
      // The local section copies describe the old version.
      try? transaction.setTag(nil, forNodeID: node.id, identifier: "zdcfs.meta")
      try? transaction.setTag(nil, forNodeID: node.id, identifier: "zdcfs.thumb")
    }
    fileSystem.nodeChanged(node, change: change)
  }

  public func didDiscoverMovedNode(
    _ node: Node, from oldPath: TreesystemPath, to newPath: TreesystemPath,
    transaction: CloudTransaction
  ) {
    guard let oldParentPath = oldPath.parent, let oldName = oldPath.name,
      let oldParent = try? transaction.node(path: oldParentPath)
    else {
      fileSystem.nodeChanged(node, change: .parent)
      return
    }
    fileSystem.nodeMoved(node, fromParent: oldParent.id, oldName: oldName)
  }

  public func didDiscoverDeletedNode(
    _ node: Node, at path: TreesystemPath, timestamp: Date?, transaction: CloudTransaction
  ) {
    fileSystem.nodeDeleted(node)
  }

  public func didRenameNode(_ node: Node, oldName: String, transaction: CloudTransaction) {
    // The kernel may hold the old name's entry (a lookup before the sync): it forgets it.
    guard let parent = node.parentID else { return }
    fileSystem.nodeMoved(node, fromParent: parent, oldName: oldName)
  }

  public func didDiscoverConflict(
    _ kind: ConflictKind, node: Node, other: Node?, at path: TreesystemPath,
    transaction: CloudTransaction
  ) {
    if let other {
      if kind == .data { moveStagedContent(from: node.id, to: other.id, transaction) }
      try? transaction.setTag(.int(1), forNodeID: other.id, identifier: FileSystem.conflictTag)
      fileSystem.nodeAppeared(other)
    }
    fileSystem.nodeChanged(node, change: .data)
  }
}
