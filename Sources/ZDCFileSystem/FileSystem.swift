import Foundation
import Logging
import Synchronization
public import ZDCCatalog
public import ZDCCore
import ZDCCrypto
public import ZDCDisk
public import ZDCSync

#if canImport(Glibc)
  import Glibc
#endif

/// Tuning of the filesystem engine.
public struct FileSystemOptions: Sendable {
  /// Files at least this large are read through ranged downloads instead of whole.
  public var rangedReadThreshold: UInt64 = 4 << 20
  /// Largest value of one extended attribute.
  public var maxXattrSize = 64 << 10
  /// Owner reported for every inode.
  public var uid: UInt32 = getuid()
  /// Group reported for every inode.
  public var gid: UInt32 = getgid()

  public init() {}
}

/// The mounted treesystem as POSIX sees it: inodes, presentation rules, open files, write-back
/// staging and kernel invalidation. Knows nothing of libfuse; every call is synchronous and
/// may be made from any thread.
public final class FileSystem: @unchecked Sendable {
  // @unchecked: mutable state is guarded by `lock` (tables) and each `NodeContent.lock`.

  /// The catalog holding the treesystem.
  public let catalog: Catalog
  /// The local user whose home trunk is the mount root.
  public let userID: String
  /// Encrypted cache and staging.
  public let disk: DiskManager
  /// Lazy downloads; `nil` when offline-only (content not cached reads as an I/O error).
  public let downloads: DownloadManager?
  /// Tuning.
  public let options: FileSystemOptions
  /// The home trunk's node id (inode 1).
  public let homeID: NodeID
  /// When the user last made a request through the mount (background uploads give way).
  public let activity = ActivityMonitor()
  /// Where kernel invalidations go (set by the FUSE adapter). Setting `nil` waits for the
  /// invalidations already queued, so none reaches a session being torn down.
  public var notifier: (any KernelNotifier)? {
    get { lock.withLock { _notifier } }
    set {
      lock.withLock { _notifier = newValue }
      if newValue == nil { notifyQueue.sync {} }
    }
  }

  let log = Logger(label: "zdc.fs")
  let lock = NSLock()
  var _notifier: (any KernelNotifier)?
  var lookups: [Inode: UInt64] = [:]
  /// Inodes of nodes whose content went into another node (or its `.data`) by a replacing
  /// rename.
  var aliases: [Inode: (NodeID, Section)] = [:]
  var handles: [FileHandleID: OpenHandle] = [:]
  var contents: [ContentKey: NodeContent] = [:]
  /// Nodes deleted while open: their last state, until the last handle closes.
  var unlinked: [NodeID: Node] = [:]
  /// Directories removed while the kernel still held their inode (an open descriptor, a
  /// working directory), by inode: their last state, for `fstat(2)` (with no links), until
  /// the kernel forgets the inode.
  var removedDirectories: [Inode: Node] = [:]
  /// The last check of free space for batched commits (see `spaceForBatches`): until when it
  /// holds (coarse monotonic nanoseconds) shifted left by one, its answer in the low bit.
  let spaceCheck = Atomic<UInt64>(0)
  /// Size and mtime of the latest local commits, newest last (bounded): a read transaction
  /// that started just before a commit would otherwise show the old size.
  var recentCommits: [NodeID: (size: UInt64, mtime: FileTime)] = [:]
  var recentOrder: [NodeID] = []
  /// Closes of written files between their commit on disk and their catalog write: the staging
  /// version, and whether a data conflict settled meanwhile gave it to the node's conflicted
  /// copy (the catalog write then leaves the node alone; see `commitLocked`).
  var commitsInFlight: [NodeID: (version: Int64, handedOver: Bool)] = [:]
  /// Nodes with a download in progress (for `user.zdc.state`).
  var downloading: [NodeID: Int] = [:]
  /// Children found or named lately, by parent and exact name: hints, never trusted alone
  /// (see ``child(of:shown:_:)``), so they need no invalidation.
  let recentChildren = BoundedMap<ChildName, NodeID>(capacity: 4096)
  /// Access-narrowing kernel notifications queued and not yet delivered (see `post`).
  var urgentNotifications = 0
  /// Per node, the content version the kernel may hold in its page cache (see
  /// `keepPageCache`).
  var pageCacheVersions: [NodeID: ContentVersion] = [:]
  var nextHandle: FileHandleID = 1
  let notifyQueue = DispatchQueue(label: "zdc.fs.notify")

  /// Starts the engine over an account's catalog and disk cache.
  public init(
    catalog: Catalog, userID: String, disk: DiskManager, downloads: DownloadManager?,
    options: FileSystemOptions = FileSystemOptions()
  ) throws {
    self.catalog = catalog
    self.userID = userID
    self.disk = disk
    self.downloads = downloads
    self.options = options
    guard let home = try catalog.read(userID, { try $0.trunkNode(.home) }) else {
      throw FileSystemError.io("no home trunk for the user")
    }
    homeID = home.id
    // Staged content of nodes that are gone: deleted just before a crash, between the
    // catalog's commit of the deletion (or its journal entry) and the removal of the content.
    let staged = disk.stagedNodeIDs()
    if !staged.isEmpty {
      let present = try catalog.existingNodeIDs(among: staged)
      let gone = staged.filter { !present.contains($0) }
      for id in gone { disk.remove(nodeID: id) }
      if !gone.isEmpty {
        log.info("staged content of \(gone.count) deleted nodes removed")
      }
    }
  }

  // MARK: Inodes

  /// Section of a node an inode stands for.
  enum Section: UInt64, Sendable {
    case node = 0
    case data = 1
    case meta = 2
    case thumb = 3

    var fileName: String {
      switch self {
      case .node: return ""
      case .data: return ".data"
      case .meta: return ".meta"
      case .thumb: return ".thumb"
      }
    }

    init?(fileName: String) {
      switch fileName {
      case ".data": self = .data
      case ".meta": self = .meta
      case ".thumb": self = .thumb
      default: return nil
      }
    }

    var tag: String { self == .meta ? "zdcfs.meta" : "zdcfs.thumb" }
  }

  static let sectionShift: UInt64 = 56

  /// The inode of a node (the home trunk and node 1 trade places so the root is inode 1).
  func inode(of id: NodeID, _ section: Section = .node) -> Inode {
    let base: UInt64 = id == homeID ? 1 : (id == 1 ? UInt64(homeID) : UInt64(id))
    return base | (section.rawValue << Self.sectionShift)
  }

  /// The node and section of an inode.
  func resolve(_ ino: Inode) -> (NodeID, Section) {
    let section = Section(rawValue: ino >> Self.sectionShift) ?? .node
    let base = ino & ((1 << Self.sectionShift) - 1)
    if let alias = lock.withLock({ aliases[base] }) {
      return (alias.0, section == .node ? alias.1 : section)
    }
    let id: NodeID = base == 1 ? homeID : (NodeID(base) == homeID ? 1 : NodeID(base))
    return (id, section)
  }

  // MARK: Catalog helpers

  func read<T>(_ body: (CloudTransaction) throws -> T) throws -> T {
    do { return try catalog.read(userID, onWriter: true, body) } catch { throw Self.map(error) }
  }

  /// A catalog write. Metadata changes (names, modes, times, xattrs) and the catalog side of
  /// content commits are `.soon`: in the catalog's redo journal when this returns (they
  /// survive a crash of the daemon), committed in batches (see ``Catalog/Commit/soon``) or at
  /// `fsync(2)`.
  ///
  /// Batching is off while the state directory's disk is nearly full: a batch whose commit
  /// fails is lost as a whole, so each change then commits (and fails) on its own.
  func write<T>(commit: Catalog.Commit = .now, _ body: (CloudTransaction) throws -> T) throws -> T {
    let commit: Catalog.Commit = commit == .soon && spaceForBatches() ? .soon : .now
    do { return try catalog.write(userID, commit: commit, body) } catch { throw Self.map(error) }
  }

  /// Free space below which metadata changes are not batched.
  static let batchingFreeSpace: UInt64 = 256 << 20

  /// True while the state directory's disk has room for batched commits (checked at most
  /// every 0.2 s).
  func spaceForBatches() -> Bool {
    // Every `.soon` write asks: the coarse clock (no system call) and one atomic load.
    let now = UInt64(ActivityMonitor.monotonicNanoseconds())
    let check = spaceCheck.load(ordering: .relaxed)
    if now < check >> 1 { return check & 1 == 1 }
    var st = statvfs()
    let ok =
      statvfs(disk.directory.path, &st) == 0
      && UInt64(st.f_bavail) * UInt64(st.f_frsize) >= Self.batchingFreeSpace
    spaceCheck.store((now + 200_000_000) << 1 | (ok ? 1 : 0), ordering: .relaxed)
    return ok
  }

  static func map(_ error: any Error) -> any Error {
    switch error {
    case let e as FileSystemError: return e
    case let e as CatalogError:
      switch e {
      case .nodeNotFound, .parentNotFound, .pathNotFound: return FileSystemError.notFound
      case .nameTaken: return FileSystemError.exists
      case .notADirectory: return FileSystemError.notADirectory
      case .cycle: return FileSystemError.invalidArgument
      case .invalidOperation: return FileSystemError.notPermitted
      case .outOfSpace: return FileSystemError.noSpace
      default: return FileSystemError.io("catalog: \(e)")
      }
    case let e as DiskError:
      if case .noSpace = e { return FileSystemError.noSpace }
      if case .fileTooLarge = e { return FileSystemError.fileTooLarge }
      return FileSystemError.io("disk: \(e)")
    case StoreError.io(_, let code) where code == ENOSPC || code == EDQUOT:
      return FileSystemError.noSpace
    case StoreError.io(_, let code) where code == EFBIG:
      return FileSystemError.fileTooLarge
    default: return FileSystemError.io("\(type(of: error))")
    }
  }

  /// True when a node shows as a directory.
  /// `hasChildren`, when the caller knows it, saves a query.
  func isDirectory(_ node: Node, _ tx: CloudTransaction, hasChildren: Bool? = nil) throws -> Bool {
    switch node.kind {
    case .trunk, .directory: return true
    case .symlink: return false
    case .file: return try hasChildren ?? tx.hasChildren(node.id)
    }
  }

  func existingNode(_ id: NodeID, _ tx: CloudTransaction) throws -> Node {
    if let n = try tx.node(id: id) { return n }
    if let snap = lock.withLock({ unlinked[id] ?? removedDirectories[inode(of: id)] }) {
      return snap
    }
    throw FileSystemError.notFound
  }

  /// The child of a directory named `shown` (as typed through the mount), or `nil`.
  func child(of parent: NodeID, shown: String, _ tx: CloudTransaction) throws -> Node? {
    switch try NameEscape.parse(shown) {
    case .name(let name) where NameEscape.isEscapedVariant(shown, parsedAs: name):
      // A case variant typed escaped: its name only while a sibling holds its plain name.
      guard let c = try tx.child(of: parent, named: name), c.name.utf8.elementsEqual(name.utf8),
        try variantIsShadowed(c.name, in: parent, tx)
      else { return nil }
      return c
    case .name(let name):
      // A child met lately is checked against its node: still there, under this name.
      if let id = recentChildren.get(ChildName(parent: parent, name: name)),
        let c = try tx.node(id: id),
        c.parentID == parent, c.name.utf8.elementsEqual(name.utf8)
      {
        return c
      }
      // The catalog matches names case-insensitively; the mount shows exact names only, so
      // the kernel never holds two spellings of one node (and `mv a A` reaches `rename`). A
      // name beside a sibling that differs from it only in case is kept as its case variant.
      let found = try tx.children(of: parent, sharingNameWith: name)
      if let c = found.first(where: { $0.name.utf8.elementsEqual(name.utf8) }) {
        recentChildren.put(ChildName(parent: parent, name: name), c.id)
        return c
      }
      guard found.count > 0, NameEscape.isPlain(name) else { return nil }
      let variant = CaseVariant.name(for: name)
      return found.first { $0.name.utf8.elementsEqual(variant.utf8) }
    case .hashed(let typed):
      var after: NodeID = 0
      while true {
        let batch = try tx.children(of: parent, afterID: after, limit: 512)
        if batch.isEmpty { return nil }
        if let hit = try batch.first(where: { try shownName(of: $0, tx) == typed }) { return hit }
        after = batch.last!.id
      }
    }
  }

  /// Whether a sibling holds exactly the plain name that the case variant `name` stands for
  /// (then the variant is shown escaped: see ``NameEscape/shown(_:baseTaken:)``).
  func variantIsShadowed(_ name: String, in parent: NodeID, _ tx: CloudTransaction) throws -> Bool {
    guard let base = NameEscape.variantBase(name) else { return false }
    return try tx.children(of: parent, sharingNameWith: base).contains {
      $0.name.utf8.elementsEqual(base.utf8)
    }
  }

  /// The name a child is shown as in its directory.
  func shownName(of c: Node, _ tx: CloudTransaction) throws -> String {
    // Most names are plain: no look at the siblings (a readdir asks this for every entry).
    if NameEscape.isPlain(c.name) { return c.name }
    guard let parent = c.parentID, NameEscape.variantBase(c.name) != nil else {
      return NameEscape.shown(c.name)
    }
    return NameEscape.shown(c.name, baseTaken: try variantIsShadowed(c.name, in: parent, tx))
  }

  /// Runs `body` (which creates or moves an entry named `name` into `parent`); when the name is
  /// taken by a sibling whose name differs only in case, runs it again with the name's case
  /// variant (see ``CaseVariant``), so that both are kept, as a local file system keeps them.
  @discardableResult
  func placing<T>(
    _ name: String, in parent: NodeID, shown: String, _ tx: CloudTransaction,
    _ body: (String) throws -> T
  ) throws -> T {
    do {
      return try body(name)
    } catch let error as CatalogError {
      guard case .nameTaken = error, NameEscape.isPlain(name),
        try child(of: parent, shown: shown, tx) == nil
      else { throw error }
      return try body(CaseVariant.name(for: name))
    }
  }

  /// The treesystem name for a new entry typed through the mount.
  func newName(_ shown: String) throws -> String {
    if shown.utf8.count > NameEscape.maxBytes { throw FileSystemError.nameTooLong }
    switch try NameEscape.parse(shown) {
    // A case variant is made by the file system, never typed as a new name.
    case .name(let n) where NameEscape.isEscapedVariant(shown, parsedAs: n):
      throw FileSystemError.invalidArgument
    case .name(let n): return n
    case .hashed: throw FileSystemError.invalidArgument
    }
  }

  // MARK: Attributes

  func attributes(
    of node: Node, _ section: Section, _ tx: CloudTransaction, ino: Inode? = nil,
    hasChildren: Bool? = nil
  ) throws -> Attributes {
    let inode = ino ?? self.inode(of: node.id, section)
    var type: FileType
    var size: UInt64
    var mode = node.mode & 0o7777
    var mtime = node.mtime
    var links: UInt32 = 1
    switch section {
    case .node:
      if node.kind == .symlink {
        type = .symlink
        size = UInt64(node.symlinkTarget?.utf8.count ?? 0)
      } else if try isDirectory(node, tx, hasChildren: hasChildren) {
        type = .directory
        size = 4096
      } else {
        type = Self.fileType(node.mode)
        size = type == .regular ? node.dataSize : 0
      }
    case .data:
      type = .regular
      size = node.dataSize
      mode &= 0o666
    case .meta, .thumb:
      type = .regular
      size = try sectionSize(node, section, tx)
      mode &= 0o666
    }
    if lock.withLock({
      unlinked[node.id] != nil || (section == .node && removedDirectories[inode] != nil)
    }) {
      links = 0
    }
    if type == .regular, section == .node || section == .data {
      // The open writer first, then the latest commit: a commit records itself before it
      // drops the writer, so one of the two is always seen (whatever the snapshot's age).
      var fromWriter = false
      // Without the content's lock: a commit holds it while it writes the catalog, and this
      // runs inside a catalog read (see `NodeContent.uncommitted`).
      if let c = lock.withLock({ contents[ContentKey(node.id, .data)] }),
        c.key.section == .data, let u = c.uncommitted()
      {
        size = u.size
        fromWriter = true
        if let m = u.mtime { mtime = m }
      }
      if !fromWriter, let recent = lock.withLock({ recentCommits[node.id] }) {
        size = recent.size
        mtime = recent.mtime
      }
    }
    if section == .meta || section == .thumb,
      let c = lock.withLock({ contents[ContentKey(node.id, section)] })
    {
      if let u = c.uncommitted() { size = u.size }
    }
    return Attributes(
      inode: inode, type: type, mode: mode, size: size, linkCount: links, mtime: mtime,
      ctime: mtime, uid: options.uid, gid: options.gid)
  }

  func sectionSize(_ node: Node, _ section: Section, _ tx: CloudTransaction) throws -> UInt64 {
    if case .data(let d)? = try tx.tag(forNodeID: node.id, identifier: section.tag) {
      return UInt64(d.count)
    }
    guard let info = node.cloudDataInfo, info.eTag == node.eTagData else { return 0 }
    return section == .meta ? info.metadataSize : info.thumbnailSize
  }

  /// The section's bytes: the local value, else the cloud's (downloaded).
  func sectionBytes(_ node: Node, _ section: Section) throws -> Data {
    let local = try read { tx -> Data? in
      if case .data(let d)? = try tx.tag(forNodeID: node.id, identifier: section.tag) { return d }
      return nil
    }
    if let local { return local }
    guard let info = node.cloudDataInfo, info.eTag == node.eTagData,
      (section == .meta ? info.metadataSize : info.thumbnailSize) > 0
    else { return Data() }
    guard let downloads else { throw FileSystemError.unavailable }
    do {
      return try downloadingNode(node.id) {
        section == .meta
          ? try downloads.metadata(nodeID: node.id) : try downloads.thumbnail(nodeID: node.id)
      }
    } catch { throw FileSystemError.io("download failed") }
  }

  func noteLookup(_ ino: Inode) {
    lock.withLock { lookups[ino, default: 0] += 1 }
  }

  /// Records a local commit's size and mtime (see `recentCommits`).
  func noteCommit(_ id: NodeID, size: UInt64, mtime: FileTime) {
    lock.withLock {
      if recentCommits.updateValue((size, mtime), forKey: id) == nil { recentOrder.append(id) }
      if recentOrder.count > 4096 {
        for old in recentOrder.prefix(1024) { recentCommits[old] = nil }
        recentOrder.removeFirst(1024)
      }
    }
  }

  /// Forgets what `noteCommit` recorded (the node changed otherwise).
  func forgetCommit(_ id: NodeID) {
    lock.withLock { recentCommits[id] = nil }
  }

  /// Runs a download, showing the node as `downloading` meanwhile.
  func downloadingNode<T>(_ id: NodeID, _ body: () throws -> T) throws -> T {
    lock.withLock { downloading[id, default: 0] += 1 }
    defer {
      lock.withLock {
        let left = (downloading[id] ?? 1) - 1
        downloading[id] = left > 0 ? left : nil
      }
    }
    return try body()
  }

  // MARK: Lookup and attributes

  /// Looks up `name` in a directory; counts one kernel reference to the inode found.
  public func lookup(parent: Inode, name: String) throws -> Attributes {
    let (pid, psec) = resolve(parent)
    guard psec == .node else { throw FileSystemError.notADirectory }
    let attrs = try read { tx -> Attributes in
      let p = try existingNode(pid, tx)
      guard try isDirectory(p, tx) else { throw FileSystemError.notADirectory }
      if let section = Section(fileName: name) {
        let a = try attributes(of: p, section, tx)
        if a.size == 0, !isOpen(ContentKey(pid, section == .data ? .data : section)) {
          throw FileSystemError.notFound
        }
        return a
      }
      if name.utf8.count > NameEscape.maxBytes { throw FileSystemError.nameTooLong }
      guard let c = try child(of: pid, shown: name, tx) else { throw FileSystemError.notFound }
      return try attributes(of: c, .node, tx)
    }
    noteLookup(attrs.inode)
    return attrs
  }

  /// Drops `count` kernel references to an inode.
  public func forget(_ ino: Inode, count: UInt64) {
    lock.withLock {
      let left = (lookups[ino] ?? 0) &- min(count, lookups[ino] ?? 0)
      if left == 0 {
        lookups[ino] = nil
        removedDirectories[ino] = nil
        aliases[ino & ((1 << Self.sectionShift) - 1)] = nil
      } else {
        lookups[ino] = left
      }
    }
  }

  /// The attributes of an inode.
  public func getattr(_ ino: Inode) throws -> Attributes {
    let (id, section) = resolve(ino)
    return try read { tx in try attributes(of: try existingNode(id, tx), section, tx, ino: ino) }
  }

  /// Changes mode, size, times (and refuses a change of owner).
  /// A size change by a `caller` other than the superuser clears a file's set-user-ID and
  /// set-group-ID bits (see ``modeAfterUnprivilegedWrite(_:)``).
  public func setattr(
    _ ino: Inode, _ changes: AttributeChanges, handle: FileHandleID? = nil,
    caller: Caller = .superuser
  ) throws -> Attributes {
    let (id, section) = resolve(ino)
    if let u = changes.uid, u != options.uid { throw FileSystemError.notPermitted }
    if let g = changes.gid, g != options.gid { throw FileSystemError.notPermitted }
    if let size = changes.size {
      switch section {
      case .node, .data:
        let isDir = try read { tx in try isDirectory(try existingNode(id, tx), tx) }
        if section == .node, isDir { throw FileSystemError.isADirectory }
        try truncate(id, to: size)
        if section == .node, !caller.isSuperuser, changes.mode == nil {
          try clearPrivilegeBits(id)
        }
      case .meta, .thumb:
        try mutateSection(id, section) {
          $0 = Data($0.prefix(Int(size))) + Data(count: max(0, Int(size) - $0.count))
        }
      }
    }
    if changes.mode != nil || changes.mtime != nil {
      let mtime: FileTime? = changes.mtime.map {
        if case .time(let t) = $0 { return t }
        return FileTime(Date())
      }
      if let mtime, let c = lock.withLock({ contents[ContentKey(id, .data)] }) {
        c.lock.withLock { if c.writer != nil { c.pendingMtime = mtime } }
      }
      if section == .node || section == .data {
        let lost = try write(commit: .soon) { tx -> (search: Bool, read: Bool) in
          guard var n = try tx.node(id: id) else { return (false, false) }
          var lost = (search: false, read: false)
          // Only a directory losing search or read bits matters (asked only then: a file's
          // kind takes a query).
          if let m = changes.mode, n.mode & 0o555 & ~m != 0, try isDirectory(n, tx) {
            lost = (n.mode & 0o111 & ~m != 0, n.mode & 0o444 & ~m != 0)
          }
          if let m = changes.mode { n.mode = n.mode & UInt32(S_IFMT) | m & 0o7777 }
          if let mtime { n.mtime = mtime }
          if n.kind != .trunk { try tx.updateNode(n) }
          if mtime != nil, lock.withLock({ recentCommits[id] }) != nil {
            noteCommit(id, size: n.dataSize, mtime: n.mtime)
          }
          return lost
        }
        if let m = changes.mode, Self.modeAfterUnprivilegedWrite(m) != m {
          armPrivilegeClearing(id)
        }
        if lost.search { try forgetChildEntries(of: id, beforeNextRequest: true) }
        if lost.read {
          // The kernel may keep a listing of the directory it read before; it must ask again
          // (and meet the read check).
          let dir = inode(of: id, .node)
          post(beforeNextRequest: true) { $0.invalidateInode(dir) }
        }
      }
    }
    return try getattr(ino)
  }

  // MARK: Creating

  func requireDirectory(_ parent: Inode, _ tx: CloudTransaction) throws -> Node {
    let (pid, psec) = resolve(parent)
    guard psec == .node else { throw FileSystemError.notADirectory }
    guard let p = try tx.node(id: pid) else { throw FileSystemError.notFound }
    guard try isDirectory(p, tx) else { throw FileSystemError.notADirectory }
    return p
  }

  func makeNode(parent: Inode, name shown: String, kind: NodeKind, mode: UInt32, target: String?)
    throws -> Attributes
  {
    try makeNodeReturningNode(
      parent: parent, name: shown, kind: kind, mode: mode, target: target
    ).0
  }

  func makeNodeReturningNode(
    parent: Inode, name shown: String, kind: NodeKind, mode: UInt32, target: String?
  ) throws -> (Attributes, Node) {
    if Section(fileName: shown) != nil { throw FileSystemError.exists }
    let name = try newName(shown)
    let (attrs, node) = try write(commit: .soon) { tx -> (Attributes, Node) in
      let p = try requireDirectory(parent, tx)
      // A name taken throws `nameTaken` (EEXIST); one taken only up to case is kept as its
      // case variant.
      let node = try placing(name, in: p.id, shown: shown, tx) { name in
        try tx.createNode(
          Node(
            uuid: "", localUserID: userID, parentID: p.id, name: name, kind: kind,
            shareList: .owner(userID), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
            cloudID: "", mode: Self.storedMode(mode, kind: kind), mtime: FileTime(Date()),
            symlinkTarget: target))
      }
      return (try attributes(of: node, .node, tx, hasChildren: false), node)
    }
    recentChildren.put(ChildName(parent: node.parentID ?? 0, name: node.name), node.id)
    noteLookup(attrs.inode)
    return (attrs, node)
  }

  /// Creates a directory node.
  public func mkdir(parent: Inode, name: String, mode: UInt32) throws -> Attributes {
    try makeNode(parent: parent, name: name, kind: .directory, mode: mode, target: nil)
  }

  /// Creates a symbolic link node.
  public func symlink(target: String, parent: Inode, name: String) throws -> Attributes {
    try makeNode(parent: parent, name: name, kind: .symlink, mode: 0o777, target: target)
  }

  /// A symbolic link's target.
  public func readlink(_ ino: Inode) throws -> String {
    let (id, _) = resolve(ino)
    return try read { tx in
      let n = try existingNode(id, tx)
      guard n.kind == .symlink, let t = n.symlinkTarget else {
        throw FileSystemError.invalidArgument
      }
      return t
    }
  }

  /// `mknod(2)`: a regular file (type `S_IFREG`, or none) is made empty, as `create` makes it,
  /// without opening it; so are a FIFO (`mkfifo`) and a socket's name (`bind(2)`), as file
  /// nodes whose mode keeps their type (the kernel carries their data). Devices are refused
  /// with `notPermitted` (`EPERM`, what mknod(2) answers for a type the file system does not
  /// support): a file in a treesystem is content that syncs.
  public func mknod(parent: Inode, name: String, mode: UInt32) throws -> Attributes {
    let type = mode & UInt32(S_IFMT)
    guard [0, S_IFREG, S_IFIFO, S_IFSOCK].contains(type) else {
      throw FileSystemError.notPermitted
    }
    return try makeNode(parent: parent, name: name, kind: .file, mode: mode, target: nil)
  }

  /// The mode a new node keeps: its permission bits, and the type of a FIFO or socket (file
  /// nodes otherwise: the type of the others follows from their kind).
  static func storedMode(_ mode: UInt32, kind: NodeKind) -> UInt32 {
    let type = mode & UInt32(S_IFMT)
    let special = kind == .file && (type == UInt32(S_IFIFO) || type == UInt32(S_IFSOCK))
    return mode & 0o7777 | (special ? type : 0)
  }

  /// How a file node presents: a FIFO or a socket when its mode says so, else a regular file.
  static func fileType(_ mode: UInt32) -> FileType {
    switch mode & UInt32(S_IFMT) {
    case UInt32(S_IFIFO): return .fifo
    case UInt32(S_IFSOCK): return .socket
    default: return .regular
    }
  }

  /// Hard links are refused: a treesystem is a tree.
  public func link(_ ino: Inode, newParent: Inode, newName: String) throws -> Attributes {
    throw FileSystemError.notPermitted
  }

  /// Creates (or, without `O_EXCL`, opens) a regular file and opens it.
  public func create(
    parent: Inode, name: String, mode: UInt32, flags: Int32, caller: Caller = .superuser
  ) throws -> (Attributes, OpenedFile) {
    let (pid, _) = resolve(parent)
    if let section = Section(fileName: name) {
      // Writing a directory's hidden section creates it.
      _ = try read { tx in try requireDirectory(parent, tx) }
      let ino = inode(of: pid, section)
      let opened = try open(ino, flags: flags, caller: caller)
      noteLookup(ino)
      return (try getattr(ino), opened)
    }
    let attrs: Attributes
    let node: Node
    do {
      (attrs, node) = try makeNodeReturningNode(
        parent: parent, name: name, kind: .file, mode: mode, target: nil)
    } catch FileSystemError.exists where flags & O_EXCL == 0 {
      // Raced with another create, or the name differs only in case from a sibling's.
      guard let a = try? lookup(parent: parent, name: name) else { throw FileSystemError.exists }
      return (a, try open(a.inode, flags: flags, caller: caller))
    }
    // A node this call made: empty, with no staged or cached content to look for.
    return (
      attrs, try open(attrs.inode, flags: flags & ~O_TRUNC, newNode: node, caller: caller)
    )
  }

  // MARK: Removing

  /// Removes a file or symlink (or empties a directory's hidden section).
  public func unlink(parent: Inode, name: String) throws {
    let (pid, _) = resolve(parent)
    if let section = Section(fileName: name) {
      if section == .data { try truncate(pid, to: 0) } else { try setSection(pid, section, Data()) }
      return
    }
    try write(commit: .soon) { tx in
      let p = try requireDirectory(parent, tx)
      guard let c = try child(of: p.id, shown: name, tx) else { throw FileSystemError.notFound }
      if try isDirectory(c, tx) { throw FileSystemError.isADirectory }
      // A file has just been found childless; a symlink's subtree is looked at.
      try tx.deleteNode(c.id, childless: c.kind == .file)
      afterDelete(c, tx)
    }
  }

  /// Removes an empty directory (one with no children and empty hidden sections).
  public func rmdir(parent: Inode, name: String) throws {
    if Section(fileName: name) != nil { throw FileSystemError.notADirectory }
    try write(commit: .soon) { tx in
      let p = try requireDirectory(parent, tx)
      guard let c = try child(of: p.id, shown: name, tx) else { throw FileSystemError.notFound }
      guard try isDirectory(c, tx) else { throw FileSystemError.notADirectory }
      if try tx.hasChildren(c.id) { throw FileSystemError.notEmpty }
      let sections = try sectionSize(c, .meta, tx) + sectionSize(c, .thumb, tx)
      if c.dataSize > 0 || sections > 0 { throw FileSystemError.notEmpty }
      try tx.deleteNode(c.id, childless: true)
      afterDelete(c, tx)
    }
  }

  /// Local clean-up after a node left the catalog: open files keep working until closed, and a
  /// directory the kernel still holds (an open descriptor, a working directory) answers
  /// `fstat(2)` until it forgets it. With `tx`, its staged and cached content goes once `tx`
  /// has committed (before, a crash would bring the node back without it).
  func afterDelete(_ node: Node, _ tx: CloudTransaction? = nil) {
    let open = lock.withLock { () -> Bool in
      let ino = inode(of: node.id)
      if node.kind == .directory, lookups[ino] != nil { removedDirectories[ino] = node }
      guard contents[ContentKey(node.id, .data)] != nil else { return false }
      unlinked[node.id] = node
      return true
    }
    forgetCommit(node.id)
    guard !open else { return }
    if let tx {
      tx.afterCommit { [disk] in disk.remove(nodeID: node.id) }
    } else {
      disk.remove(nodeID: node.id)
    }
  }

  // MARK: Rename

  /// Renames or moves an entry; see the "Editors' save pattern" article for the rule that keeps
  /// a replaced file's identity.
  public func rename(
    parent: Inode, name: String, newParent: Inode, newName shownNew: String, flags: RenameFlags
  ) throws {
    if flags.contains(.whiteout) || (flags.contains(.exchange) && flags.contains(.noReplace)) {
      throw FileSystemError.invalidArgument
    }
    if Section(fileName: name) != nil { throw FileSystemError.notPermitted }
    let targetSection = Section(fileName: shownNew)
    // A hashed form, or a case variant's escape, names an existing entry only: it is refused as
    // a new name (`nil` here), but valid for a rename over (or exchange with) that entry, as
    // any name shown in a directory is.
    let newName: String?
    do {
      newName = targetSection == nil ? try self.newName(shownNew) : shownNew
    } catch FileSystemError.invalidArgument {
      newName = nil
    }
    enum Plan {
      case done
      case replaceContent(source: Node, target: NodeID, section: Section)
    }
    let plan = try write(commit: .soon) { tx -> Plan in
      let p = try requireDirectory(parent, tx)
      let np = try requireDirectory(newParent, tx)
      guard let src = try child(of: p.id, shown: name, tx) else { throw FileSystemError.notFound }
      let srcIsDir = try isDirectory(src, tx)
      if let targetSection {
        // `mv file dir/.data`: the file's content becomes the directory's own content.
        guard targetSection == .data, !srcIsDir, src.kind == .file, !flags.contains(.exchange)
        else { throw FileSystemError.notPermitted }
        if flags.contains(.noReplace), np.dataSize > 0 { throw FileSystemError.exists }
        return .replaceContent(source: src, target: np.id, section: .data)
      }
      let dst = try child(of: np.id, shown: shownNew, tx)
      if let dst, dst.id != src.id {
        if flags.contains(.noReplace) { throw FileSystemError.exists }
        let dstIsDir = try isDirectory(dst, tx)
        // Replacing or exchanging, the source takes the target's stored name (a case variant
        // stays one).
        if flags.contains(.exchange) {
          let temp = ".zdcfs-exchange-\(src.uuid)"
          let srcName = src.name
          let srcParent = p.id
          try tx.moveNode(src.id, toParent: src.parentID!, name: temp)
          try tx.moveNode(dst.id, toParent: srcParent, name: srcName)
          try tx.moveNode(src.id, toParent: np.id, name: dst.name)
          return .done
        }
        if srcIsDir && !dstIsDir { throw FileSystemError.notADirectory }
        if !srcIsDir && dstIsDir { throw FileSystemError.isADirectory }
        if dstIsDir {
          if try tx.hasChildren(dst.id) { throw FileSystemError.notEmpty }
          try tx.deleteNode(dst.id, childless: true)
          try tx.moveNode(src.id, toParent: np.id, name: dst.name)
          afterDelete(dst, tx)
          return .done
        }
        // While the source is open, or the target open for writing, the rename keeps POSIX
        // semantics instead: each handle stays with its own file (the target's as an unlinked
        // file's), and so do its reads and writes. (A target open read-only reads the new
        // content: the editors' rule keeps it, as `sed -i` closes the original just before.)
        if src.kind == .file && dst.kind == .file && !isOpen(dst.id, writable: true)
          && !isOpen(src.id, writable: false) && Self.fileType(src.mode) == .regular
          && Self.fileType(dst.mode) == .regular
        {
          return .replaceContent(source: src, target: dst.id, section: .node)
        }
        try tx.deleteNode(dst.id)
        try tx.moveNode(src.id, toParent: np.id, name: dst.name)
        afterDelete(dst, tx)
        return .done
      }
      if flags.contains(.exchange) { throw FileSystemError.notFound }
      guard let newName else {
        // Onto itself, by the name it is shown as: nothing to do, as on a local file system.
        if dst?.id == src.id { return .done }
        throw FileSystemError.invalidArgument
      }
      try placing(newName, in: np.id, shown: shownNew, tx) { name in
        try tx.moveNode(src.id, toParent: np.id, name: name)
        recentChildren.put(ChildName(parent: np.id, name: name), src.id)
      }
      // Renaming a conflicted copy is how a user settles it.
      try tx.setTag(nil, forNodeID: src.id, identifier: Self.conflictTag)
      return .done
    }
    switch plan {
    case .done: break
    case .replaceContent(let source, let target, let section):
      try replaceContent(of: target, section, with: source)
    }
  }

  /// The editors' save rule: the target keeps its identity (cloudID, keys, place) and takes the
  /// source's content, mtime and sections — and, for a file target, its mode and xattrs; the
  /// source node is deleted. `section` is `.data` when the target is a directory's `.data`.
  func replaceContent(of targetID: NodeID, _ section: Section, with original: Node) throws {
    // Settle the source's own open writes first.
    if let c = lock.withLock({ contents[ContentKey(original.id, .data)] }) {
      try c.lock.withLock { try commitLocked(c) }
    }
    let source = (try? read { tx in try tx.node(id: original.id) }) ?? original
    let staging: StagingFile
    do {
      staging = try disk.stagingFile(forNode: targetID, truncate: true)
      try staging.truncate(to: 0)
      try copyContent(of: source, into: staging)
    } catch { throw Self.map(error) }
    let size = staging.size
    do {
      try disk.commitStaging(staging)
    } catch {
      staging.close()
      throw Self.map(error)
    }
    staging.close()
    if let c = lock.withLock({ contents[ContentKey(targetID, .data)] }) {
      c.lock.withLock {
        if c.writer === staging { c.writer = nil }
        c.dirty = false
        c.pendingMtime = nil
        c.resetReader()
      }
    }
    try write { tx in
      var t = try tx.existingNode(id: targetID)
      t.dataSize = size
      t.mtime = source.mtime
      if section == .node {
        t.mode = source.mode
        t.xattrs = source.xattrs
      }
      if t.kind != .trunk { try tx.updateNode(t) }
      for section in [Section.meta, .thumb] {
        let v = try tx.tag(forNodeID: source.id, identifier: section.tag)
        try tx.setTag(v, forNodeID: targetID, identifier: section.tag)
      }
      try tx.queueDataUpload(nodeID: targetID)
      if try tx.node(id: source.id) != nil { try tx.deleteNode(source.id) }
    }
    noteCommit(targetID, size: size, mtime: source.mtime)
    afterDelete(source)
    let srcIno = inode(of: source.id)
    lock.withLock { aliases[srcIno] = (targetID, section) }
    // The kernel moved the source's dentry over the target's: send it back to the node.
    if section == .data {
      let dir = inode(of: targetID)
      post { n in
        n.invalidateInode(dir | (Section.data.rawValue << Self.sectionShift))
        n.invalidateEntry(parent: dir, name: Section.data.fileName)
      }
    } else if let t = try? read({ tx in try tx.node(id: targetID) }), let parent = t.parentID {
      let names = NameEscape.shownForms(t.name)
      post { n in
        n.invalidateInode(self.inode(of: targetID))
        for name in names { n.invalidateEntry(parent: self.inode(of: parent), name: name) }
      }
    }
  }

  /// Copies a node's current content (staged, cached or downloaded) into a staging file.
  func copyContent(of node: Node, into staging: StagingFile) throws {
    var source = try openReadSource(node)
    defer { source.close() }
    let size = source.size
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    var offset: UInt64 = 0
    while offset < size {
      let n = try buffer.withUnsafeMutableBytes { try source.read(into: $0, at: offset, fs: self) }
      if n <= 0 { break }
      try buffer.withUnsafeBytes {
        try staging.write(UnsafeRawBufferPointer(rebasing: $0[0..<n]), at: offset)
      }
      offset += UInt64(n)
    }
  }

  // MARK: Listing

  /// Lists a directory from `offset` (0 for the start). `accept` packs one entry and returns
  /// false when the reply buffer is full; with `plus`, each accepted entry other than `.` and
  /// `..` counts one kernel reference. Offsets stay valid while the directory changes.
  ///
  /// `expected` is about how many entries the caller can take (a kernel buffer holds a few
  /// dozen): no more children than that are read and decoded at first.
  public func readdir(
    _ ino: Inode, offset: UInt64, plus: Bool, expected: Int = 256,
    accept: (DirectoryEntry) -> Bool
  ) throws {
    let (id, section) = resolve(ino)
    guard section == .node else { throw FileSystemError.notADirectory }
    let fixed: UInt64 = 5
    var after = offset
    var batch: [DirectoryEntry] = []
    var done = false
    var limit = min(256, max(8, expected))
    while !done {
      batch.removeAll(keepingCapacity: true)
      try read { tx in
        let node = try existingNode(id, tx)
        guard try isDirectory(node, tx) else { throw FileSystemError.notADirectory }
        if after < fixed {
          let me = try attributes(of: node, .node, tx, ino: ino)
          var parentAttrs = me
          if let pid = node.parentID, node.id != homeID, let p = try tx.node(id: pid) {
            parentAttrs = try attributes(of: p, .node, tx)
          }
          var fixedEntries: [(UInt64, String, Attributes)] = [
            (1, ".", me), (2, "..", parentAttrs),
          ]
          for (i, s) in [Section.data, .meta, .thumb].enumerated() {
            let a = try attributes(of: node, s, tx)
            if a.size > 0 { fixedEntries.append((UInt64(3 + i), s.fileName, a)) }
          }
          for (cookie, name, a) in fixedEntries where cookie > after {
            batch.append(DirectoryEntry(name: name, nextOffset: cookie, attributes: a))
          }
        }
        let children = try tx.children(
          of: id, afterID: NodeID(after > fixed ? after - fixed : 0), limit: limit)
        let parents = try tx.childrenWithChildren(of: id, among: children)
        var listed: [(ChildName, NodeID)] = []
        if plus { listed.reserveCapacity(children.count) }
        for c in children {
          let shown = try shownName(of: c, tx)
          if plus, shown == c.name { listed.append((ChildName(parent: id, name: c.name), c.id)) }
          batch.append(
            DirectoryEntry(
              name: shown, nextOffset: UInt64(c.id) + fixed,
              attributes: try attributes(
                of: c, .node, tx, hasChildren: parents.contains(c.id))))
        }
        // With attributes, the kernel takes the entries without looking them up: an `unlink`,
        // `rename` or `open` by name follows with no `lookup` to note the child (`rm -r`).
        recentChildren.put(contentsOf: listed)
        if children.count < limit { done = true }
      }
      limit = 256
      for e in batch {
        guard accept(e) else { return }
        if plus, e.name != ".", e.name != ".." { noteLookup(e.attributes.inode) }
        after = e.nextOffset
      }
    }
  }

  /// Makes the kernel forget its cached entries of a directory's children, so that the next
  /// path lookup through the directory asks again (and meets the permission check of a
  /// directory that may no longer be searched).
  func forgetChildEntries(of id: NodeID, beforeNextRequest: Bool = false) throws {
    let ino = inode(of: id, .node)
    var names = [Section.data, .meta, .thumb].map(\.fileName)
    var after: NodeID = 0
    while true {
      let children = try read { tx in try tx.children(of: id, afterID: after, limit: 1024) }
      names += children.flatMap { NameEscape.shownForms($0.name) }
      guard let last = children.last, children.count == 1024 else { break }
      after = last.id
    }
    let all = names
    post(beforeNextRequest: beforeNextRequest) { n in
      for name in all { n.invalidateEntry(parent: ino, name: name) }
    }
  }

  // MARK: Statistics

  /// Figures for `statfs(2)`: space of the filesystem holding the state directory.
  public func statfs() -> FileSystemStatistics {
    var s = statvfs()
    let ok = statvfs(disk.directory.path, &s) == 0
    let count = (try? read { tx in try tx.childCount(of: homeID) }) ?? 0
    let bsize = ok ? UInt64(s.f_frsize) : 4096
    return FileSystemStatistics(
      blockSize: bsize, blocks: ok ? UInt64(s.f_blocks) : 0,
      freeBlocks: ok ? UInt64(s.f_bfree) : 0, availableBlocks: ok ? UInt64(s.f_bavail) : 0,
      files: UInt64(count) + 1_000_000, freeFiles: 1_000_000_000,
      nameMax: UInt64(NameEscape.maxBytes))
  }

  /// `access(2)`: checks `mask` (`R_OK`, `W_OK`, `X_OK`; `F_OK` is existence) against the
  /// inode's permission bits for `caller` (see ``checkAccess(_:_:caller:)``).
  public func access(_ ino: Inode, mask: Int32, caller: Caller = .superuser) throws {
    try checkAccess(ino, AccessMask(rawValue: UInt32(mask & 7)), caller: caller)
  }

  /// Refuses with ``FileSystemError/accessDenied`` an access that `ino`'s permission bits do
  /// not give `caller` (owner, group or other bits, as `caller` is the inode's owner, in its
  /// group, or neither). The superuser may do anything but execute a regular file that has no
  /// execute bit. An empty mask checks only that the inode exists.
  public func checkAccess(_ ino: Inode, _ mask: AccessMask, caller: Caller) throws {
    let a = try getattr(ino)
    guard Self.permits(a, mask, caller) else { throw FileSystemError.accessDenied }
  }

  /// Refuses with ``FileSystemError/accessDenied`` moving the directory `name` of `parent` to
  /// another parent when `caller` may not write the directory itself (its `..` entry changes),
  /// as a local file system does. Anything else (a file, a rename within one parent, a name
  /// that does not exist) passes: the rename reports it.
  public func checkDirectoryMove(
    parent: Inode, name: String, newParent: Inode, caller: Caller
  ) throws {
    guard parent != newParent, !caller.isSuperuser, Section(fileName: name) == nil else { return }
    let (pid, _) = resolve(parent)
    let moved = try read { tx -> Attributes? in
      guard let c = try child(of: pid, shown: name, tx), try isDirectory(c, tx) else { return nil }
      return try attributes(of: c, .node, tx)
    }
    if let moved, !Self.permits(moved, .write, caller) { throw FileSystemError.accessDenied }
  }

  static func permits(_ a: Attributes, _ mask: AccessMask, _ caller: Caller) -> Bool {
    if caller.isSuperuser {
      return !mask.contains(.execute) || a.type == .directory || a.mode & 0o111 != 0
    }
    let bits =
      caller.uid == a.uid ? (a.mode >> 6) & 7 : caller.gid == a.gid ? (a.mode >> 3) & 7 : a.mode & 7
    return mask.rawValue & ~bits == 0
  }

  /// A regular file's mode once written or truncated by a caller that is not the superuser:
  /// without set-user-ID, and without set-group-ID when the group may execute (as the kernel
  /// clears them for local file systems).
  static func modeAfterUnprivilegedWrite(_ mode: UInt32) -> UInt32 {
    var m = mode & ~UInt32(S_ISUID)
    if m & UInt32(S_IXGRP) != 0 { m &= ~UInt32(S_ISGID) }
    return m
  }

  /// After a `chmod` gave a file set-user-ID or set-group-ID bits: the next write through each
  /// descriptor an unprivileged caller had opened it with for writing clears them, as on a
  /// local file system.
  func armPrivilegeClearing(_ id: NodeID) {
    let key = ContentKey(id, .data)
    let open = lock.withLock { handles.values.filter { $0.key == key && $0.unprivilegedWriter } }
    for oh in open { oh.content.lock.withLock { oh.clearsPrivileges = true } }
  }

  /// Clears a file node's set-user-ID and set-group-ID bits as an unprivileged write does
  /// (see ``modeAfterUnprivilegedWrite(_:)``), and tells the kernel.
  func clearPrivilegeBits(_ id: NodeID) throws {
    let changed = try write(commit: .soon) { tx -> Bool in
      guard var n = try tx.node(id: id), n.kind == .file else { return false }
      let m = Self.modeAfterUnprivilegedWrite(n.mode)
      guard m != n.mode else { return false }
      n.mode = m
      try tx.updateNode(n)
      return true
    }
    // Delivered before the caller replies, not queued: the kernel answers `stat` for the mode
    // from its cache (a write invalidates only sizes and times), so a queued notice could
    // arrive after the writer's next `stat` and show the bits still set. An attribute-only
    // invalidation takes no lock the kernel holds during the request.
    if changed { notifier?.invalidateAttributes(inode(of: id, .node)) }
  }

  // MARK: Notifications

  /// Queues a kernel notification. `beforeNextRequest`: one that narrows access (the kernel must
  /// forget what it would otherwise use without asking), which the adapter waits for through
  /// ``settleNotifications()`` once it has replied.
  func post(
    beforeNextRequest: Bool = false, _ body: @escaping @Sendable (any KernelNotifier) -> Void
  ) {
    guard let n = notifier else { return }
    guard beforeNextRequest else {
      notifyQueue.async { body(n) }
      return
    }
    lock.withLock { urgentNotifications += 1 }
    notifyQueue.async { [self] in
      body(n)
      lock.withLock { urgentNotifications -= 1 }
    }
  }

  /// Waits until the access-narrowing notifications posted so far are delivered (none: returns
  /// at once). Called by the adapter after its reply, before its thread takes another request:
  /// until it has the reply, the kernel may hold a lock they need (a `chmod` holds the
  /// directory whose child entries it makes the kernel forget).
  public func settleNotifications() {
    guard lock.withLock({ urgentNotifications }) > 0 else { return }
    notifyQueue.sync {}
  }

  /// Waits until every kernel notification posted so far is delivered, so that what the kernel
  /// shows next reflects every change applied before the call (`zdc sync` answers after it).
  public func deliverPostedNotifications() {
    notifyQueue.sync {}
  }
}

/// Identifies the content an open file works on.
struct ContentKey: Hashable {
  var nodeID: NodeID
  var section: FileSystem.Section
  init(_ nodeID: NodeID, _ section: FileSystem.Section) {
    self.nodeID = nodeID
    self.section = section == .node ? .data : section
  }
}

/// A child's place: its parent and exact (stored) name.
struct ChildName: Hashable, Sendable {
  var parent: NodeID
  var name: String
}
