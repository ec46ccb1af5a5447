import Foundation
import Synchronization
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCDisk
import ZDCSync

#if canImport(Glibc)
  import Glibc
#endif

/// One open file description.
final class OpenHandle: @unchecked Sendable {
  // @unchecked: immutable after creation, but for `clearsPrivileges`, which the content's
  // lock guards.
  let id: FileHandleID
  let key: ContentKey
  let content: NodeContent
  let writable: Bool
  let append: Bool
  /// The first write through this handle clears the file's set-user-ID and set-group-ID bits
  /// (an unprivileged caller opened it for writing while it had them, or they were set since).
  var clearsPrivileges = false
  /// A caller other than the superuser opened this file (not a section) for writing: its writes
  /// clear set-user-ID and set-group-ID bits, also those a `chmod` sets after the open.
  var unprivilegedWriter = false
  /// Closed by its process as far as the engine can tell: a `flush` (every `close(2)` of a
  /// writable descriptor sends one, and waits for it) and no write since. The kernel sends
  /// `release` only afterwards and asynchronously, so a handle may still exist when its process
  /// has gone on to a `rename`.
  let flushed = Atomic<Bool>(false)

  init(id: FileHandleID, key: ContentKey, content: NodeContent, writable: Bool, append: Bool) {
    self.id = id
    self.key = key
    self.content = content
    self.writable = writable
    self.append = append
  }
}

/// Where reads of a node's data come from while no write is in progress.
enum ReadSource {
  case empty
  case staged(StagingFile)
  case cached(CachedFileHandle)
  /// A big file read through ranged downloads into a partial cache entry.
  case ranged(RangedSource)

  var size: UInt64 {
    switch self {
    case .empty: return 0
    case .staged(let f): return f.size
    case .cached(let h): return h.size
    case .ranged(let r): return r.size
    }
  }

  /// Which version of the content this is: the same value means the same bytes.
  var version: ContentVersion {
    switch self {
    case .empty: return .empty
    case .staged(let f): return .staged(f.version)
    case .cached(let h): return .cloud(h.eTag)
    case .ranged(let r): return r.version
    }
  }

  // `mutating` for callers that hold the source in a variable (no source changes itself).
  mutating func read(into buf: UnsafeMutableRawBufferPointer, at offset: UInt64, fs: FileSystem)
    throws -> Int
  {
    switch self {
    case .empty: return 0
    case .staged(let f): return try f.read(into: buf, at: offset)
    case .cached(let h): return try h.read(into: buf, at: offset)
    case .ranged(let r): return try r.read(into: buf, at: offset, fs: fs)
    }
  }

  func close() {
    switch self {
    case .empty: break
    case .staged(let f): f.close()
    case .cached(let h): h.close()
    case .ranged(let r): r.close()
    }
  }

  /// The decrypted chunk holding `offset` that the last read left at hand, copied into `out`.
  func bufferedChunk(containing offset: UInt64, into out: UnsafeMutableRawBufferPointer)
    -> (start: UInt64, count: Int)?
  {
    switch self {
    case .staged(let f): return f.bufferedChunk(containing: offset, into: out)
    case .cached(let h): return h.bufferedChunk(containing: offset, into: out)
    case .ranged(let r): return r.bufferedChunk(containing: offset, into: out)
    case .empty: return nil
    }
  }
}

/// Decrypted bytes around a small read that the kernel's page cache may take, so that reads
/// of the chunk's other pages need no request (see ``FileSystem/chunkForPageCache(_:at:count:into:)``).
public struct PageCacheChunk: Sendable, Hashable {
  /// Where the bytes start in the file.
  public var offset: UInt64
  /// How many bytes (the chunk's length).
  public var count: Int
  let version: ContentVersion
}

/// What a read does once it has looked at the content under its lock.
enum ReadStep {
  /// Finished: this many bytes.
  case done(Int)
  /// To read from this source without the lock (the read gate is held).
  case concurrent(ReadSource)
}

/// Identity of the bytes a read source serves (for the kernel's page cache across opens).
enum ContentVersion: Hashable, Sendable {
  case empty
  /// A committed staged version of the node.
  case staged(Int64)
  /// A DATA version in the store (its eTag), cached.
  case cloud(String)
  /// Not known yet (a ranged source before its first download).
  case unknown
}

/// The shared state of one node's content (data section, or a small section) while open.
final class NodeContent: @unchecked Sendable {
  // @unchecked: `openCount` and `writableCount` are guarded by the engine's table lock, every
  // other mutable field by `lock`. Lock order: the table lock may be taken while holding
  // `lock`, never the reverse; `readGate` is taken while holding `lock`.
  let key: ContentKey
  let lock = NSLock()
  /// Held shared by reads that run without `lock` (see `FileSystem.read`), exclusively (under
  /// `lock`) to close the reader they use.
  private let readGate: UnsafeMutablePointer<pthread_rwlock_t>
  var openCount = 0
  var writableCount = 0
  /// The uncommitted staging version writes go to (data section).
  var writer: StagingFile? {
    get { infoLock.withLock { _writer } }
    set { infoLock.withLock { _writer = newValue } }
  }
  /// True when `writer` (or `buffer`) holds changes not yet committed.
  var dirty = false
  /// The staging version the last commit sealed, closed after the request that committed it
  /// (by the release, or the next commit): closing its file was about a tenth of the time a
  /// `close(2)` of a written file took.
  var committed: StagingFile?

  /// Closes the staging version the last commit sealed. Caller holds `lock`.
  func closeCommitted() {
    committed?.close()
    committed = nil
  }
  var reader: ReadSource?
  var pendingMtime: FileTime? {
    get { infoLock.withLock { _pendingMtime } }
    set { infoLock.withLock { _pendingMtime = newValue } }
  }
  /// The bytes of a metadata or thumbnail section being edited.
  var buffer: Data? {
    get { infoLock.withLock { _buffer } }
    set { infoLock.withLock { _buffer = newValue } }
  }
  /// Guards the three fields above (they change under `lock`, but `getattr` reads them with
  /// `infoLock` alone: a commit holds `lock` while it writes the catalog, and `getattr` runs
  /// inside a catalog read, so waiting for `lock` there would invert the lock order).
  private let infoLock = NSLock()
  private var _writer: StagingFile?
  private var _pendingMtime: FileTime?
  private var _buffer: Data?

  /// What `getattr` shows of uncommitted changes: the open writer's size and pending mtime
  /// (data section), or the edited bytes' count (small sections). Never takes `lock`.
  func uncommitted() -> (size: UInt64, mtime: FileTime?)? {
    let (w, m, b) = infoLock.withLock { (_writer, _pendingMtime, _buffer) }
    if let w { return (w.size, m) }
    if let b { return (UInt64(b.count), nil) }
    return nil
  }
  /// A node created empty by this open and not committed since: its first staging version
  /// starts empty, without looking for staged or cached content.
  var isNew = false

  init(key: ContentKey) {
    self.key = key
    readGate = .allocate(capacity: 1)
    pthread_rwlock_init(readGate, nil)
  }

  deinit {
    pthread_rwlock_destroy(readGate)
    readGate.deallocate()
  }

  /// Closes the reader once no read uses it. Caller holds `lock`.
  func resetReader() {
    guard let r = reader else { return }
    pthread_rwlock_wrlock(readGate)
    reader = nil
    pthread_rwlock_unlock(readGate)
    r.close()
  }

  /// Holds the read gate shared: the reader stays open until `endRead`. Caller holds `lock`.
  func beginRead() { pthread_rwlock_rdlock(readGate) }

  func endRead() { pthread_rwlock_unlock(readGate) }
}

extension FileSystem {
  func isOpen(_ key: ContentKey) -> Bool { lock.withLock { contents[key] != nil } }

  /// Whether a node's data is open through a handle its process has not closed (see
  /// `OpenHandle.flushed`); with `writable`, only handles open for writing count. Read-only
  /// handles are never flushed (their `close(2)` sends no `flush`), so they count until
  /// released.
  func isOpen(_ id: NodeID, writable: Bool) -> Bool {
    let key = ContentKey(id, .data)
    return lock.withLock {
      guard let c = contents[key], !writable || c.writableCount > 0 else { return false }
      return handles.values.contains {
        $0.key == key && (!writable || $0.writable) && !$0.flushed.load(ordering: .relaxed)
      }
    }
  }

  /// A read source for a node's data: staged content, else the cache, else a download.
  ///
  /// `snapshot` may be older than the disk state: an upload that finished since then moved the
  /// staged content to the cache under an eTag the snapshot does not know. The catalog records
  /// that eTag before the move, so whenever the staged lookup misses and the snapshot does not
  /// name cached content, the node is read again after the lookup.
  func openReadSource(_ snapshot: Node) throws -> ReadSource {
    let id = snapshot.id
    do {
      if let staged = try disk.openStaged(forNode: id) { return .staged(staged) }
    } catch { throw Self.map(error) }
    if let eTag = snapshot.eTagData, let h = cachedSource(snapshot, eTag) { return h }
    let node = try read { tx in try existingNode(id, tx) }
    guard let eTag = node.eTagData else {
      // No staged content and no version named: a node kept and uploaded again after another
      // device deleted it has the version it had here in the cache. Otherwise only an empty
      // file may be served as empty; anything else is an inconsistency to report, never
      // content to hide.
      if node.dataSize > 0 {
        if let h = disk.newestCompleteCachedFile(cloudID: node.cloudID) { return .cached(h) }
        throw FileSystemError.io("content of a non-empty file is missing")
      }
      return .empty
    }
    if let h = cachedSource(node, eTag) { return h }
    guard let downloads else { throw FileSystemError.unavailable }
    if node.dataSize >= options.rangedReadThreshold {
      return .ranged(RangedSource(nodeID: node.id, size: node.dataSize, handle: nil))
    }
    do {
      return .cached(try downloadingNode(node.id) { try downloads.downloadData(nodeID: node.id) })
    } catch {
      throw FileSystemError.io("download failed")
    }
  }

  /// Cached content of a node's DATA version `eTag` that can serve reads, or `nil`.
  private func cachedSource(_ node: Node, _ eTag: String) -> ReadSource? {
    guard let h = disk.cachedFile(cloudID: node.cloudID, eTag: eTag) else { return nil }
    if h.isComplete { return .cached(h) }
    if node.dataSize >= options.rangedReadThreshold {
      return .ranged(RangedSource(nodeID: node.id, size: node.dataSize, handle: h))
    }
    h.close()
    return nil
  }

  /// The writable staging version of a node (created from its current content).
  func ensureWriterLocked(_ c: NodeContent, truncate: Bool) throws -> StagingFile {
    if let w = c.writer {
      if truncate { try w.truncate(to: 0) }
      return w
    }
    let id = c.key.nodeID
    var base: StagingBase?
    defer { base?.close() }
    if !truncate && !c.isNew {
      // The staged lookup first, then the catalog (see `openReadSource`).
      do {
        if let staged = try disk.openStaged(forNode: id) { base = .staged(staged) }
      } catch { throw Self.map(error) }
      if base == nil {
        let node = try read { tx in try existingNode(id, tx) }
        if let eTag = node.eTagData {
          if let h = disk.cachedFile(cloudID: node.cloudID, eTag: eTag), h.isComplete {
            base = .cached(h)
          } else if let downloads {
            do {
              base = .cached(
                try downloadingNode(id) { try downloads.downloadData(nodeID: id) })
            } catch {
              throw FileSystemError.io("download failed")
            }
          } else {
            throw FileSystemError.unavailable
          }
        } else if node.dataSize > 0 {
          // See `openReadSource`.
          guard let h = disk.newestCompleteCachedFile(cloudID: node.cloudID) else {
            throw FileSystemError.io("content of a non-empty file is missing")
          }
          base = .cached(h)
        }
      }
    }
    // This content's own handles on the committed version go before the new version is made:
    // with no handle on it but `base`, the new version is written in its file, in place (see
    // `DiskManager.stagingFile`). After `base` took its handle: the version's file stays
    // open (reopening it, its header read and its key derived again, cost a fifth of a
    // database transaction's first write).
    c.closeCommitted()
    c.resetReader()
    do {
      let w = try disk.stagingFile(forNode: id, truncate: truncate, base: base)
      if truncate, w.size > 0 { try w.truncate(to: 0) }
      c.writer = w
      c.resetReader()
      return w
    } catch { throw Self.map(error) }
  }

  /// Commits a content's pending writes: staging sealed, size and mtime stored, upload queued,
  /// in one catalog transaction.
  func commitLocked(_ c: NodeContent) throws {
    if c.key.section != .data {
      if let b = c.buffer, c.dirty {
        try setSection(c.key.nodeID, c.key.section, b, updateOpen: false)
        c.dirty = false
      }
      return
    }
    guard let w = c.writer, c.dirty, lock.withLock({ unlinked[c.key.nodeID] }) == nil else {
      return
    }
    let size = w.size
    let id = c.key.nodeID
    lock.withLock { commitsInFlight[id] = (w.version, false) }
    defer { lock.withLock { _ = commitsInFlight.removeValue(forKey: id) } }
    do { try disk.commitStaging(w) } catch { throw Self.map(error) }
    let mtime = c.pendingMtime
    defer {
      // Only now (the catalog shows the commit) may attribute readers stop using the writer.
      c.closeCommitted()
      c.committed = w
      c.writer = nil
      c.isNew = false
      c.dirty = false
      c.pendingMtime = nil
      c.resetReader()
    }
    // `.soon`: journaled before this returns (so it survives a crash of the daemon, the
    // promise of `close(2)`), committed with the writes around it.
    let stored = try write(commit: .soon) { tx -> Node? in
      guard try tx.node(id: id) != nil else { return nil }
      // A data conflict settled while this waited for the catalog gave the version to the
      // node's conflicted copy (with its size): the node stands for the remote version now.
      if lock.withLock({ commitsInFlight[id]?.handedOver == true }) { return nil }
      return try tx.commitData(nodeID: id, size: size, mtime: mtime)
    }
    if let stored { noteCommit(stored.id, size: size, mtime: stored.mtime) }
  }

  // MARK: Open and close

  /// Opens a file (`O_TRUNC`, `O_APPEND`, access mode honoured). Writes and truncation by a
  /// `caller` other than the superuser clear the file's set-user-ID and set-group-ID bits
  /// (see ``modeAfterUnprivilegedWrite(_:)``).
  public func open(_ ino: Inode, flags: Int32, caller: Caller = .superuser) throws -> OpenedFile {
    try open(ino, flags: flags, newNode: nil, caller: caller)
  }

  /// Opens a file; `newNode` is a file node the caller has just created (empty, nothing
  /// staged or cached: its first write starts a new staging version without looking).
  func open(_ ino: Inode, flags: Int32, newNode: Node?, caller: Caller) throws -> OpenedFile {
    let (id, section) = resolve(ino)
    let node =
      try newNode
      ?? read { tx -> Node in
        let n = try existingNode(id, tx)
        // The mount root (a trunk) has no content or sections of its own.
        if n.kind == .trunk { throw FileSystemError.notPermitted }
        if section == .node {
          if n.kind == .symlink { throw FileSystemError.invalidArgument }
          if try isDirectory(n, tx) { throw FileSystemError.isADirectory }
        }
        return n
      }
    let key = ContentKey(id, section)
    let accmode = flags & O_ACCMODE
    let writable = accmode == O_WRONLY || accmode == O_RDWR
    let unprivilegedWriter = writable && section == .node && !caller.isSuperuser
    let privileged =
      unprivilegedWriter && node.kind == .file
      && Self.modeAfterUnprivilegedWrite(node.mode) != node.mode
    if privileged, flags & O_TRUNC != 0 { try clearPrivilegeBits(id) }
    let (handle, content) = lock.withLock { () -> (FileHandleID, NodeContent) in
      let c = contents[key] ?? NodeContent(key: key)
      contents[key] = c
      c.openCount += 1
      if writable { c.writableCount += 1 }
      let h = nextHandle
      nextHandle += 1
      let oh = OpenHandle(
        id: h, key: key, content: c, writable: writable, append: flags & O_APPEND != 0)
      oh.clearsPrivileges = privileged && flags & O_TRUNC == 0
      oh.unprivilegedWriter = unprivilegedWriter
      handles[h] = oh
      return (h, c)
    }
    var served: ContentVersion?
    do {
      try content.lock.withLock {
        if key.section == .data {
          if writable, flags & O_TRUNC != 0 {
            _ = try ensureWriterLocked(content, truncate: true)
            content.dirty = true
            content.pendingMtime = FileTime(Date())
          } else if newNode != nil, content.writer == nil, content.reader == nil {
            content.reader = .empty
            content.isNew = true
          } else if content.writer == nil, content.reader == nil {
            // Lazy download happens here, so reads afterwards are local.
            content.reader = try openReadSource(node)
          }
          if !writable, content.writer == nil, !content.dirty { served = content.reader?.version }
        } else if writable, flags & O_TRUNC != 0 {
          content.buffer = Data()
          content.dirty = true
        } else if content.buffer == nil {
          content.buffer = try sectionBytes(node, key.section)
        }
      }
    } catch {
      try? release(handle)
      throw error
    }
    let keepCache = key.section == .data && keepPageCache(id, served)
    return OpenedFile(handle: handle, keepCache: keepCache)
  }

  /// Whether the kernel may keep the pages it cached for a node's data from earlier opens:
  /// only when they hold `served`, the version this read-only open reads. Records `served`
  /// as what the kernel may now cache; a writable open (`served` nil) forgets the record, so
  /// that the next open starts afresh (writes go through the kernel's cache, but a commit, a
  /// conflict or a pull may give the node other bytes).
  func keepPageCache(_ id: NodeID, _ served: ContentVersion?) -> Bool {
    lock.withLock {
      guard let served, served != .unknown else {
        pageCacheVersions[id] = nil
        return false
      }
      if pageCacheVersions[id] == served { return true }
      if pageCacheVersions.count >= Self.pageCacheRecords { pageCacheVersions.removeAll() }
      pageCacheVersions[id] = served
      return false
    }
  }

  /// How many nodes' page-cache versions are remembered (all are forgotten beyond).
  static let pageCacheRecords = 1 << 16

  func handle(_ h: FileHandleID) throws -> OpenHandle {
    guard let oh = lock.withLock({ handles[h] }) else { throw FileSystemError.badHandle }
    return oh
  }

  /// Reads up to `buffer.count` bytes at `offset`; returns the count read (0 at the end).
  public func read(_ h: FileHandleID, offset: UInt64, into buffer: UnsafeMutableRawBufferPointer)
    throws -> Int
  {
    let oh = try handle(h)
    let c = oh.content
    let step = try c.lock.withLock { () -> ReadStep in
      if c.key.section != .data {
        let b = c.buffer ?? Data()
        guard offset < UInt64(b.count) else { return .done(0) }
        let n = min(buffer.count, b.count - Int(offset))
        b.withUnsafeBytes { src in
          buffer.copyMemory(
            from: UnsafeRawBufferPointer(rebasing: src[Int(offset)..<(Int(offset) + n)]))
        }
        return .done(n)
      }
      do {
        if let w = c.writer { return .done(try w.read(into: buffer, at: offset)) }
        if c.reader == nil {
          let node = try read { tx in try existingNode(c.key.nodeID, tx) }
          c.reader = try openReadSource(node)
        }
        // Every source is one version that never changes while open (a sealed staged version,
        // cached content, ranged downloads of one DATA version): decrypt without the lock, so
        // that the kernel's parallel reads (read-ahead) of one file use every core. The gate
        // keeps the reader open meanwhile.
        c.beginRead()
        return .concurrent(c.reader!)
      } catch { throw Self.map(error) }
    }
    switch step {
    case .done(let n): return n
    case .concurrent(var source):
      defer { c.endRead() }
      do { return try source.read(into: buffer, at: offset, fs: self) } catch {
        throw Self.map(error)
      }
    }
  }

  /// The most plaintext bytes a chunk of local content holds (files keep the chunk size they
  /// were made with): a read smaller than its file's chunk decrypts a whole chunk for a part
  /// of it.
  public static let contentChunkSize = CryptoFile.maxChunkSize

  /// After a read of `count` bytes at `offset` smaller than its chunk: the whole decrypted chunk
  /// around it, copied into `buffer` (``contentChunkSize`` bytes), for the kernel's page cache;
  /// `nil` unless the content cannot change while the kernel holds it (no writable handle, no
  /// pending write, a sealed or cached source).
  ///
  /// The caller must serialise storing the chunk with writable opens and size changes, and
  /// check ``pageCacheChunkIsCurrent(_:_:)`` just before: a store that landed after a write
  /// would put old bytes over the kernel's newer ones.
  public func chunkForPageCache(
    _ h: FileHandleID, at offset: UInt64, count: Int, into buffer: UnsafeMutableRawBufferPointer
  ) -> PageCacheChunk? {
    guard count > 0, count < Self.contentChunkSize, let oh = try? handle(h),
      oh.key.section == .data
    else { return nil }
    let c = oh.content
    return c.lock.withLock { () -> PageCacheChunk? in
      guard c.writer == nil, !c.dirty, lock.withLock({ c.writableCount == 0 }),
        let r = c.reader,
        let (start, n) = r.bufferedChunk(containing: offset, into: buffer)
      else { return nil }
      // Nothing to add when the read covered the whole chunk.
      guard start < offset || offset + UInt64(count) < start + UInt64(n) else { return nil }
      return PageCacheChunk(offset: start, count: n, version: r.version)
    }
  }

  /// True while `chunk` still holds the bytes the handle's file reads, and no writable handle
  /// is open on it.
  public func pageCacheChunkIsCurrent(_ h: FileHandleID, _ chunk: PageCacheChunk) -> Bool {
    guard let oh = try? handle(h) else { return false }
    let c = oh.content
    return c.lock.withLock {
      c.writer == nil && !c.dirty && lock.withLock({ c.writableCount == 0 })
        && c.reader?.version == chunk.version
    }
  }

  /// Writes bytes at `offset` (or at the end with `O_APPEND`); a gap reads as zeros.
  /// `fromPageCache`: the kernel writes back pages a shared `mmap` changed, which clears no
  /// set-user-ID or set-group-ID bit (as on a local file system: only `write(2)` and truncation
  /// do).
  public func write(
    _ h: FileHandleID, offset: UInt64, bytes: UnsafeRawBufferPointer, fromPageCache: Bool = false
  ) throws -> Int {
    let oh = try handle(h)
    guard oh.writable else { throw FileSystemError.badHandle }
    let c = oh.content
    try c.lock.withLock {
      if c.key.section != .data {
        var b = c.buffer ?? Data()
        let at = oh.append ? b.count : Int(offset)
        if at > b.count { b.append(Data(count: at - b.count)) }
        let end = at + bytes.count
        if end > b.count { b.append(Data(count: end - b.count)) }
        b.replaceSubrange(at..<end, with: bytes)
        c.buffer = b
        c.dirty = true
        return
      }
      if !fromPageCache { try clearArmedPrivilegesLocked(oh) }
      do {
        let w = try ensureWriterLocked(c, truncate: false)
        try w.write(bytes, at: oh.append ? w.size : offset)
      } catch { throw Self.map(error) }
      changedLocked(c)
    }
    if oh.flushed.load(ordering: .relaxed) { oh.flushed.store(false, ordering: .relaxed) }
    return bytes.count
  }

  /// The staged data of `c` changed (caller holds `c.lock`): it commits at the next close, with
  /// the time of this change as its mtime.
  private func changedLocked(_ c: NodeContent) {
    c.dirty = true
    c.pendingMtime = FileTime(Date())
  }

  /// Clears the file's set-user-ID and set-group-ID bits if a change through `oh` is to clear
  /// them (see `OpenHandle.clearsPrivileges`; caller holds the content's lock).
  private func clearArmedPrivilegesLocked(_ oh: OpenHandle) throws {
    guard oh.clearsPrivileges else { return }
    try clearPrivilegeBits(oh.content.key.nodeID)
    oh.clearsPrivileges = false
  }

  /// What `fallocate(2)` is asked to do (its `mode` flags).
  public struct AllocationMode: OptionSet, Sendable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    /// `FALLOC_FL_KEEP_SIZE`: the file's size stays.
    public static let keepSize = AllocationMode(rawValue: 0x01)
    /// `FALLOC_FL_PUNCH_HOLE` (always with `keepSize`): the range reads as zeros.
    public static let punchHole = AllocationMode(rawValue: 0x02)
    /// `FALLOC_FL_ZERO_RANGE`: the range reads as zeros (and extends the file unless
    /// `keepSize`).
    public static let zeroRange = AllocationMode(rawValue: 0x10)
  }

  /// `fallocate(2)` through a descriptor open for writing. Mode 0 extends the file to
  /// `offset + length` when it is shorter (the bytes read as zeros; no local space is set
  /// aside: the staged file stays sparse, as the store's copy is not preallocated either);
  /// `keepSize` alone changes nothing; `punchHole` and `zeroRange` make the range read as zeros
  /// (`zeroRange` without `keepSize` also extends the file). Other modes are not supported.
  /// Like `write(2)`, a change commits at `close`/`fsync` and clears the set-user-ID and
  /// set-group-ID bits when the caller is not the superuser.
  public func fallocate(
    _ h: FileHandleID, mode: AllocationMode, offset: UInt64, length: UInt64
  ) throws {
    let known: AllocationMode = [.keepSize, .punchHole, .zeroRange]
    guard mode.isSubset(of: known), !mode.contains([.punchHole, .zeroRange]),
      !mode.contains(.punchHole) || mode.contains(.keepSize)
    else { throw FileSystemError.notSupported }
    let (end, overflow) = offset.addingReportingOverflow(length)
    guard length > 0, !overflow, end <= UInt64(Int64.max) else {
      throw FileSystemError.invalidArgument
    }
    let oh = try handle(h)
    guard oh.writable else { throw FileSystemError.badHandle }
    let c = oh.content
    guard c.key.section == .data else { throw FileSystemError.notSupported }
    if mode == .keepSize { return }
    let zeroes = mode.contains(.punchHole) || mode.contains(.zeroRange)
    try c.lock.withLock {
      do {
        let w = try ensureWriterLocked(c, truncate: false)
        let size = w.size
        let grows = !mode.contains(.keepSize) && end > size
        guard grows || (zeroes && offset < size) else { return }
        try clearArmedPrivilegesLocked(oh)
        if zeroes && offset < size {
          // Zeros written through the staged file like any write (its chunks sealed again),
          // at most 1 MiB per call.
          let zeroEnd = min(end, size)
          let piece = Int(min(zeroEnd - offset, 1 << 20))
          let buf = UnsafeMutableRawBufferPointer.allocate(byteCount: piece, alignment: 16)
          defer { buf.deallocate() }
          buf.initializeMemory(as: UInt8.self, repeating: 0)
          var at = offset
          while at < zeroEnd {
            let n = Int(min(zeroEnd - at, UInt64(piece)))
            try w.write(UnsafeRawBufferPointer(rebasing: buf[0..<n]), at: at)
            at += UInt64(n)
          }
        }
        if grows { try w.truncate(to: end) }
      } catch { throw Self.map(error) }
      changedLocked(c)
    }
    if oh.flushed.load(ordering: .relaxed) { oh.flushed.store(false, ordering: .relaxed) }
  }

  /// `close(2)` of a descriptor: commits the file's pending writes, so that a close that
  /// returned means the content survives a crash of the daemon (the kernel sends `release`
  /// only later, after `close(2)` has returned).
  public func flush(_ h: FileHandleID) throws {
    let oh = try handle(h)
    oh.flushed.store(true, ordering: .relaxed)
    guard oh.writable else { return }
    // The file's creation and attribute changes are in the catalog's journal already.
    try oh.content.lock.withLock { try commitLocked(oh.content) }
  }

  /// `fsync(2)`: commits the file's pending writes and makes them durable against power loss
  /// (its staged content, the disk index and the catalog flushed to stable storage).
  public func fsync(_ h: FileHandleID) throws {
    let oh = try handle(h)
    try oh.content.lock.withLock { try commitLocked(oh.content) }
    do {
      // One batch of flushes: the staged content, the disk index and the catalog (each
      // only when something of it is not on stable storage yet).
      try disk.makeDurable(nodeID: oh.content.key.nodeID, with: try catalog.prepareDurable())
    } catch { throw Self.map(error) }
  }

  /// `fsync(2)` of a directory: makes every committed change durable against power loss.
  public func fsyncDirectory() throws {
    do { try catalog.makeDurable() } catch { throw Self.map(error) }
  }

  /// Closes a handle; the last writable handle of a file commits its writes.
  public func release(_ h: FileHandleID) throws {
    guard let oh = lock.withLock({ handles.removeValue(forKey: h) }) else {
      throw FileSystemError.badHandle
    }
    let c = oh.content
    var failure: (any Error)?
    if oh.writable, lock.withLock({ c.writableCount == 1 }) {
      do { try c.lock.withLock { try commitLocked(c) } } catch {
        log.error("commit at close failed; the written content may be lost: \(error)")
        failure = error
      }
    }
    let (last, gone) = lock.withLock { () -> (Bool, Node?) in
      c.openCount -= 1
      if oh.writable { c.writableCount -= 1 }
      guard c.openCount == 0 else { return (false, nil) }
      if contents[oh.key] === c { contents[oh.key] = nil }
      let gone = oh.key.section == .data ? unlinked.removeValue(forKey: oh.key.nodeID) : nil
      return (true, gone)
    }
    if last {
      c.lock.withLock {
        if let w = c.writer {
          if gone != nil || !c.dirty { disk.discardStaging(w) } else { w.close() }
        }
        c.writer = nil
        c.closeCommitted()
        c.resetReader()
        c.buffer = nil
      }
      if let gone { disk.remove(nodeID: gone.id) }
    }
    if let failure { throw failure }
  }

  /// Truncates or extends a node's data (committed at once unless the file is open for writing).
  func truncate(_ id: NodeID, to size: UInt64) throws {
    let key = ContentKey(id, .data)
    let (c, temporary) = lock.withLock { () -> (NodeContent, Bool) in
      if let c = contents[key] { return (c, false) }
      let c = NodeContent(key: key)
      contents[key] = c
      return (c, true)
    }
    defer {
      if temporary {
        lock.withLock { contents[key] = nil }
        c.lock.withLock {
          if let w = c.writer { disk.discardStaging(w) }
          c.writer = nil
          c.closeCommitted()
          c.resetReader()
        }
      }
    }
    try c.lock.withLock {
      do {
        let w = try ensureWriterLocked(c, truncate: size == 0)
        if w.size != size { try w.truncate(to: size) }
      } catch { throw Self.map(error) }
      changedLocked(c)
      if lock.withLock({ c.writableCount == 0 }) { try commitLocked(c) }
    }
  }

  // MARK: Metadata and thumbnail sections

  /// Stages a node's current content (downloading it if needed) when nothing is staged, so
  /// that an upload caused by a section change carries the data too, not an empty section.
  func stageCurrentContent(_ id: NodeID) throws {
    let node = try read { tx in try existingNode(id, tx) }
    guard node.eTagData != nil, node.dataSize > 0, !disk.hasStagedData(forNode: id) else {
      return
    }
    if let open = lock.withLock({ contents[ContentKey(id, .data)] }),
      open.lock.withLock({ open.writer != nil })
    {
      return  // its commit will queue the upload with everything
    }
    let c = NodeContent(key: ContentKey(id, .data))
    try c.lock.withLock {
      let w = try ensureWriterLocked(c, truncate: false)
      defer { w.close() }
      do { try disk.commitStaging(w) } catch { throw Self.map(error) }
    }
  }

  /// Stores a section locally and queues the node's DATA upload (sections travel with it).
  func setSection(_ id: NodeID, _ section: Section, _ value: Data, updateOpen: Bool = true) throws {
    try stageCurrentContent(id)
    try write { tx in
      guard try tx.node(id: id) != nil else { throw FileSystemError.notFound }
      try tx.setTag(.data(value), forNodeID: id, identifier: section.tag)
      try tx.queueDataUpload(nodeID: id)
    }
    if updateOpen, let c = lock.withLock({ contents[ContentKey(id, section)] }) {
      c.lock.withLock { if !c.dirty { c.buffer = value } }
    }
  }

  func mutateSection(_ id: NodeID, _ section: Section, _ body: (inout Data) -> Void) throws {
    let node = try read { tx in try existingNode(id, tx) }
    var bytes = try sectionBytes(node, section)
    body(&bytes)
    try setSection(id, section, bytes)
  }
}
