import CLinux
public import Foundation
import Glibc
import Logging
import Synchronization
public import ZDCCore
public import ZDCCrypto
public import ZDCSQLite

/// The encrypted local disk cache and write-back staging area of one state directory.
///
/// Two pools, every file a CryptoFile under one local cache key, named randomly:
/// - *staging* (`staging/`): content written locally, one version per commit, pinned until the
///   push side reports it uploaded; then it becomes the clean cached copy;
/// - *cache* (`cache/`): downloaded content per (cloudID, DATA eTag), complete or partial
///   (in 64 KiB chunks, see ``CacheChunks``), evicted least recently used first when over the
///   size cap.
///
/// The index (`disk.sqlite`) survives restarts and is reconciled with the directories when
/// opened. Dirty and open entries are never evicted. All methods are thread-safe and may block
/// on disk I/O; reads through open handles do not touch the index database.
public final class DiskManager: @unchecked Sendable {
  // @unchecked: mutable state is guarded by `stateLock` (the in-memory index, pins, access
  // times) and `mutationLock` (index database writes and structure changes, held first).

  /// The state directory.
  public let directory: URL
  /// Where cached content lives.
  public let cacheDirectory: URL
  /// Where staged content lives.
  public let stagingDirectory: URL
  private let cachePath: String
  private let stagingPath: String
  /// The local cache key every file is encrypted under.
  public let key: Data
  /// The chunk shift of the files this manager makes (files found keep theirs).
  public let chunkShift: UInt8

  let index: DiskIndex
  let logger = Logger(label: "zdc.disk")
  private let automaticEviction: Bool
  private let background = DispatchQueue(label: "zdc.disk.maintenance", qos: .utility)

  private let stateLock = NSLock()
  private let mutationLock = NSLock()
  private var byID: [Int64: Entry] = [:]
  private var cacheEntries: [CacheKey: Entry] = [:]
  /// The entries of `cacheEntries` by cloudID (an upload or a remote change finds a cloudID's
  /// entries without a scan of every entry).
  private var cacheByCloudID: [String: [Entry]] = [:]
  private var stagingEntries: [NodeID: [Entry]] = [:]
  /// Cache entries by node (a node deleted here drops them without a scan of every entry).
  private var cacheByNode: [NodeID: [Entry]] = [:]
  private var totals = DiskUsage()
  private var lastTick: Int64 = 0
  /// Ids of staging entries not yet in the index (negative, never reused).
  private var provisionalIDs: Int64 = 0
  private var accessed: Set<Int64> = []
  private var flushScheduled = false
  private var deleteFlushScheduled = false
  /// Files of removed entries waiting for the maintenance queue (see ``remove(nodeID:)``).
  private var pendingUnlinks: [String] = []
  private var unlinksScheduled = false
  /// The longest the index keeps rows of removed entries (deleted in batches).
  public static let deleteFlushDelay: Double = 0.05
  /// Partial entries with chunks filled since the index last recorded them.
  private var unpersisted: [Int64: Entry] = [:]
  private var persistScheduled = false
  private var evictionScheduled = false
  private var lost: [NodeID] = []
  /// Committed staging versions whose rows the index does not hold yet (the commit log records
  /// them meanwhile); inserted in batches.
  private var pendingInserts: [Entry] = []
  private var insertFlushScheduled = false
  /// When the last staging version was committed.
  private let commits = ActivityMonitor()
  /// The shortest a committed staging version waits for its index row (the commit log records
  /// the commit meanwhile).
  public let insertFlushDelay: Double
  /// While commits keep coming less than this many seconds apart (a copy of many files),
  /// their rows wait for the index — up to ``maxPendingInserts`` of them —, and go in once
  /// the commits pause: the index's work stays out of the burst.
  public let insertFlushQuiet: Double
  /// The most committed versions whose rows wait for the index (and records in the commit log,
  /// about 45 bytes each). Inserting a batch holds back every staging commit meanwhile (2,048
  /// rows took about 9 ms): a copy of several thousand small files now inserts its rows once
  /// it pauses instead of during the copy.
  public static let maxPendingInserts = 16_384
  /// The commits of staging versions whose rows the index does not hold yet, one record
  /// appended per commit: what start-up adopts after a crash. Emptied once the index holds
  /// them.
  private let commitLog: StagingCommitLog
  /// Empty staging files made ahead of need on the maintenance queue: creating a file costs
  /// more than the rest of a small file's write path (the directory's inode allocation), so
  /// `stagingFile` takes one made earlier. A crash leaves them as uncommitted files, which
  /// start-up deletes.
  private let spares: SpareStagingFiles
  /// Which staging files have their directory entries on stable storage.
  private let stagingDirectoryFlush = DirectoryFlush()
  /// The staging directory's device (for `LocalDurability.sync`'s `beforeDevice`).
  private let stagingDevice: UInt64?
  /// Whether a new file's `fsync` makes its entry in the staging directory durable
  /// (`makeDurable`).
  private let stagingFlushesNewEntries: Bool
  /// Whether a version written in place of a committed one copies it as needed
  /// (`writeInPlaceLazily`): where the file system reports holes exactly.
  private let lazyCopies: Bool

  struct CacheKey: Hashable {
    var cloudID: String
    var eTag: String
  }

  /// Seconds between batched writes of access times to the index.
  public static let accessFlushInterval: TimeInterval = 2

  /// Opens (creating if needed) the cache and staging of `directory` under `key` (32 bytes),
  /// reconciling the index with the files found. `capBytes` defaults to
  /// ``defaultCap(for:holding:)`` of what the directory holds; with `automaticEviction` off,
  /// only ``evictIfNeeded()`` evicts. New files have chunks of `1 << chunkShift` bytes (one of
  /// ``CryptoFile/chunkShifts``).
  public init(
    directory: URL, key: Data, capBytes: UInt64? = nil, automaticEviction: Bool = true,
    insertFlushDelay: Double = 0.05, insertFlushQuiet: Double = 1,
    chunkShift: UInt8 = CryptoFile.defaultChunkShift
  ) throws {
    guard key.count == 32 else { throw DiskError.invalidKey }
    guard CryptoFile.chunkShifts.contains(chunkShift) else {
      throw DiskError.io("unsupported chunk shift \(chunkShift)")
    }
    self.chunkShift = chunkShift
    self.directory = directory
    self.insertFlushDelay = insertFlushDelay
    self.insertFlushQuiet = insertFlushQuiet
    self.key = key
    self.automaticEviction = automaticEviction
    cacheDirectory = directory.appendingPathComponent("cache", isDirectory: true)
    stagingDirectory = directory.appendingPathComponent("staging", isDirectory: true)
    cachePath = Self.withoutTrailingSlash(cacheDirectory.path)
    stagingPath = Self.withoutTrailingSlash(stagingDirectory.path)
    for d in [directory, cacheDirectory, stagingDirectory] {
      try FileManager.default.createDirectory(
        at: d, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }
    stagingDevice = LocalDurability.device(ofPath: stagingPath)
    lazyCopies = CopyBeforeWrite.supports(path: stagingPath)
    stagingFlushesNewEntries = LocalDurability.flushesDevice(ofPath: stagingPath)
    do {
      index = try DiskIndex(path: directory.appendingPathComponent("disk.sqlite").path)
    } catch {
      throw DiskError.from(error, "cannot open the disk index")
    }
    totals.capBytes = capBytes ?? .max
    commitLog = try StagingCommitLog(path: directory.appendingPathComponent("staging.log").path)
    spares = SpareStagingFiles(
      directory: stagingPath, key: key, chunkShift: chunkShift, queue: background,
      directoryFlush: stagingDirectoryFlush)
    try reconcile()
    if capBytes == nil {
      let held = stateLock.withLock { totals.bytes }
      self.capBytes = Self.defaultCap(for: directory, holding: held)
    }
  }

  deinit {
    flush()
    spares.discard()
  }

  /// Deletes the spare staging files made ahead of need (a process that exits without releasing
  /// the manager calls this at its end; new ones are made when needed again).
  public func discardSpares() {
    spares.discard(closing: false)
  }

  /// Half the space available to the cache on the filesystem holding `directory` — its free
  /// space plus the `holding` bytes the cache and staging already take there — and at least
  /// 256 MiB.
  ///
  /// Counting what the cache holds keeps the cap from shrinking at each mount as the cache
  /// fills the disk; half (not less) keeps a file just written, or just read, cached when the
  /// disk has room for it: evicting it would only make the next read download it again.
  public static func defaultCap(for directory: URL, holding: UInt64 = 0) -> UInt64 {
    let minimum: UInt64 = 256 << 20
    var s = statvfs()
    guard statvfs(directory.path, &s) == 0 else { return minimum }
    let available = UInt64(s.f_bavail) * UInt64(s.f_frsize)
    return max((available + holding) / 2, minimum)
  }

  // MARK: Accounting

  /// The size cap eviction aims for.
  public var capBytes: UInt64 {
    get { stateLock.withLock { totals.capBytes } }
    set {
      stateLock.withLock { totals.capBytes = newValue }
      scheduleEviction()
    }
  }

  /// Bytes, entries and dirty bytes held now.
  public var usage: DiskUsage {
    stateLock.withLock {
      var u = totals
      u.pinnedEntries = byID.values.filter { $0.pins > 0 }.count
      return u
    }
  }

  /// Nodes whose committed staged content was missing when the index was opened (lost).
  public var lostStagedNodes: [NodeID] { stateLock.withLock { lost } }

  /// Bytes a CryptoFile whose chunk shift is `chunkShift` takes on disk for a complete entry,
  /// or for the present chunks of a partial one.
  static func diskBytes(size: UInt64, bitmap: ChunkBitmap?, chunkShift: UInt8) -> UInt64 {
    guard let bitmap else {
      return CryptoFile.physicalSize(plaintextSize: size, chunkShift: chunkShift)
    }
    let slots = CacheChunks.size >> UInt64(chunkShift)
    let slotSize = UInt64(CryptoFile.slotSize(chunkShift: chunkShift))
    return UInt64(CryptoFile.headerSize) + bitmap.presentCount * slots * slotSize
  }

  private func add(_ e: Entry) {
    byID[e.id] = e
    switch e.row.pool {
    case .cache:
      if let c = e.row.cloudID, let t = e.row.eTag {
        let key = CacheKey(cloudID: c, eTag: t)
        if let displaced = cacheEntries[key], displaced !== e { unindexCloudID(displaced, c) }
        cacheEntries[key] = e
        cacheByCloudID[c, default: []].append(e)
      }
      if let n = e.row.nodeID { cacheByNode[n, default: []].append(e) }
    case .staging:
      if let n = e.row.nodeID {
        // In version order, with one lookup of the node's list.
        let version = e.row.version
        stagingEntries[n, default: []].insertSorted(e) { $0.row.version <= version }
      }
    }
    count(e.row)
  }

  /// Adds a row's entry and bytes to the totals (under `stateLock`).
  private func count(_ row: IndexRow) {
    switch row.pool {
    case .cache:
      totals.cacheBytes += row.diskBytes
      totals.cacheEntries += 1
    case .staging:
      if row.dirty { totals.dirtyBytes += row.diskBytes }
    }
    totals.bytes += row.diskBytes
    totals.entries += 1
  }

  /// Takes a row's entry and bytes out of the totals (under `stateLock`).
  private func uncount(_ row: IndexRow) {
    switch row.pool {
    case .cache:
      totals.cacheBytes -= row.diskBytes
      totals.cacheEntries -= 1
    case .staging:
      if row.dirty { totals.dirtyBytes -= row.diskBytes }
    }
    totals.bytes -= row.diskBytes
    totals.entries -= 1
  }

  private func detach(_ e: Entry) {
    guard byID.removeValue(forKey: e.id) != nil else { return }
    switch e.row.pool {
    case .cache:
      if let c = e.row.cloudID, let t = e.row.eTag,
        cacheEntries[CacheKey(cloudID: c, eTag: t)] === e
      {
        cacheEntries[CacheKey(cloudID: c, eTag: t)] = nil
        unindexCloudID(e, c)
      }
      if let n = e.row.nodeID {
        cacheByNode[n]?.removeAll { $0 === e }
        if cacheByNode[n]?.isEmpty == true { cacheByNode[n] = nil }
      }
    case .staging:
      if let n = e.row.nodeID {
        stagingEntries[n]?.removeAll { $0 === e }
        if stagingEntries[n]?.isEmpty == true { stagingEntries[n] = nil }
      }
    }
    uncount(e.row)
  }

  /// Takes an entry out of `cacheByCloudID` (under `stateLock`).
  private func unindexCloudID(_ e: Entry, _ cloudID: String) {
    cacheByCloudID[cloudID]?.removeAll { $0 === e }
    if cacheByCloudID[cloudID]?.isEmpty == true { cacheByCloudID[cloudID] = nil }
  }

  /// The entries of `cacheEntries` whose cloudID is `cloudID` (under `stateLock`).
  private func cacheEntries(of cloudID: String) -> [Entry] { cacheByCloudID[cloudID] ?? [] }

  /// Replaces an attached entry's row (the maps and totals follow).
  private func replaceRow(_ e: Entry, _ row: IndexRow) {
    let old = e.row
    guard byID[old.id] === e else {
      e.row = row
      return
    }
    if old.pool == row.pool, old.nodeID == row.nodeID, old.version == row.version,
      old.cloudID == row.cloudID, old.eTag == row.eTag
    {
      // Where it was in every map but `byID` (a commit, the index's id for a committed
      // version): the totals and, with a new id, `byID` change; detaching and adding again
      // rebuilt the node's list of versions.
      if old.id != row.id {
        byID[old.id] = nil
        byID[row.id] = e
      }
      uncount(old)
      e.row = row
      count(row)
      return
    }
    detach(e)
    e.row = row
    add(e)
  }

  private func nextTick() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    let now = Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
    lastTick = max(now, lastTick + 1)
    return lastTick
  }

  /// Records an access in memory (under `stateLock`); written to the index in batches.
  private func touchLocked(_ e: Entry) {
    e.row.lastAccess = nextTick()
    guard !e.removed else { return }
    accessed.insert(e.id)
    if !flushScheduled {
      flushScheduled = true
      background.asyncAfter(deadline: .now() + Self.accessFlushInterval) { [weak self] in
        // Committed versions still waiting for the index wait on (see `insertFlushQuiet`).
        self?.flush(inserts: false)
      }
    }
  }

  /// Deletes the files of removed entries still waiting, and writes pending access times,
  /// filled chunks and committed staging versions to the index, now.
  public func flush() { flush(inserts: true) }

  private func flush(inserts: Bool) {
    unlinkPending()
    persistFills()
    mutationLock.withLock {
      if inserts || stateLock.withLock({ insertWaitLocked() }) == nil {
        do { try flushInsertsDurablyLocked() } catch {
          logger.warning("could not record committed staging versions: \(error)")
        }
      }
      let ticks = stateLock.withLock { () -> [(Int64, Int64)] in
        flushScheduled = false
        defer { accessed.removeAll() }
        return accessed.compactMap { id in
          id > 0 ? byID[id].map { (id, $0.row.lastAccess) } : nil
        }
      }
      do {
        try index.setLastAccess(ticks)
      } catch {
        logger.warning("could not store access times: \(error)")
      }
    }
  }

  // MARK: Paths and names

  func url(of e: Entry) -> URL {
    stateLock.withLock { url(pool: e.row.pool, fileName: e.row.fileName) }
  }

  private func url(pool: DiskPool, fileName: String) -> URL {
    // With the hint: without it, Foundation asks the filesystem whether it is a directory.
    (pool == .cache ? cacheDirectory : stagingDirectory)
      .appendingPathComponent(fileName, isDirectory: false)
  }

  private static func withoutTrailingSlash(_ path: String) -> String {
    path.count > 1 && path.hasSuffix("/") ? String(path.dropLast()) : path
  }

  /// The file of an entry as a path (cheaper than a URL on the open path).
  private func path(of e: Entry) -> String {
    stateLock.withLock {
      (e.row.pool == .cache ? cachePath : stagingPath) + "/" + e.row.fileName
    }
  }

  private static func randomName() -> String {
    SecureRandom.hex128()
  }

  /// The name a staging file took when its version was committed, before the commit log:
  /// `{random}.{nodeID}.{version}`. Start-up still restores the row of such a file if the index
  /// does not have it.
  static func committedName(_ name: String, nodeID: NodeID, version: Int64) -> String {
    "\(name).\(nodeID).\(version)"
  }

  /// The node and version a committed staging file's name records, or `nil`.
  static func parseCommittedName(_ name: String) -> (NodeID, Int64)? {
    let parts = name.split(separator: ".")
    guard parts.count == 3, parts[0].count == 32, let n = NodeID(parts[1]), let v = Int64(parts[2])
    else { return nil }
    return (n, v)
  }

  private func unlink(_ url: URL) { unlink(path: url.path) }

  private func unlink(path: String) {
    if Glibc.unlink(path) != 0 && errno != ENOENT {
      logger.warning("could not delete a disk cache file: errno \(errno)")
    }
  }

  // MARK: Start-up

  private func reconcile() throws {
    let rows: [IndexRow]
    do { rows = try index.allRows() } catch {
      throw DiskError.from(error, "cannot read the disk index")
    }
    var files: [DiskPool: Set<String>] = [:]
    for pool in [DiskPool.cache, .staging] {
      let dir = pool == .cache ? cacheDirectory : stagingDirectory
      let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
      files[pool] = Set(names)
    }
    var drop: [Int64] = []
    var keep: [Entry] = []
    // Committed staged versions whose files are gone: superseded (rows go in batches after
    // files), their node deleted, or lost.
    var missing: [IndexRow] = []
    for row in rows {
      let path = url(pool: row.pool, fileName: row.fileName)
      let other: DiskPool = row.pool == .cache ? .staging : .cache
      if files[row.pool]?.contains(row.fileName) != true,
        files[other]?.contains(row.fileName) == true,
        Glibc.rename(url(pool: other, fileName: row.fileName).path, path.path) == 0
      {
        // Interrupted between the index update and the rename (markUploaded).
        files[other]?.remove(row.fileName)
        files[row.pool]?.insert(row.fileName)
      }
      guard files[row.pool]?.remove(row.fileName) != nil else {
        if row.pool == .staging && row.dirty && row.committed { missing.append(row) }
        drop.append(row.id)
        continue
      }
      if row.pool == .staging && !row.committed {
        // Written but never committed (interrupted): not content anyone acknowledged.
        unlink(path)
        drop.append(row.id)
        continue
      }
      var r = row
      // Files keep the chunk size they were made with (older ones have larger chunks).
      var chunkShift = CryptoFile.defaultChunkShift
      if let layout = try? CryptoFile.layout(ofFileAt: path) {
        chunkShift = layout.chunkShift
        if r.complete { r.size = layout.plaintextSize }
      }
      let e = Entry(row: r)
      e.row.diskBytes = Self.diskBytes(size: r.size, bitmap: e.bitmap, chunkShift: chunkShift)
      lastTick = max(lastTick, r.lastAccess)
      keep.append(e)
    }
    // Staging versions committed just before a crash, before the index recorded them: named by
    // the commit log (or, from before it, by their file names).
    var committed: [String: (NodeID, Int64)] = [:]
    for name in files[.staging] ?? [] {
      if let c = Self.parseCommittedName(name) { committed[name] = c }
    }
    // A record whose version (or a later one) of the node has its row is stale: the row was
    // inserted after it, and may name another file since (the version's copy, when the next
    // version was written in place of it; its file is the next version's).
    let indexed = Self.newestCommitted(keep, [])
    // An exchange moves its version from the file it had (its record's, or an earlier
    // exchange's: a version whose next version was dropped uncommitted stays in its copy, and
    // may be exchanged again) to the copy's, that file becoming the version's origin (see
    // `writeInPlace`). A file a later record names holds that record's version (a copy goes on
    // as the next version's file when that one is written in place of it in turn).
    var named: [NodeVersion: String] = [:]
    var exchanged: [NodeVersion: (name: String, origin: String?, asNeeded: Bool)] = [:]
    var exchangedTo: [String: NodeVersion] = [:]
    for r in commitLog.records() where files[.staging]?.contains(r.name) == true {
      if let v = indexed[r.nodeID], v >= r.version { continue }
      let key = NodeVersion(nodeID: r.nodeID, version: r.version)
      if let earlier = exchangedTo.removeValue(forKey: r.name) { exchanged[earlier] = nil }
      if r.exchange {
        let origin = named[key]
        if let origin, let c = committed[origin], c == (r.nodeID, r.version) {
          committed[origin] = nil
        }
        if let replaced = exchanged[key]?.name { exchangedTo[replaced] = nil }
        exchanged[key] = (r.name, origin, r.copiedAsNeeded)
        exchangedTo[r.name] = key
      } else {
        committed[r.name] = (r.nodeID, r.version)
      }
      named[key] = r.name
    }
    // Rows for the exchanges, with their origins, before the copies are checked. An exchange
    // whose version's own record is not read (its file is gone) has a whole copy: the file a
    // copy is made from as needed is deleted only after the copy is completed (the new version
    // dropped) or with it.
    keep += try adopt(
      exchanged.map { key, x in
        (
          name: x.name, nodeID: key.nodeID, version: key.version,
          origin: x.origin.map { (name: $0, asNeeded: x.asNeeded) }
        )
      }, files: &files)
    let newest = Self.newestCommitted(keep, committed.values)
    // A version whose file went on as the next version's, written in place, is its copy; with
    // the next version never committed, that file is left over. A copy a power loss cut short
    // gives way to it (see `writeInPlace`). A version a later committed one superseded is left
    // as it is (deleted soon): its origin may be the later version's origin too, written in
    // place since, and falling back to it would leave the later version's copy unfilled.
    for e in keep where e.row.pool == .staging && e.row.committed {
      guard let origin = e.row.origin, committed[origin] == nil,
        files[.staging]?.contains(origin) == true,
        e.row.version >= newest[e.row.nodeID ?? 0] ?? .min
      else { continue }
      let copy = url(pool: .staging, fileName: e.row.fileName).path
      let original = url(pool: .staging, fileName: origin).path
      if e.row.copiedAsNeeded {
        // A crash interrupted it: the blocks not copied yet are the original's, unchanged.
        // Then checked as any copy: a block a power loss lost may read as zeros.
        do {
          let filled = try CopyBeforeWrite.fillHoles(copy: copy, from: original)
          logger.info(
            "staged content of node \(e.row.nodeID ?? 0) version \(e.row.version): copy completed (\(filled) bytes)"
          )
        } catch {
          logger.error(
            "staged content of node \(e.row.nodeID ?? 0) version \(e.row.version): cannot complete its copy: \(error)"
          )
        }
      }
      guard !Self.isIntactCopy(copy, of: original, size: e.row.size, key: key) else { continue }
      do { try index.moveFile(id: e.id, to: origin, origin: nil) } catch {
        throw DiskError.from(error, "cannot read the disk index")
      }
      logger.error(
        "staged content of node \(e.row.nodeID ?? 0) version \(e.row.version): its copy did not survive; the file it was written over in place is used"
      )
      files[.staging]?.remove(origin)
      files[.staging]?.insert(e.row.fileName)
      e.row.fileName = origin
      e.row.origin = nil
      if let layout = try? CryptoFile.layout(ofFileAt: URL(fileURLWithPath: original)) {
        e.row.size = layout.plaintextSize
      }
    }
    let adoptedRows = try adopt(
      committed.map { (name: $0.key, nodeID: $0.value.0, version: $0.value.1, origin: nil) },
      files: &files)
    keep += adoptedRows
    let adopted = adoptedRows.count
    reportLost(missing, newest: Self.newestCommitted(keep, []))
    for (pool, names) in files {
      for name in names { unlink(url(pool: pool, fileName: name)) }
    }
    // The index holds every version the log named (or its file is gone), on stable storage
    // before the log is emptied (the log's records may have been flushed by `fsync`s).
    if commitLog.count > 0 { try makeIndexDurable() }
    try commitLog.clear()
    if adopted > 0 {
      logger.info("disk index: \(adopted) staged versions committed before a crash recorded")
    }
    do { try index.delete(ids: drop) } catch { throw DiskError.from(error, "") }
    stateLock.withLock { for e in keep { add(e) } }
    if !drop.isEmpty || files.values.contains(where: { !$0.isEmpty }) {
      logger.info(
        "disk index reconciled: \(drop.count) rows dropped, \(files.values.map(\.count).reduce(0, +)) stray files deleted"
      )
    }
  }

  /// Reports the committed staged versions whose files are gone, of nodes with no later
  /// committed version kept (a version superseded just before a crash had its file deleted
  /// before its row): lost, unless the node was deleted just before the crash.
  private func reportLost(_ missing: [IndexRow], newest: [NodeID: Int64]) {
    for row in missing {
      let node = row.nodeID ?? 0
      if let v = newest[node], v > row.version { continue }
      logger.error(
        "staged content of node \(node) version \(row.version) is missing: lost, unless the node was deleted"
      )
      lost.append(node)
    }
  }

  /// The newest committed staging version of each node among `kept` and `adopted`.
  private static func newestCommitted(
    _ kept: [Entry], _ adopted: some Sequence<(NodeID, Int64)>
  ) -> [NodeID: Int64] {
    var newest: [NodeID: Int64] = [:]
    for e in kept where e.row.pool == .staging && e.row.committed {
      if let node = e.row.nodeID { newest[node] = max(newest[node] ?? .min, e.row.version) }
    }
    for (node, version) in adopted { newest[node] = max(newest[node] ?? .min, version) }
    return newest
  }

  /// A staging version, by node and version.
  private struct NodeVersion: Hashable {
    var nodeID: NodeID
    var version: Int64
  }

  /// Rows, in the index (one transaction for all of them, none when there are none), for
  /// committed staged versions found at start-up without one: each a dirty version of its
  /// node, with the file it had before when an exchange recorded one (`origin`, and whether its
  /// copy is made as needed). A file whose layout cannot be read gets none.
  private func adopt(
    _ versions: [(
      name: String, nodeID: NodeID, version: Int64, origin: (name: String, asNeeded: Bool)?
    )],
    files: inout [DiskPool: Set<String>]
  ) throws -> [Entry] {
    var rows: [IndexRow] = []
    for v in versions {
      let path = url(pool: .staging, fileName: v.name)
      guard let (chunkShift, size) = try? CryptoFile.layout(ofFileAt: path) else { continue }
      rows.append(
        IndexRow(
          id: 0, pool: .staging, nodeID: v.nodeID, version: v.version, cloudID: nil, eTag: nil,
          fileName: v.name, size: size,
          diskBytes: Self.diskBytes(size: size, bitmap: nil, chunkShift: chunkShift),
          lastAccess: 0, dirty: true, committed: true, complete: true, chunks: nil,
          origin: v.origin?.name, copiedAsNeeded: v.origin?.asNeeded ?? false))
      files[.staging]?.remove(v.name)
    }
    guard !rows.isEmpty else { return [] }
    let ids: [Int64]
    do { ids = try index.insert(rows) } catch { throw DiskError.from(error, "") }
    return zip(rows, ids).map { row, id in
      var r = row
      r.id = id
      return Entry(row: r)
    }
  }

  /// Whether `copy` holds what `original` held when it was copied, as far as a power loss
  /// can tell: a CryptoFile of `size` bytes whose last chunk authenticates, and no 4 KiB hole
  /// (a block the device never got) where `original` has bytes — `original` has been written
  /// in place since only where the next version wrote, and falling back to it gives the
  /// version some of that version's writes, which no `fsync` had acknowledged. Zeros the copy
  /// holds as data are not such a block: a chunk of zeros is a hole in a CryptoFile, which
  /// copies (`CopyBeforeWrite`, `copy_file_range(2)` on ext4) write as zeros; the next version
  /// may have written there since. (Counting them made a `kill -9` after a write into such a
  /// chunk give the version the file written in place.)
  static func isIntactCopy(_ copy: String, of original: String, size: UInt64, key: Data) -> Bool {
    guard let f = try? CryptoFile.open(path: copy, key: key) else { return false }
    let plaintext = f.size
    try? f.close()
    guard plaintext == size else { return false }
    let a = Glibc.open(copy, O_RDONLY | O_CLOEXEC)
    let b = Glibc.open(original, O_RDONLY | O_CLOEXEC)
    defer {
      if a >= 0 { Glibc.close(a) }
      if b >= 0 { Glibc.close(b) }
    }
    guard a >= 0, b >= 0 else { return a >= 0 }
    let page = 4096
    let x = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: page)
    let y = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: page)
    defer {
      x.deallocate()
      y.deallocate()
    }
    var offset: off_t = 0
    while true {
      let n = Glibc.pread(a, x.baseAddress, x.count, offset)
      guard n > 0 else { return n == 0 }
      let m = max(0, Glibc.pread(b, y.baseAddress, n, offset))
      var p = 0
      while p < n {
        let end = min(p + page, n)
        if x[p..<end].allSatisfy({ $0 == 0 }), p < m, !y[p..<min(end, m)].allSatisfy({ $0 == 0 }),
          !CopyBeforeWrite.holdsData(a, at: Int64(offset) + Int64(p))
        {
          return false
        }
        p = end
      }
      offset += off_t(n)
    }
  }

  // MARK: Pinning and opening

  /// Opens (or shares) the entry's CryptoFile; the entry must be pinned by the caller.
  private func openFile(_ e: Entry) throws -> CryptoFile {
    try e.openLock.withLock {
      let (copying, guarding) = stateLock.withLock { (e.copying, e.guarding) }
      // Its file is whole before anything reads it.
      try copying?.fill()
      if let f = e.file { return f }
      let f = try CryptoFile.open(path: path(of: e), key: key)
      if let guarding, !guarding.isFinished { f.guardWrites(with: guarding) }
      e.file = f
      return f
    }
  }

  /// Pins an entry found in the maps (under `stateLock`), or returns false if it left them.
  private func pinLocked(_ e: Entry) -> Bool {
    guard !e.removed else { return false }
    e.pins += 1
    touchLocked(e)
    return true
  }

  func unpin(_ e: Entry) {
    let (last, deleteFile, discard) = stateLock.withLock { () -> (Bool, Bool, Bool) in
      e.pins -= 1
      if !e.removed { touchLocked(e) }
      let last = e.pins == 0
      return (
        last, last && e.removed, last && !e.removed && e.row.pool == .staging && !e.row.committed
      )
    }
    guard last else { return }
    e.openLock.withLock {
      guard stateLock.withLock({ e.pins == 0 }) else { return }
      do { try e.file?.close() } catch { logger.debug("closing a disk cache file: \(error)") }
      e.file = nil
    }
    if deleteFile {
      if stateLock.withLock({ e.unlinkLater }) {
        unlinkSoon([path(of: e)])
      } else {
        unlink(url(of: e))
      }
    }
    if discard {
      background.async { [weak self] in self?.discardIfUnused(e) }
    }
  }

  /// Another pinned handle on the entry of `handle`.
  func duplicate(_ handle: CachedFileHandle) -> CachedFileHandle {
    stateLock.withLock {
      handle.entry.pins += 1
      touchLocked(handle.entry)
    }
    return CachedFileHandle(
      manager: self, entry: handle.entry, file: handle.file, cloudID: handle.cloudID,
      eTag: handle.eTag)
  }

  /// A new pinned handle on the same entry as `handle` (as ``CachedFileHandle/duplicate()``).
  public func pin(_ handle: CachedFileHandle) throws -> CachedFileHandle {
    try handle.duplicate()
  }

  /// Closes a handle (unpins its entry).
  public func unpin(_ handle: CachedFileHandle) { handle.close() }

  // MARK: Removal

  /// Takes entries out of the index; their files go now (with `unlinkLater`, soon, on the
  /// maintenance queue), or when their last handle closes. Caller holds `mutationLock`.
  private func removeEntries(_ entries: [Entry], unlinkLater: Bool = false) {
    guard !entries.isEmpty else { return }
    // A version being copied that goes needs no copy; one that stays needs its copy complete
    // before the in-place version, whose file has the rest of its content, goes.
    let (copying, guarding) = stateLock.withLock {
      (entries.compactMap(\.copying), entries.map(\.guarding))
    }
    for c in copying { c.finish() }
    let entries = zip(entries, guarding).compactMap { e, guarding -> Entry? in
      do {
        try guarding?.fill()
        return e
      } catch {
        // Its file stays (start-up completes the copy from it, then deletes it).
        logger.error("cannot complete the copy of a staged version: \(error)")
        return nil
      }
    }
    // With the index's next write, or shortly: one transaction per deleted file was most of
    // what an `unlink` cost here.
    index.deleteSoon(ids: entries.map(\.id).filter { $0 > 0 })
    scheduleDeleteFlush()
    let unpinned = stateLock.withLock { () -> [String] in
      // Only a committed version whose row waits for the index is there, usually the last one
      // committed (a file deleted after its close): the search starts from the end (a scan of
      // every waiting row per deleted file was a tenth of an `unlink`).
      for e in entries where e.id < 0 && e.row.committed && !pendingInserts.isEmpty {
        if let i = pendingInserts.lastIndex(where: { $0 === e }) { pendingInserts.remove(at: i) }
      }
      var out: [String] = []
      for e in entries where !e.removed {
        detach(e)
        e.removed = true
        accessed.remove(e.id)
        if e.pins == 0 {
          out.append((e.row.pool == .cache ? cachePath : stagingPath) + "/" + e.row.fileName)
        }
      }
      return out
    }
    if unlinkLater {
      // Those still open go on the maintenance queue too when their last handle closes.
      stateLock.withLock { for e in entries where e.pins > 0 { e.unlinkLater = true } }
    }
    if unlinkLater {
      unlinkSoon(unpinned)
    } else {
      for u in unpinned { unlink(path: u) }
    }
  }

  /// Deletes files on the maintenance queue.
  private func unlinkSoon(_ paths: [String]) {
    guard !paths.isEmpty else { return }
    let go = stateLock.withLock { () -> Bool in
      pendingUnlinks += paths
      defer { unlinksScheduled = true }
      return !unlinksScheduled
    }
    if go { background.async { [weak self] in self?.unlinkPending() } }
  }

  /// Deletes the files ``remove(nodeID:)`` left for later.
  private func unlinkPending() {
    let paths = stateLock.withLock { () -> [String] in
      defer {
        pendingUnlinks = []
        unlinksScheduled = false
      }
      return pendingUnlinks
    }
    for p in paths { unlink(path: p) }
  }

  private func scheduleDeleteFlush() {
    let go = stateLock.withLock { () -> Bool in
      defer { deleteFlushScheduled = true }
      return !deleteFlushScheduled
    }
    guard go else { return }
    background.asyncAfter(deadline: .now() + Self.deleteFlushDelay) { [weak self] in
      guard let self else { return }
      self.stateLock.withLock { self.deleteFlushScheduled = false }
      do { try self.index.flushDeletes() } catch {
        self.logger.error("could not delete disk index rows: \(error)")
      }
    }
  }

  /// Drops an entry whose file failed authentication (cache) or reports it (staging); returns
  /// the error to throw.
  func corrupted(_ e: Entry, _ error: any Error) -> DiskError {
    let (pool, id) = stateLock.withLock { (e.row.pool, e.id) }
    if pool == .cache {
      logger.error("cache entry \(id) failed authentication, dropped: \(error)")
      // Out of the index at once, so the next lookup misses and downloads again; the file
      // goes when the last open handle closes.
      mutationLock.withLock { removeEntries([e]) }
    } else {
      logger.error("staged content \(id) failed authentication: \(error)")
    }
    return .corrupt("\(pool.rawValue) entry \(id): \(error)")
  }

  /// Removes every cache entry of `cloudID` (its content changed remotely), except the one of
  /// `keepingETag` if given. Open handles keep reading the old content until closed.
  public func invalidate(cloudID: String, keepingETag: String? = nil) {
    mutationLock.withLock {
      let victims = stateLock.withLock {
        cacheEntries(of: cloudID).filter { $0.row.eTag != keepingETag }
      }
      removeEntries(victims)
    }
  }

  /// Removes every entry (staged and cached) of a node deleted locally.
  ///
  /// The entries leave the index at once; their files are deleted shortly after, on the
  /// maintenance queue (this runs when a catalog delete commits, and thousands of `unlink`s
  /// there held up every other file operation of an `rm -rf`). Node IDs are never reused, and a
  /// file left by a crash before its turn is removed at the next start (a staging file of a node
  /// the catalog no longer has is discarded by the file system's start-up check).
  public func remove(nodeID: NodeID) {
    mutationLock.withLock {
      let victims = stateLock.withLock {
        (stagingEntries[nodeID] ?? []) + (cacheByNode[nodeID] ?? [])
      }
      removeEntries(victims, unlinkLater: true)
    }
  }

  // MARK: Eviction

  private func scheduleEviction() {
    guard automaticEviction else { return }
    let go = stateLock.withLock { () -> Bool in
      guard totals.bytes > totals.capBytes, !evictionScheduled else { return false }
      evictionScheduled = true
      return true
    }
    if go {
      background.async { [weak self] in
        guard let self else { return }
        self.stateLock.withLock { self.evictionScheduled = false }
        self.evictIfNeeded()
      }
    }
  }

  /// Evicts clean, unopened cache entries, least recently used first, until the total is
  /// under the cap (or nothing more may go); returns the number evicted. Dirty and open
  /// entries stay, even over the cap.
  @discardableResult
  public func evictIfNeeded() -> Int {
    mutationLock.withLock {
      // Snapshot the candidates briefly, sort without the lock readers need, then take the
      // victims out under it, skipping any that were opened or used meanwhile.
      let snapshot = stateLock.withLock { () -> (UInt64, [(Entry, Int64, UInt64)]) in
        guard totals.bytes > totals.capBytes else { return (0, []) }
        return (
          totals.bytes - totals.capBytes,
          cacheEntries.values.compactMap { e in
            e.pins == 0 ? (e, e.row.lastAccess, e.row.diskBytes) : nil
          }
        )
      }
      var excess = snapshot.0
      guard excess > 0 else { return 0 }
      var chosen: [(Entry, Int64)] = []
      for (e, tick, bytes) in snapshot.1.sorted(by: { $0.1 < $1.1 }) {
        chosen.append((e, tick))
        if bytes >= excess { break }
        excess -= bytes
      }
      let victims = stateLock.withLock { () -> [Entry] in
        var out: [Entry] = []
        for (e, tick) in chosen where e.pins == 0 && !e.removed && e.row.lastAccess == tick {
          detach(e)
          e.removed = true
          accessed.remove(e.id)
          out.append(e)
        }
        return out
      }
      guard !victims.isEmpty else { return 0 }
      do {
        try index.delete(ids: victims.map(\.id))
      } catch {
        logger.error("could not delete evicted rows: \(error)")
      }
      for e in victims { unlink(url(pool: e.row.pool, fileName: e.row.fileName)) }
      logger.debug("evicted \(victims.count) cache entries")
      return victims.count
    }
  }

  // MARK: Cache pool

  /// A pinned handle on the cached content of (cloudID, eTag), complete or partial, or `nil`.
  /// An entry whose file fails to open or authenticate is dropped (and `nil` returned).
  public func cachedFile(cloudID: String, eTag: String) -> CachedFileHandle? {
    let e = stateLock.withLock { () -> Entry? in
      guard let e = cacheEntries[CacheKey(cloudID: cloudID, eTag: eTag)], pinLocked(e) else {
        return nil
      }
      return e
    }
    guard let e else { return nil }
    do {
      let f = try openFile(e)
      return CachedFileHandle(manager: self, entry: e, file: f, cloudID: cloudID, eTag: eTag)
    } catch {
      _ = corrupted(e, error)
      unpin(e)
      return nil
    }
  }

  /// A pinned handle on the complete cached content of `cloudID` whatever its eTag (the one
  /// used last when there are several), or `nil`. For a node whose catalog entry no longer
  /// names a version (kept and uploaded again after another device deleted it): its content
  /// here is the version this device had.
  public func newestCompleteCachedFile(cloudID: String) -> CachedFileHandle? {
    let eTag = stateLock.withLock { () -> String? in
      cacheEntries(of: cloudID).filter { $0.bitmap == nil }
        .max { $0.row.lastAccess < $1.row.lastAccess }?.row.eTag
    }
    guard let eTag, let h = cachedFile(cloudID: cloudID, eTag: eTag) else { return nil }
    if h.isComplete { return h }
    h.close()
    return nil
  }

  /// True when (cloudID, eTag) has a complete cache entry (does not pin).
  public func hasCompleteFile(cloudID: String, eTag: String) -> Bool {
    stateLock.withLock { cacheEntries[CacheKey(cloudID: cloudID, eTag: eTag)]?.bitmap == nil }
  }

  /// Stores complete content for (cloudID, eTag), written by `fill` into a new CryptoFile, and
  /// returns it pinned. Replaces any other cache entry of the cloudID. If `fill` throws,
  /// nothing is stored.
  public func storeCachedFile(
    cloudID: String, eTag: String, nodeID: NodeID? = nil,
    fill: (CryptoFile) throws -> Void
  ) throws -> CachedFileHandle {
    let name = Self.randomName()
    let path = url(pool: .cache, fileName: name)
    let file = try CryptoFile.create(at: path, key: key, chunkShift: chunkShift)
    do {
      try fill(file)
    } catch {
      try? file.close()
      unlink(path)
      throw error
    }
    let size = file.size
    let row = IndexRow(
      id: 0, pool: .cache, nodeID: nodeID, version: 0, cloudID: cloudID, eTag: eTag,
      fileName: name, size: size,
      diskBytes: Self.diskBytes(size: size, bitmap: nil, chunkShift: file.chunkShift),
      lastAccess: 0, dirty: false, committed: true, complete: true, chunks: nil)
    let e = try insertCacheEntry(row, file: file)
    scheduleEviction()
    return CachedFileHandle(manager: self, entry: e, file: file, cloudID: cloudID, eTag: eTag)
  }

  /// Inserts a cache row (replacing the cloudID's other entries), pinned once, with `file`.
  private func insertCacheEntry(_ row: IndexRow, file: CryptoFile) throws -> Entry {
    try mutationLock.withLock {
      let old = stateLock.withLock {
        row.cloudID.map { cacheEntries(of: $0) } ?? []
      }
      removeEntries(old)
      var r = row
      r.lastAccess = stateLock.withLock { nextTick() }
      do {
        r.id = try index.insert(r)
      } catch {
        try? file.close()
        unlink(url(pool: .cache, fileName: r.fileName))
        throw DiskError.from(error, "cannot index a cache entry")
      }
      let e = Entry(row: r)
      e.file = file
      e.pins = 1
      stateLock.withLock { add(e) }
      return e
    }
  }

  /// A pinned handle on the cache entry of (cloudID, eTag), creating an empty partial entry of
  /// `size` bytes if there is none; fill it with ``CachedFileHandle/fill(chunks:with:)``.
  public func partialCachedFile(cloudID: String, eTag: String, nodeID: NodeID? = nil, size: UInt64)
    throws -> CachedFileHandle
  {
    if let h = cachedFile(cloudID: cloudID, eTag: eTag) { return h }
    let name = Self.randomName()
    let path = url(pool: .cache, fileName: name)
    let file = try CryptoFile.create(at: path, key: key, chunkShift: chunkShift)
    do {
      try file.truncate(to: size)
    } catch {
      try? file.close()
      unlink(path)
      throw error
    }
    var bitmap: ChunkBitmap? = ChunkBitmap(count: CacheChunks.count(fileSize: size))
    if size == 0 { bitmap = nil }
    let row = IndexRow(
      id: 0, pool: .cache, nodeID: nodeID, version: 0, cloudID: cloudID, eTag: eTag,
      fileName: name, size: size,
      diskBytes: Self.diskBytes(size: size, bitmap: bitmap, chunkShift: file.chunkShift),
      lastAccess: 0, dirty: false, committed: true, complete: bitmap == nil, chunks: bitmap?.data)
    // Another thread may have created one meanwhile: prefer it.
    if let h = cachedFile(cloudID: cloudID, eTag: eTag) {
      try? file.close()
      unlink(path)
      return h
    }
    let e = try insertCacheEntry(row, file: file)
    return CachedFileHandle(manager: self, entry: e, file: file, cloudID: cloudID, eTag: eTag)
  }

  func isComplete(_ e: Entry) -> Bool { stateLock.withLock { e.bitmap == nil } }

  func contains(_ e: Entry, _ range: ByteRange) -> Bool {
    stateLock.withLock {
      guard let b = e.bitmap else { return true }
      return b.missingSpan(in: CacheChunks.chunks(covering: range, fileSize: e.row.size)) == nil
    }
  }

  func missingChunks(_ e: Entry, _ chunks: Range<UInt64>) -> Range<UInt64>? {
    stateLock.withLock { e.bitmap?.missingSpan(in: chunks) }
  }

  /// Checks that a read may proceed and records the access (memory only).
  func willRead(_ e: Entry, _ range: ByteRange) throws {
    try stateLock.withLock {
      if let b = e.bitmap,
        b.missingSpan(in: CacheChunks.chunks(covering: range, fileSize: e.row.size)) != nil
      {
        throw DiskError.notPresent(range)
      }
      touchLocked(e)
    }
  }

  /// Stores downloaded chunks of a partial entry and marks them present at once for readers in
  /// this process. The index records them later (``persistFills()``, batched, after the file's
  /// bytes are on stable storage): a fsync per fill made each ranged download wait for the
  /// disk, and the index must never list a chunk whose bytes a crash could lose (a hole reads
  /// as zeros). After a crash, unrecorded chunks are downloaded again.
  func fill(_ e: Entry, file: CryptoFile, chunks: Range<UInt64>, bytes: UnsafeRawBufferPointer)
    throws
  {
    let size = stateLock.withLock { e.row.size }
    let range = CacheChunks.byteRange(of: chunks, fileSize: size)
    guard UInt64(bytes.count) == range.count else {
      throw DiskError.io("fill of \(chunks) needs \(range.count) bytes, got \(bytes.count)")
    }
    guard stateLock.withLock({ e.bitmap != nil }) else { return }
    try file.write(bytes, at: range.lowerBound)
    try stateLock.withLock {
      guard !e.removed else { throw DiskError.gone }
      guard var b = e.bitmap else { return }
      b.insert(chunks)
      var r = e.row
      let full = b.isFull
      r.complete = full
      r.chunks = full ? nil : b.data
      r.diskBytes = Self.diskBytes(
        size: r.size, bitmap: full ? nil : b, chunkShift: file.chunkShift)
      e.bitmap = full ? nil : b
      replaceRow(e, r)
      unpersisted[e.id] = e
      if !persistScheduled {
        persistScheduled = true
        background.asyncAfter(deadline: .now() + Self.fillPersistInterval) { [weak self] in
          self?.persistFills()
        }
      }
    }
    scheduleEviction()
  }

  /// Seconds at most between a fill and the index recording it (see ``persistFills()``).
  public static let fillPersistInterval: TimeInterval = 1

  /// Records in the index the chunks filled since the last call, each entry's file flushed to
  /// stable storage first. Runs on its own after fills, and on ``flush()``.
  public func persistFills() {
    mutationLock.withLock {
      // Rows taken before the flush: every chunk they list was written before it was listed.
      let pending = stateLock.withLock { () -> [(Entry, IndexRow)] in
        persistScheduled = false
        defer { unpersisted.removeAll() }
        return unpersisted.values.compactMap { e in e.removed ? nil : (e, e.row) }
      }
      for (e, row) in pending {
        do {
          try e.openLock.withLock {
            if let f = e.file {
              try f.sync()
            } else {
              try LocalDurability.sync(path: path(of: e))
            }
          }
          guard stateLock.withLock({ !e.removed }) else { continue }
          try index.update(row)
        } catch {
          // Not recorded: after a restart these chunks are downloaded again.
          logger.warning("could not record downloaded chunks in the disk index: \(error)")
        }
      }
    }
  }

  // MARK: Staging pool

  func isSealed(_ e: Entry) -> Bool { stateLock.withLock { e.row.committed || e.removed } }

  /// A writable staging version of a node: the node's open uncommitted version if there is
  /// one, else a new version holding a copy of its newest committed staged version, else a
  /// copy of `base`, else empty. With `truncate`, a new version starts empty. The new version
  /// is written in the committed version's own file where it can (`writeInPlace`), and the
  /// committed version keeps the copy.
  ///
  /// A caller that found the node's current content itself passes it as `base`: a staged
  /// version it holds may meanwhile have become a cache entry (its upload finished), and would
  /// no longer be found here as staged.
  public func stagingFile(
    forNode nodeID: NodeID, truncate: Bool = false, base: StagingBase? = nil
  )
    throws -> StagingFile
  {
    if let open = try openUncommitted(nodeID) {
      if truncate { try open.truncate(to: 0) }
      return open
    }
    // Build the new version outside the locks (copying may be long).
    let name: String
    var file: CryptoFile
    let madeAt: UInt64
    if let spare = spares.take() {
      (name, file, madeAt) = spare
    } else {
      name = Self.randomName()
      file = try CryptoFile.create(
        path: stagingPath + "/" + name, key: key, chunkShift: chunkShift)
      madeAt = stagingDirectoryFlush.noteMade()
    }
    let path = stagingPath + "/" + name
    do {
      if !truncate {
        // Pinned: an upload finishing meanwhile moves the entry to the cache, the handle stays.
        if let latest = try openStaged(forNode: nodeID) {
          defer { latest.close() }
          if lazyCopies,
            let inPlace = try writeInPlaceLazily(
              latest, copy: &file, copyName: name, copyMadeAt: madeAt, base: base)
          {
            return inPlace
          }
          let cloned: Bool
          (file, cloned) = try clone(
            latest.file, at: self.path(of: latest.entry), replacing: file, at: path)
          if !cloned {
            try copy(from: { try latest.read(into: $0, at: $1) }, size: latest.size, to: file)
          } else if let inPlace = writeInPlace(
            latest, copy: file, copyName: name, copyMadeAt: madeAt, base: base)
          {
            return inPlace
          }
        } else if let base {
          // A complete cached version (the one an upload just made clean, typically) is copied
          // as it is, by the kernel: through the plaintext, a 20 MB database's next transaction
          // after each upload cost a decryption and encryption of all of it.
          var cloned = false
          if case .cached(let h) = base, h.isComplete {
            (file, cloned) = try clone(h.file, at: h.url.path, replacing: file, at: path)
          }
          if !cloned {
            try copy(from: { try base.read(into: $0, at: $1) }, size: base.size, to: file)
          }
        }
      }
    } catch {
      try? file.close()
      unlink(path: path)
      throw error
    }
    return try mutationLock.withLock {
      if let open = try openUncommitted(nodeID) {
        try? file.close()
        unlink(path: path)
        if truncate { try open.truncate(to: 0) }
        return open
      }
      // Not in the index until committed (an uncommitted version is nobody's acknowledged
      // content, and start-up deletes files the index does not know): a provisional id.
      let (version, provisional) = stateLock.withLock { () -> (Int64, Int64) in
        provisionalIDs -= 1
        return ((stagingEntries[nodeID]?.last?.row.version ?? 0) + 1, provisionalIDs)
      }
      let row = IndexRow(
        id: provisional, pool: .staging, nodeID: nodeID, version: version, cloudID: nil, eTag: nil,
        fileName: name, size: file.size,
        diskBytes: Self.diskBytes(size: file.size, bitmap: nil, chunkShift: file.chunkShift),
        lastAccess: stateLock.withLock { nextTick() }, dirty: false, committed: false,
        complete: true, chunks: nil)
      let e = Entry(row: row)
      e.file = file
      e.pins = 1
      e.madeAt = madeAt
      stateLock.withLock { add(e) }
      return StagingFile(manager: self, entry: e, file: file)
    }
  }

  /// The next version of `latest`'s node written in place: when the newest committed version
  /// was made durable (an `fsync`), nobody else has it open and no upload took its file, that
  /// version takes `copy` (its copy, just made) as its file and the new version goes on in the
  /// file the version had, or `nil` (the caller makes the new version from `copy`).
  ///
  /// Either way a whole copy of the committed content is made; but the new version's file is
  /// the one whose blocks are allocated and on stable storage already, so that its `fsync`
  /// writes the chunks written since, not the whole file (a database in the mount, each of
  /// whose transactions writes a few pages and `fsync`s them, wrote the whole database per
  /// transaction), while the copy is written back by the kernel at leisure and usually deleted
  /// first (superseded at the next commit). The exchange is recorded (the version's row names
  /// the copy; or, while the row waits for the index, a record in the commit log after the
  /// version's own: no index write per exchange) before anything writes the old file in
  /// place: after a crash the version is the copy, and the new version, uncommitted, goes. The
  /// row keeps the old file's name (`origin`): a copy a power loss left incomplete falls back
  /// to it at start-up. A version never made durable gains nothing from it (nothing is
  /// flushed; a file appended to and closed again and again would pay for the exchange for
  /// nothing), and is copied as before.
  /// Small files too: a database's rollback journal, written again after its first `fsync`,
  /// otherwise had its second `fsync` flush a new file (allocating its blocks: a journal
  /// commit of the file system), one device flush more per transaction. (With a whole copy
  /// per exchange and the index's rows inserted by each `fsync`, files under 256 KiB were once
  /// left out: four writers at once, each writing 100 B of its own 100 KB file and `fsync`ing,
  /// were slower in place. Now they take 1.7–2.1 ms per round in place against 2.6–3.5 ms.)
  private func writeInPlace(
    _ latest: StagingFile, copy: CryptoFile?, copyName: String, copyMadeAt: UInt64,
    base: StagingBase?, copying: CopyBeforeWrite? = nil
  ) -> StagingFile? {
    let e = latest.entry
    let nodeID = latest.nodeID
    // Handles on the version besides `latest`: the caller's `base` (the same version).
    var expectedPins = 1
    if case .staged(let b) = base, b.entry === e { expectedPins += 1 }
    return mutationLock.withLock { () -> StagingFile? in
      // Caller holds `stateLock`.
      func eligible() -> Bool { inPlaceEligible(e, pins: expectedPins) }
      guard stateLock.withLock(eligible) else { return nil }
      // The version's open lock, then the state lock (the order of `openFile` and `unpin`),
      // held from the last look at its handles to the exchange: a handle taken meanwhile
      // opens the copy.
      let next = e.openLock.withLock { () -> Entry? in
        let next = stateLock.withLock { () -> Entry? in
          guard eligible() else { return nil }
          let original = e.row.fileName
          do {
            if e.id < 0 {
              // Its row waits for the index and its commit is in the log: so is the exchange
              // (the row goes in with it; no index write here).
              try commitLog.append(
                name: copyName, nodeID: nodeID, version: e.row.version, exchange: true,
                copiedAsNeeded: copying != nil)
            } else {
              try index.moveFile(
                id: e.id, to: copyName, origin: original, copiedAsNeeded: copying != nil)
            }
          } catch {
            logger.warning("cannot write a staged version in place: \(error)")
            return nil
          }
          e.row.fileName = copyName
          e.row.origin = original
          e.row.copiedAsNeeded = copying != nil
          let originalMadeAt = e.madeAt
          e.madeAt = copyMadeAt
          e.flushed = false
          provisionalIDs -= 1
          let size = latest.file.size
          let row = IndexRow(
            id: provisionalIDs, pool: .staging, nodeID: nodeID, version: e.row.version + 1,
            cloudID: nil, eTag: nil, fileName: original, size: size,
            diskBytes: Self.diskBytes(size: size, bitmap: nil, chunkShift: latest.file.chunkShift),
            lastAccess: nextTick(), dirty: false, committed: false, complete: true, chunks: nil)
          let next = Entry(row: row)
          next.file = latest.file
          next.pins = 1
          next.madeAt = originalMadeAt
          e.copying = copying
          next.guarding = copying
          add(next)
          return next
        }
        if next != nil { e.file = copy }
        return next
      }
      guard let next else { return nil }
      // Before anything writes the file: its blocks are copied first.
      if let copying { latest.file.guardWrites(with: copying) }
      return StagingFile(manager: self, entry: next, file: latest.file)
    }
  }

  /// ``writeInPlace`` with the copy made as it is needed (``CopyBeforeWrite``): the committed
  /// version's new file, `copy`, starts as holes; each block the new version is about to
  /// change in the old file is copied to it first, and the rest when something reads the
  /// committed version (an upload), when the new version is dropped uncommitted, or at
  /// start-up after a crash (its holes are the blocks not changed). A transaction of a
  /// database in the mount then copies the pages it writes, not the whole database (20 MB:
  /// 4–5 ms per transaction). `copy` is closed and, when the exchange does not happen, made
  /// anew (empty) for the caller.
  private func writeInPlaceLazily(
    _ latest: StagingFile, copy file: inout CryptoFile, copyName: String, copyMadeAt: UInt64,
    base: StagingBase?
  ) throws -> StagingFile? {
    let e = latest.entry
    var expectedPins = 1
    if case .staged(let b) = base, b.entry === e { expectedPins += 1 }
    guard stateLock.withLock({ inPlaceEligible(e, pins: expectedPins) }) else { return nil }
    try latest.file.flushBuffer()
    let copyPath = stagingPath + "/" + copyName
    // Its first block is copied over what it holds (see `CopyBeforeWrite.init`).
    file.closeDiscarding()
    var copying: CopyBeforeWrite?
    var next: StagingFile?
    defer {
      if next == nil {
        copying?.finish()
        // The caller copies into it as before.
        if let fresh = try? CryptoFile.create(path: copyPath, key: key, chunkShift: chunkShift) {
          file = fresh
        }
      }
    }
    do {
      copying = try CopyBeforeWrite(source: path(of: e), copy: copyPath)
    } catch {
      logger.warning("cannot copy a staged version as needed: \(error)")
      return nil
    }
    next = writeInPlace(
      latest, copy: nil, copyName: copyName, copyMadeAt: copyMadeAt, base: base,
      copying: copying)
    return next
  }

  /// Whether a new version of `e`'s node can be written in `e`'s file (see `writeInPlace`),
  /// with `pins` handles expected on it. The caller holds `stateLock`.
  private func inPlaceEligible(_ e: Entry, pins: Int) -> Bool {
    !e.removed && e.row.committed && e.row.pool == .staging && e.flushed && !e.exported
      && e.copying?.isFinished != false && e.pins == pins
      && stagingEntries[e.row.nodeID ?? 0]?.last === e
  }

  /// `source`, a staged or complete cached version's file at `sourcePath`, copied byte for byte
  /// (ciphertext, header and all: the same content under the same key) over `file`, the new version's empty file at `path`, by the kernel
  /// (`copy_file_range(2)`): no decryption or encryption, and a reflink where the file system
  /// shares extents (btrfs, XFS), so that a write after a commit does not cost a pass over the
  /// whole file there. The file at `path` afterwards, and whether it is the copy: not when
  /// the source has another chunk size or cipher than new files (copying through the
  /// plaintext brings it to them) or the kernel cannot copy between the two files (it is
  /// then still empty).
  private func clone(
    _ source: CryptoFile, at sourcePath: String, replacing file: CryptoFile, at path: String
  ) throws -> (CryptoFile, Bool) {
    guard source.chunkShift == chunkShift, source.cipher == CryptoFile.defaultCipher
    else { return (file, false) }
    try source.flushBuffer()
    // Closed first: closing writes what it holds (an empty file's first chunk).
    try file.close()
    func reopened() throws -> (CryptoFile, Bool) {
      (try CryptoFile.open(path: path, key: key), false)
    }
    let from = Glibc.open(sourcePath, O_RDONLY | O_CLOEXEC)
    guard from >= 0 else { return try reopened() }
    defer { Glibc.close(from) }
    let to = Glibc.open(path, O_WRONLY | O_CLOEXEC)
    guard to >= 0 else { return try reopened() }
    var closeTo = true
    defer { if closeTo { Glibc.close(to) } }
    var copied = zdc_copy_file_range(from, to, 1 << 30)
    if copied == -Int(EXDEV) || copied == -Int(EOPNOTSUPP) || copied == -Int(ENOSYS)
      || copied == -Int(EINVAL)
    {
      return try reopened()
    }
    var total = max(0, copied)
    while copied > 0 {
      copied = zdc_copy_file_range(from, to, 1 << 30)
      total += max(0, copied)
    }
    if copied == 0, ftruncate(to, off_t(total)) != 0 { copied = -Int(errno) }
    if copied < 0 {
      throw DiskError.from(
        StoreError.io(
          "copy_file_range: \(String(cString: strerror(Int32(-copied))))", errno: Int32(-copied)),
        "copying a staged version")
    }
    closeTo = false
    guard Glibc.close(to) == 0 else {
      throw DiskError.from(StoreError.io("close", errno: errno), "copying a staged version")
    }
    return (try CryptoFile.open(path: path, key: key), true)
  }

  private func copy(
    from read: (UnsafeMutableRawBufferPointer, UInt64) throws -> Int, size: UInt64,
    to file: CryptoFile
  ) throws {
    // Up to 1 MiB per call: whole chunks of the new file are sealed in batches.
    let count = Int(min(max(size, 1), 1 << 20))
    let buf = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 16)
    defer {
      buf.initializeMemory(as: UInt8.self, repeating: 0)
      buf.deallocate()
    }
    var offset: UInt64 = 0
    while offset < size {
      let n = try read(buf, offset)
      guard n > 0 else { break }
      try file.write(UnsafeRawBufferPointer(rebasing: buf[0..<n]), at: offset)
      offset += UInt64(n)
    }
  }

  private func openUncommitted(_ nodeID: NodeID) throws -> StagingFile? {
    let e = stateLock.withLock { () -> Entry? in
      guard let e = stagingEntries[nodeID]?.last(where: { !$0.row.committed }), pinLocked(e)
      else { return nil }
      return e
    }
    guard let e else { return nil }
    do {
      return StagingFile(manager: self, entry: e, file: try openFile(e))
    } catch {
      unpin(e)
      throw error
    }
  }

  /// Commits a staging version: writes it out and marks it dirty (to upload). Older committed
  /// versions of the node are superseded and removed. The version is sealed.
  ///
  /// The commit survives a crash of this process; ``makeDurable(nodeID:with:)`` makes it
  /// survive a power loss too.
  public func commitStaging(_ staging: StagingFile) throws {
    let e = staging.entry
    try staging.file.flushBuffer()
    try mutationLock.withLock {
      let row = try stateLock.withLock { () -> IndexRow in
        guard !e.removed else { throw DiskError.gone }
        guard !e.row.committed else { throw DiskError.sealed }
        var r = e.row
        r.committed = true
        r.dirty = true
        r.size = staging.file.size
        r.diskBytes = Self.diskBytes(
          size: r.size, bitmap: nil, chunkShift: staging.file.chunkShift)
        r.lastAccess = nextTick()
        return r
      }
      var deferred = false
      if row.id < 0 {
        // Committed by a record in the commit log (its row goes into the index with the next
        // batch): an index transaction per closed file cost more than the rest of the commit,
        // and so did renaming the file to a committed name (a directory update, the ext4
        // journal's), as it did before.
        try commitLog.append(name: row.fileName, nodeID: staging.nodeID, version: row.version)
        stateLock.withLock {
          replaceRow(e, row)
          pendingInserts.append(e)
          commits.touch()
        }
        deferred = true
      } else {
        do { try index.update(row) } catch { throw DiskError.from(error, "cannot commit") }
      }
      let older = stateLock.withLock { () -> [Entry] in
        if !deferred { replaceRow(e, row) }
        return (stagingEntries[staging.nodeID] ?? []).filter {
          $0 !== e && $0.row.committed && $0.row.version < row.version
        }
      }
      // Their files go on the maintenance queue: unlinking a file that was just written (a
      // version superseded by the next commit, as each transaction of a database in the mount
      // supersedes the last) cost the commit a third of a millisecond.
      removeEntries(older, unlinkLater: true)
      if deferred { scheduleInsertFlush(logged: commitLog.count) }
    }
    // The version it was written in place of is superseded: its copy is no longer wanted.
    if let guarding = stateLock.withLock({ () -> CopyBeforeWrite? in
      defer { e.guarding = nil }
      return e.guarding
    }) {
      guarding.finish()
      staging.file.guardWrites(with: nil)
    }
    scheduleEviction()
  }

  private func scheduleInsertFlush(logged: Int) {
    let (go, full) = stateLock.withLock { () -> (Bool, Bool) in
      defer { insertFlushScheduled = true }
      return (
        !insertFlushScheduled,
        pendingInserts.count >= Self.maxPendingInserts
          || logged % Self.commitLogEmptyingRecords == 0
      )
    }
    if full {
      background.async { [weak self] in self?.flushInserts() }
    }
    guard go else { return }
    scheduleInsertFlush(after: insertFlushDelay)
  }

  private func scheduleInsertFlush(after seconds: Double) {
    background.asyncAfter(deadline: .now() + seconds) { [weak self] in
      guard let self else { return }
      // Commits still coming: the rows wait until they pause.
      let wait = self.stateLock.withLock { () -> Double? in
        let wait = self.insertWaitLocked()
        if wait == nil { self.insertFlushScheduled = false }
        return wait
      }
      if let wait {
        self.scheduleInsertFlush(after: max(wait, self.insertFlushDelay))
      } else {
        self.flushInserts()
      }
    }
  }

  /// How much longer the rows waiting for the index may wait (staging commits keep coming), or
  /// `nil` when they go in now. Caller holds `stateLock`.
  private func insertWaitLocked() -> Double? {
    guard let wait = commits.remainingUntilQuiet(insertFlushQuiet), !pendingInserts.isEmpty,
      pendingInserts.count < Self.maxPendingInserts
    else { return nil }
    return wait
  }

  private func flushInserts() {
    mutationLock.withLock {
      do { try flushInsertsDurablyLocked() } catch {
        logger.error("could not record committed staging versions: \(error)")
      }
    }
  }

  /// The commit log is emptied (after the index was made durable, see
  /// `flushInsertsDurablyLocked`) each time it holds this many more records, even while
  /// commits keep coming (a database's transactions, each `fsync`ed).
  static let commitLogEmptyingRecords = 4096

  /// Inserts the rows waiting for the index and empties the commit log: when `fsync`s made some
  /// of its records durable, once the index is on stable storage with their rows (one flush,
  /// here, off the `fsync`s). Caller holds `mutationLock`.
  private func flushInsertsDurablyLocked() throws {
    try flushInsertsLocked()
    guard commitLog.count > 0 else { return }
    try makeIndexDurable()
    try commitLog.clear()
  }

  /// Flushes the index's changes to stable storage (nothing when they are there already).
  private func makeIndexDurable() throws {
    let flush = index.pendingFlush()
    guard !flush.isEmpty else { return }
    do {
      try withExtendedLifetime(flush.dataOnly) {
        _ = try LocalDurability.sync(
          paths: flush.paths, dataOnlyDescriptors: flush.dataOnly.map(\.descriptor))
      }
    } catch { throw DiskError.from(error, "cannot flush the disk index") }
    flush.done()
  }

  /// Empties the commit log once the index holds its records, unless an `fsync` flushed some of
  /// them (or is flushing them): their rows must be on stable storage first, and the index is
  /// not flushed here (`flushInsertsDurablyLocked` empties it). Caller holds `mutationLock`.
  private func clearCommitLogLocked() throws {
    if !commitLog.mayHaveDurableRecords { try commitLog.clear() }
  }

  /// Inserts the rows of committed staging versions waiting for the index, in one transaction.
  /// Caller holds `mutationLock`.
  private func flushInsertsLocked() throws {
    let waiting = stateLock.withLock { () -> [Entry] in
      defer { pendingInserts.removeAll() }
      return pendingInserts.filter { !$0.removed && $0.id < 0 }
    }
    guard !waiting.isEmpty else {
      // Every commit logged is recorded (or removed since): commits append under the lock
      // held here.
      try clearCommitLogLocked()
      return
    }
    let rows = stateLock.withLock { waiting.map(\.row) }
    let ids: [Int64]
    do { ids = try index.insert(rows) } catch {
      stateLock.withLock { pendingInserts = waiting + pendingInserts }
      throw DiskError.from(error, "cannot record committed staging versions")
    }
    stateLock.withLock {
      for (e, id) in zip(waiting, ids) {
        var r = e.row
        r.id = id
        if accessed.remove(e.id) != nil { accessed.insert(id) }
        replaceRow(e, r)
      }
    }
    try clearCommitLogLocked()
  }

  /// Throws a staging version away (committed or not) and closes the handle.
  public func discardStaging(_ staging: StagingFile) {
    mutationLock.withLock { removeEntries([staging.entry]) }
    staging.close()
  }

  private func discardIfUnused(_ e: Entry) {
    mutationLock.withLock {
      let stale = stateLock.withLock { e.pins == 0 && !e.removed && !e.row.committed }
      if stale { removeEntries([e]) }
    }
  }

  /// Flushes a node's newest committed staged version, the staging directory's entries and the
  /// index to stable storage (what `fsync(2)` of the file promises), and with them `other`
  /// (the catalog's): all their writebacks start before the first flush waits (see
  /// `LocalDurability.sync(paths:before:)`). Each is flushed only when something of it may not
  /// be on stable storage yet (the version not flushed since its commit, a file made in the
  /// staging directory since its last flush, a change of the index since its last flush): a
  /// flush with nothing to do costs the device a cache flush all the same. Returns how many
  /// files it flushed.
  @discardableResult
  public func makeDurable(nodeID: NodeID, with other: PendingFlush = .none) throws -> Int {
    // The commits whose rows wait for the index are in the commit log: its records are
    // flushed, not the index's insertion (a transaction and a flush of its write-ahead log).
    let logged = mutationLock.withLock { commitLog.pendingFlush() }
    let staged = try openStaged(forNode: nodeID)
    defer { staged?.close() }
    // Read before the flush: it covers every file made so far.
    let made = stagingDirectoryFlush.made
    // A committed version never changes: once flushed, it stays on stable storage.
    let flushed = staged.map { s in stateLock.withLock { s.entry.flushed } } ?? true
    // On ext4 and XFS a new file's `fsync` makes its directory entry durable too (ext4
    // commits the journal transaction that made it, or without a journal writes the parent
    // directory's blocks with the file; XFS forces its log past the file's creation): the
    // directory is flushed only when the version's file is not.
    let directory =
      staged.map { stagingDirectoryFlush.needsFlush(madeAt: $0.entry.madeAt) } ?? false
    let flushDirectory = directory && (flushed || !stagingFlushesNewEntries)
    let index = index.pendingFlush().merged(with: logged)
    if !flushed { try staged?.file.startSync() }
    let paths = (flushDirectory ? [stagingDirectory.path] : []) + index.paths + other.paths
    let dataOnly = index.dataOnly + other.dataOnly
    var content = false
    _ = try withExtendedLifetime(dataOnly) {
      try LocalDurability.sync(
        paths: paths, dataOnlyDescriptors: dataOnly.map(\.descriptor),
        before: {
          if !flushed, let staged { content = try staged.file.sync() }
          return content
        }, beforeDevice: stagingDevice)
    }
    if let staged, !flushed {
      stateLock.withLock {
        staged.entry.flushed = true
        // Its directory entry too (see above).
        if directory && !flushDirectory { staged.entry.madeAt = 0 }
      }
    }
    if flushDirectory { stagingDirectoryFlush.didFlush(made) }
    index.done()
    other.done()
    return paths.count + dataOnly.count + (content ? 1 : 0)
  }

  /// The newest committed staged version of a node, or `nil`. With `exporting` (an upload
  /// reads its file), that file is never written in place afterwards (see
  /// ``stagingFile(forNode:truncate:base:)``).
  public func stagedData(forNode nodeID: NodeID, exporting: Bool = false) -> StagedData? {
    // Its file is whole before anyone reads it (see `writeInPlaceLazily`).
    let copying = stateLock.withLock {
      stagingEntries[nodeID]?.last(where: { $0.row.committed && $0.row.dirty })?.copying
    }
    do { try copying?.fill() } catch {
      // Reading it then fails (an upload is tried again).
      logger.error("cannot complete the copy of a staged version: \(error)")
    }
    return stateLock.withLock {
      guard let e = stagingEntries[nodeID]?.last(where: { $0.row.committed && $0.row.dirty }) else {
        return nil
      }
      if exporting { e.exported = true }
      return StagedData(
        nodeID: nodeID, version: e.row.version,
        url: url(pool: .staging, fileName: e.row.fileName), key: key, size: e.row.size)
    }
  }

  /// A read-only (sealed) handle on the newest committed staged version of a node, pinned, or
  /// `nil` when there is none.
  public func openStaged(forNode nodeID: NodeID) throws -> StagingFile? {
    let e = stateLock.withLock { () -> Entry? in
      guard let e = stagingEntries[nodeID]?.last(where: { $0.row.committed && $0.row.dirty }),
        pinLocked(e)
      else { return nil }
      return e
    }
    guard let e else { return nil }
    do {
      return StagingFile(manager: self, entry: e, file: try openFile(e))
    } catch {
      unpin(e)
      throw corrupted(e, error)
    }
  }

  /// The nodes that have staged content (committed or not).
  public func stagedNodeIDs() -> [NodeID] {
    stateLock.withLock { Array(stagingEntries.keys) }
  }

  /// True when the node has committed staged content not yet uploaded.
  public func isDirty(nodeID: NodeID) -> Bool { hasStagedData(forNode: nodeID) }

  /// The file of a node's newest committed staged version, as it is (tests: a copy made as it
  /// is needed is not completed here).
  func committedFile(forNode nodeID: NodeID) -> URL? {
    stateLock.withLock {
      stagingEntries[nodeID]?.last(where: { $0.row.committed }).map {
        url(pool: .staging, fileName: $0.row.fileName)
      }
    }
  }

  /// Runs `body` while no mutation changes the index, the commit log or what they name (tests: a
  /// copy of the state directory as a crash would leave it). The maintenance queue goes on:
  /// the deletions of files superseded or removed before may happen meanwhile, or not, as a
  /// crash may come before or after each.
  func quiesced<T>(_ body: () throws -> T) rethrows -> T {
    try mutationLock.withLock { try body() }
  }

  /// Whether a node has an uncommitted staged version (tests: one closed unwritten is dropped
  /// on the maintenance queue).
  func hasUncommittedVersion(forNode nodeID: NodeID) -> Bool {
    stateLock.withLock { stagingEntries[nodeID]?.contains(where: { !$0.row.committed }) ?? false }
  }

  /// Whether a node has committed staged content not uploaded yet (``stagedData(forNode:exporting:)``
  /// would return it), without preparing its file for reading.
  public func hasStagedData(forNode nodeID: NodeID) -> Bool {
    stateLock.withLock {
      stagingEntries[nodeID]?.contains(where: { $0.row.committed && $0.row.dirty }) ?? false
    }
  }

  /// Records that a staged version (the newest committed one by default) reached the store as
  /// DATA `eTag` of `cloudID`: it becomes the clean cached copy of that version (no download
  /// needed), and it and older versions stop being dirty. Returns false if that version is
  /// gone (superseded meanwhile); newer versions stay staged either way.
  @discardableResult
  public func markUploaded(nodeID: NodeID, version: Int64? = nil, cloudID: String, eTag: String)
    throws -> Bool
  {
    try mutationLock.withLock {
      let (target, older, stale) = stateLock.withLock { () -> (Entry?, [Entry], [Entry]) in
        let versions = (stagingEntries[nodeID] ?? []).filter { $0.row.committed }
        let target =
          version.map { v in versions.first { $0.row.version == v } }
          ?? versions.last
        let upTo = target?.row.version ?? version ?? 0
        let older = versions.filter { $0 !== target && $0.row.version < upTo }
        let stale = target == nil ? [] : cacheEntries(of: cloudID)
        return (target, older, stale)
      }
      removeEntries(older + stale)
      guard let e = target else { return false }
      // The row leaves the staging pool: the commit log must not outlive it. Its records are
      // adopted at start-up unless a staging row of their node has their version or a later
      // one; with this row gone, a record of this version (or of an older one whose file a
      // reader still holds) would bring back a staged version the store has, or the file
      // written in place of it, uncommitted. So the log is emptied first (after the index is
      // flushed, when an `fsync` flushed records).
      try flushInsertsDurablyLocked()
      let row = stateLock.withLock { () -> IndexRow in
        var r = e.row
        r.pool = .cache
        r.dirty = false
        r.cloudID = cloudID
        r.eTag = eTag
        r.lastAccess = nextTick()
        return r
      }
      let from = url(pool: .staging, fileName: row.fileName)
      let to = url(pool: .cache, fileName: row.fileName)
      // Under the entry's open lock: a concurrent first open of the entry opens the file either
      // before the rename (the descriptor survives it) or after the row names the cache.
      try e.openLock.withLock {
        // The row first: after a crash between the two, start-up finds the file in the other
        // directory and moves it where the row says.
        do { try index.update(row) } catch {
          throw DiskError.from(error, "cannot record an upload")
        }
        guard Glibc.rename(from.path, to.path) == 0 else {
          let code = errno
          let previous = stateLock.withLock { e.row }
          try? index.update(previous)
          throw DiskError.io("rename of an uploaded staging file: errno \(code)")
        }
        stateLock.withLock { replaceRow(e, row) }
      }
      scheduleEviction()
      return true
    }
  }
}

/// Which files made in a directory are known to have their entries on stable storage: files
/// are numbered as they are made (from 2; files found at start-up count as 1) and a flush of
/// the directory covers every one made before it started.
final class DirectoryFlush: Sendable {
  private let state = Mutex<(made: UInt64, flushed: UInt64)>((1, 0))

  /// Numbers a file just made.
  func noteMade() -> UInt64 {
    state.withLock {
      $0.made += 1
      return $0.made
    }
  }

  /// The number of the last file made.
  var made: UInt64 { state.withLock { $0.made } }

  /// True when the entry of file number `madeAt` may not be on stable storage yet.
  func needsFlush(madeAt: UInt64) -> Bool { state.withLock { madeAt > $0.flushed } }

  /// Records a flush of the directory that started after file number `made` was made.
  func didFlush(_ made: UInt64) { state.withLock { $0.flushed = max($0.flushed, made) } }
}

/// Spare empty staging files (see `DiskManager.spares`). Refills run on the manager's
/// maintenance queue and hold only this object, so a released manager is never kept alive.
final class SpareStagingFiles: @unchecked Sendable {
  // @unchecked: `files`, `refilling` and `closed` are guarded by `lock`.
  private let lock = NSLock()
  private var files: [(String, CryptoFile, UInt64)] = []
  private var refilling = false
  private var closed = false
  let directory: String
  let key: Data
  let chunkShift: UInt8
  let queue: DispatchQueue
  let directoryFlush: DirectoryFlush
  /// How many spare files are kept ready.
  static let target = 16

  init(
    directory: String, key: Data, chunkShift: UInt8, queue: DispatchQueue,
    directoryFlush: DirectoryFlush
  ) {
    self.directory = directory
    self.key = key
    self.chunkShift = chunkShift
    self.queue = queue
    self.directoryFlush = directoryFlush
  }

  /// A spare file (its name, open CryptoFile and ``DirectoryFlush`` mark), or `nil`; starts a
  /// refill when running low.
  func take() -> (String, CryptoFile, UInt64)? {
    let (spare, refill) = lock.withLock { () -> ((String, CryptoFile, UInt64)?, Bool) in
      let spare = files.popLast()
      let refill = !closed && files.count < Self.target / 2 && !refilling
      if refill { refilling = true }
      return (spare, refill)
    }
    if refill {
      queue.async {
        while self.makeOne() {}
        self.lock.withLock { self.refilling = false }
      }
    }
    return spare
  }

  /// Makes one spare file unless enough are ready (or the pool was discarded); false when done.
  private func makeOne() -> Bool {
    guard lock.withLock({ !closed && files.count < Self.target }) else { return false }
    let name = SecureRandom.hex128()
    let path = directory + "/" + name
    do {
      let file = try CryptoFile.create(
        path: path, key: key, chunkShift: chunkShift, deferringFirstChunk: true)
      let madeAt = directoryFlush.noteMade()
      let kept = lock.withLock { () -> Bool in
        guard !closed else { return false }
        files.append((name, file, madeAt))
        return true
      }
      if !kept {
        try? file.close()
        Glibc.unlink(path)
      }
      return kept
    } catch {
      // (A full disk: `stagingFile` creates its file itself and reports the error.)
      Glibc.unlink(path)
      return false
    }
  }

  /// Deletes the spare files — spares were never anyone's content —; with `closing`, for good
  /// (a refill under way deletes what it still makes), else new ones are made when needed.
  func discard(closing: Bool = true) {
    let spares = lock.withLock { () -> [(String, CryptoFile, UInt64)] in
      closed = true
      defer { files.removeAll() }
      return files
    }
    if !closing {
      // A refill under way stops (it sees `closed`); then takes may refill again.
      queue.sync {}
      lock.withLock { closed = false }
    }
    for (name, file, _) in spares {
      try? file.close()
      Glibc.unlink(directory + "/" + name)
    }
  }
}

extension Array {
  /// Inserts `element` after the last element for which `before` holds, looking from the end
  /// (in a list kept in order, `before` tells the elements that go before it: usually all).
  fileprivate mutating func insertSorted(_ element: Element, before: (Element) -> Bool) {
    var i = endIndex
    while i > startIndex, !before(self[i - 1]) { i -= 1 }
    insert(element, at: i)
  }
}
