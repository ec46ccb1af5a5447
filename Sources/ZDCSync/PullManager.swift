public import Foundation
import Logging
public import ZDCCatalog
public import ZDCCore
import ZDCCrypto

/// Tunables of the pull side.
public struct PullConfiguration: Sendable {
  /// RCRDs fetched at once.
  public var fetchConcurrency: Int
  /// Time between periodic pulls while started.
  public var pullInterval: TimeInterval
  /// A full scan runs when the last one is older than this (a periodic check).
  public var fullScanInterval: TimeInterval
  /// Change-log entries older than this are compacted.
  public var compactionAge: TimeInterval
  /// Node changes applied per transaction during a full scan.
  public var fullScanBatch: Int
  /// Incremental pulls read the change log again from this long before the newest entry read:
  /// a log object's ULID comes from its writer's clock and is taken before its put, so one can
  /// land after objects that sort after it were read (entries already applied are skipped).
  public var logLookback: TimeInterval

  public init(
    fetchConcurrency: Int = 8, pullInterval: TimeInterval = 30,
    fullScanInterval: TimeInterval = 24 * 3600, compactionAge: TimeInterval = 7 * 24 * 3600,
    fullScanBatch: Int = 256, logLookback: TimeInterval = 300
  ) {
    self.logLookback = logLookback
    self.fetchConcurrency = fetchConcurrency
    self.pullInterval = pullInterval
    self.fullScanInterval = fullScanInterval
    self.compactionAge = compactionAge
    self.fullScanBatch = fullScanBatch
  }
}

/// What one pull did.
public struct PullResult: Sendable, Hashable {
  /// True when the pull was a full scan (else it read the change log).
  public var fullScan = false
  /// Nodes discovered.
  public var newNodes = 0
  /// Nodes modified (attributes or data).
  public var modifiedNodes = 0
  /// Nodes moved or renamed.
  public var movedNodes = 0
  /// Nodes deleted (or, when dirty, kept and re-uploaded).
  public var deletedNodes = 0
  /// Remote objects skipped (undecodable, orphaned).
  public var skipped = 0
  /// RCRDs fetched.
  public var fetchedRcrds = 0
  /// Change-log objects read.
  public var logObjects = 0
  /// Change-log objects compacted.
  public var compacted = 0

  public init() {}
}

/// Discovers remote changes — from the change log, or by a full scan of the tree — and applies
/// them to the catalog, telling the delegate (DESIGN §4).
public final class PullManager: @unchecked Sendable {
  // Safe: `pullLock` serialises pulls; `cond` guards `stopped`/`timerWake`/`forceFull`.
  let context: SyncContext
  let config: PullConfiguration
  weak var push: PushManager?
  private let pullLock = NSLock()
  private let cond = NSCondition()
  private var stopped = true
  private var timerWake = false
  private var forceFull = false
  private var loopDone = DispatchSemaphore(value: 0)

  static let cursorKey = "pull.cursor"
  static let lastFullScanKey = "pull.lastFullScan"
  static let needsFullScanKey = "pull.needsFullScan"
  /// The change-log keys read within the lookback window before the cursor (JSON array).
  static let recentKey = "pull.recent"
  /// The RCRD keys the last full scan could not apply — listed below no directory it reached,
  /// or with no place here (parent unknown, or a loop with a move of this device's) — as a
  /// sorted JSON array; absent when none.
  static let notAppliedKey = "pull.notApplied"

  /// Whether the next pull is a full scan because a pull asked for one (one that could not
  /// place everything, or an operation waiting for a pull that did not settle it).
  public var fullScanDue: Bool {
    get throws {
      try context.catalog.read(context.userID) {
        try $0.syncValue(forKey: Self.needsFullScanKey) != nil
      }
    }
  }

  /// The keys a sync value holds as a JSON array (none when absent or unreadable).
  private static func keys(_ value: String?) -> [String] {
    value.flatMap { try? JSONDecoder().decode([String].self, from: Data($0.utf8)) } ?? []
  }

  /// The listing bound `logLookback` before a change-log key (nil: from the start).
  private func lookbackBound(before key: String) -> String? {
    guard let p = ChangeLogCodec.parse(key: key, layout: context.layout), let u = ULID(p.ulid)
    else { return nil }
    let ms = u.milliseconds
    let back = UInt64(max(0, config.logLookback * 1000))
    guard ms > back else { return nil }
    var zero = ZeroRandom()
    return context.layout.changesPrefix + ULID(milliseconds: ms - back, random: &zero).string
  }

  /// `keys` within the lookback window before `cursor`, as stored under `recentKey`.
  private func recentJSON(_ keys: some Sequence<String>, cursor: String) -> String? {
    let bound = lookbackBound(before: cursor) ?? ""
    let kept = keys.filter { $0 > bound }.sorted()
    guard !kept.isEmpty, let data = try? JSONEncoder().encode(kept) else { return nil }
    return String(decoding: data, as: UTF8.self)
  }

  /// A pull manager for one local user of `catalog`; with `push`, remote changes are applied
  /// while no push operation runs.
  public init(
    catalog: Catalog, store: any CloudStore, account: SyncAccount, delegate: any SyncDelegate,
    progress: ProgressTracker = ProgressTracker(), configuration: PullConfiguration = .init(),
    push: PushManager? = nil
  ) throws {
    context = try SyncContext(
      catalog: catalog, store: store, account: account, delegate: delegate, progress: progress,
      label: "pull")
    config = configuration
    self.push = push
  }

  /// Starts periodic pulls on the manager's own thread; throws when the system refuses a thread.
  public func start() throws {
    // The semaphore is handed to the thread, never read from the property outside the lock: a
    // later start replaces the property.
    let done = cond.withLock { () -> DispatchSemaphore? in
      guard stopped else { return nil }
      stopped = false
      loopDone = DispatchSemaphore(value: 0)
      return loopDone
    }
    guard let done else { return }
    do {
      try Threads.start(name: "zdc.pull") { [self] in
        loop()
        done.signal()
      }
    } catch {
      cond.withLock { stopped = true }
      throw error
    }
  }

  /// Stops periodic pulls (a pull in progress finishes first).
  public func stop() {
    let done = cond.withLock { () -> DispatchSemaphore? in
      guard !stopped else { return nil }
      stopped = true
      cond.broadcast()
      return loopDone
    }
    done?.wait()
  }

  /// Asks for a pull soon (on the manager's thread when started).
  public func pullSoon() {
    cond.withLock {
      timerWake = true
      cond.broadcast()
    }
  }

  private func loop() {
    while true {
      let stop = cond.withLock { () -> Bool in
        if !stopped && !timerWake {
          _ = cond.wait(until: Date().addingTimeInterval(config.pullInterval))
        }
        timerWake = false
        return stopped
      }
      if stop { break }
      do { _ = try pull() } catch {
        context.logger.warning("pull failed", metadata: ["error": "\(error)"])
        context.progress.update { $0.lastError = "pull: \(error)" }
      }
    }
  }

  /// Pulls now, blocking the caller until the catalog reflects the store (as of the pull's
  /// listing). A full scan runs when forced, at first, when the cursor is older than the
  /// compacted part of the log, or when the last one is older than `fullScanInterval`.
  @discardableResult
  public func pull(fullScan force: Bool = false) throws -> PullResult {
    pullLock.lock()
    defer { pullLock.unlock() }
    let body = { () throws -> PullResult in
      var result = try self.pullLocked(force: force)
      result.compacted = self.compact()
      return result
    }
    let result = try push.map { try $0.whileQuiesced(body) } ?? body()
    context.progress.update { $0.lastPull = Date() }
    return result
  }

  private func pullLocked(force: Bool) throws -> PullResult {
    let (cursor, lastFull, flagged) = try context.catalog.read(context.userID) { tx in
      (
        try tx.syncValue(forKey: Self.cursorKey),
        try tx.syncValue(forKey: Self.lastFullScanKey).flatMap(Double.init),
        try tx.syncValue(forKey: Self.needsFullScanKey) != nil
      )
    }
    var full = force || flagged || cursor == nil || cond.withLock({ forceFull })
    if let lastFull, Date().timeIntervalSince1970 - lastFull > config.fullScanInterval {
      full = true
    }
    if !full, let cursor, let marker = try compactionMarker() {
      let cursorULID = ChangeLogCodec.parse(key: cursor, layout: context.layout)?.ulid ?? ""
      if cursorULID <= marker { full = true }
    }
    if full {
      cond.withLock { forceFull = false }
      return try fullScan()
    }
    return try incremental(after: cursor!)
  }

  private func compactionMarker() throws -> String? {
    do {
      let data = try context.store.get(key: ChangeLogCodec.compactedMarkerKey(context.layout))
      let s = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
      return ULID(s)?.string
    } catch StoreError.notFound {
      return nil
    }
  }

  // MARK: Remote items

  /// One RCRD found in the store, with the DATA beside it.
  struct Item: Sendable {
    var parentDirPrefix: String
    var cloudName: String
    var rcrdKey: String
    var rcrdInfo: ObjectInfo
    var rcrd: DecodedRcrd
    var dataInfo: ObjectInfo?

    /// Where this item holds `node` in the store (a move's origin).
    func ref(of node: Node, layout: CloudLayout) -> CloudObjectRef {
      storePlace(
        of: node, rcrdKey: rcrdKey, dirPrefix: parentDirPrefix, cloudName: cloudName,
        rcrd: rcrdInfo, data: dataInfo, layout: layout)
    }
  }

  /// Where the store holds `node`: the RCRD `rcrd` at `rcrdKey` (in `dirPrefix`, named
  /// `cloudName`) and its DATA `data`, if any.
  static func storePlace(
    of node: Node, rcrdKey: String, dirPrefix: String, cloudName: String, rcrd: ObjectInfo,
    data: ObjectInfo?, layout: CloudLayout
  ) -> CloudObjectRef {
    CloudObjectRef(
      nodeID: node.id, cloudID: node.cloudID, dirPrefix: dirPrefix, cloudName: cloudName,
      rcrdKey: rcrdKey, dataKey: layout.dataKey(dirPrefix: dirPrefix, cloudName: cloudName),
      eTagRcrd: rcrd.eTag, eTagData: data?.eTag)
  }

  /// What fetching one RCRD gave.
  enum Fetched: Sendable {
    case item(Item)
    /// Present but undecodable (malformed, tampered, not ours): skipped, logged.
    case undecodable(String)
    /// Gone since it was listed or named.
    case missing(String)
    /// The store failed: the pull must not go on as if the object did not exist.
    case failed(String)
  }

  /// Fetches and decodes RCRDs in parallel.
  private func fetch(
    _ targets: [(rcrdKey: String, dataInfo: ObjectInfo?, headData: Bool)]
  ) -> [Fetched] {
    let ctx = context
    let layout = context.layout
    return parallelMap(targets, width: config.fetchConcurrency) { t -> Fetched in
      guard let parsed = layout.parse(key: t.rcrdKey), parsed.isRcrd else {
        return .undecodable(t.rcrdKey)
      }
      do {
        guard let r = try ctx.fetchRcrd(t.rcrdKey) else { return .missing(t.rcrdKey) }
        guard let decoded = r.decoded else { return .undecodable(t.rcrdKey) }
        var dataInfo = t.dataInfo
        if t.headData {
          dataInfo = try ctx.headIfExists(
            layout.dataKey(dirPrefix: parsed.dirPrefix, cloudName: parsed.cloudName))
        }
        return .item(
          Item(
            parentDirPrefix: parsed.dirPrefix, cloudName: parsed.cloudName, rcrdKey: t.rcrdKey,
            rcrdInfo: r.info, rcrd: decoded, dataInfo: dataInfo))
      } catch {
        ctx.logger.warning(
          "RCRD fetch failed", metadata: ["key": "\(t.rcrdKey)", "error": "\(error)"])
        return .failed("\(error)")
      }
    }
  }

  /// The items fetched; throws if any fetch failed (the pull is retried later, unapplied).
  private func items(_ fetched: [Fetched], result: inout PullResult) throws -> (
    items: [Item], undecodable: [String]
  ) {
    var items: [Item] = []
    var undecodable: [String] = []
    for f in fetched {
      switch f {
      case .item(let i): items.append(i)
      case .undecodable(let k):
        undecodable.append(k)
        result.skipped += 1
      case .missing: break
      case .failed(let e): throw StoreError.transient("RCRD fetch failed: \(e)")
      }
    }
    return (items, undecodable)
  }

  // MARK: Full scan

  /// Whether `rcrdKey` is where a move of the node that this device has outstanding wrote the
  /// node (a target of an earlier attempt, which the move settles itself).
  static func isOwnMoveWrite(_ rcrdKey: String, nodeID: NodeID, tx: CloudTransaction) throws
    -> Bool
  {
    try tx.pendingOperations(forNodeID: nodeID).contains {
      $0.kind == .move && ($0.payload.written ?? []).contains { $0.rcrdKey == rcrdKey }
    }
  }

  /// A full scan's listing of the tree: each RCRD key with the RCRD's and its DATA's
  /// object info.
  private typealias Listed = [String: (rcrd: ObjectInfo, data: ObjectInfo?)]

  private func fullScan() throws -> PullResult {
    var result = PullResult()
    result.fullScan = true
    let layout = context.layout
    let store = context.store
    // The cursor to resume from afterwards: the log as it was before the listing.
    let logKeys = try store.listAll(prefix: layout.changesPrefix).map(\.key).filter {
      ChangeLogCodec.parse(key: $0, layout: layout) != nil
    }
    let newCursor = logKeys.last
    let marker = ChangeLogCodec.compactedMarkerKey(layout)
    var byPrefix: [String: [String: (rcrd: ObjectInfo?, data: ObjectInfo?)]] = [:]
    for o in try store.listAll(prefix: layout.treePrefix) {
      if o.key.hasPrefix(layout.changesPrefix) || o.key == marker { continue }
      guard let p = layout.parse(key: o.key) else { continue }
      var slot = byPrefix[p.dirPrefix, default: [:]][p.cloudName] ?? (nil, nil)
      if p.isRcrd { slot.rcrd = o } else { slot.data = o }
      byPrefix[p.dirPrefix, default: [:]][p.cloudName] = slot
    }
    var listed: Listed = [:]
    for (prefix, slots) in byPrefix {
      for (cloudName, slot) in slots {
        guard let rcrd = slot.rcrd else { continue }
        let key = layout.rcrdKey(dirPrefix: prefix, cloudName: cloudName)
        listed[key] = (rcrd, slot.data)
      }
    }
    let (index, moves) = try context.catalog.read(context.userID) { tx in
      (
        try tx.syncIndex(),
        try tx.moveOperations().filter { $0.payload.origin != nil }
      )
    }
    var byKey: [String: SyncIndexEntry] = [:]
    // Where the store holds each node as far as this device knows: its keys, or for a node with
    // a move outstanding, the move's origin.
    var homeOf: [String: (key: String, eTag: String?)] = [:]
    for e in index {
      if let pdp = e.parentDirPrefix {
        let key = layout.rcrdKey(dirPrefix: pdp, cloudName: e.cloudName)
        byKey[key] = e
        if e.trunk == nil { homeOf[e.cloudID] = (key, e.eTagRcrd) }
      }
    }
    for m in moves {
      if let origin = m.payload.origin {
        homeOf[origin.cloudID] = (origin.rcrdKey, origin.eTagRcrd)
      }
    }
    let preferred = context.delegate.preferredNodeIDsForPulling()
    var seen = Set<String>()
    var rescan = false
    // An RCRD of a node not known there, listed and gone when fetched (see below).
    var vanished = false
    var level = index.filter { $0.trunk != nil }.sorted { $0.trunk! < $1.trunk! }.map(\.dirPrefix)
    var visitedPrefixes = Set(level)
    // RCRDs this scan could not apply: the scan is incomplete (see below).
    var notApplied: [String] = []
    // Known nodes with local changes whose RCRD the scan found below no directory it reached.
    var elsewhere = Set<String>()
    // Second RCRDs of known nodes, found while the one where this device knows them is listed
    // unchanged (see `settleDuplicates`).
    var duplicates: [Item] = []
    while !level.isEmpty {
      var candidates: [(key: String, rcrd: ObjectInfo, data: ObjectInfo?, preferred: Bool)] = []
      for dp in level {
        for (cloudName, slot) in byPrefix[dp] ?? [:] {
          guard let rcrd = slot.rcrd else { continue }
          let key = layout.rcrdKey(dirPrefix: dp, cloudName: cloudName)
          let pref = byKey[key].map { preferred.contains($0.id) } ?? false
          candidates.append((key, rcrd, slot.data, pref))
        }
      }
      candidates.sort {
        if $0.preferred != $1.preferred { return $0.preferred }
        return $0.rcrd.lastModified > $1.rcrd.lastModified
      }
      var next: [String] = []
      var toFetch: [(rcrdKey: String, dataInfo: ObjectInfo?, headData: Bool)] = []
      for c in candidates {
        // A DATA change beside a known RCRD is fetched with that RCRD and applied as an
        // incremental pull applies it: the node takes the size the RCRD describes. The node's
        // own size may not be that one — e.g. this device's RCRD upload found another device's
        // DATA beside it and was written again to describe it (randomized S3 seed 102).
        if let e = byKey[c.key], e.eTagRcrd == c.rcrd.eTag, e.eTagData == c.data?.eTag {
          seen.insert(e.cloudID)
          if visitedPrefixes.insert(e.dirPrefix).inserted { next.append(e.dirPrefix) }
        } else {
          toFetch.append((c.key, c.data, false))
        }
      }
      let raw = fetch(toFetch)
      let (fetched, undecodable) = try self.items(raw, result: &result)
      result.fetchedRcrds += toFetch.count
      // Listed, then gone when fetched: the listing is older than that change (e.g. a move
      // elsewhere released its origin, and its target was written after the listing). A node
      // known there is not taken for deleted by this scan; another one follows. An RCRD not
      // known here may have been any node's — one moved there elsewhere and moved on since
      // (its new place written after the listing) — and a directory's children are not
      // walked: this scan deletes nothing it did not see.
      for case .missing(let key) in raw {
        var known = byKey[key].map { [$0.cloudID] } ?? []
        known += homeOf.filter { $0.value.key == key }.map(\.key)
        rescan = true
        vanished = true
        seen.formUnion(known)
      }
      // A node still found, unchanged, where this device knows it is not moved to another RCRD
      // of it: that one is a move under way elsewhere (written before the move commits), which
      // its change-log entry announces once done.
      let items = fetched.filter { item in
        guard let home = homeOf[item.rcrd.cloudID], home.key != item.rcrdKey,
          let eTag = home.eTag, listed[home.key]?.rcrd.eTag == eTag
        else { return true }
        trace("left: still listed unchanged where this device knows it", item)
        if !item.rcrd.meta.moving && !item.rcrd.meta.arriving { duplicates.append(item) }
        return false
      }
      // A node whose RCRD cannot be read now is not taken for deleted.
      for key in undecodable {
        guard let e = byKey[key] else { continue }
        seen.insert(e.cloudID)
        if visitedPrefixes.insert(e.dirPrefix).inserted { next.append(e.dirPrefix) }
      }
      for item in items {
        seen.insert(item.rcrd.cloudID)
        if visitedPrefixes.insert(item.rcrd.dirPrefix).inserted { next.append(item.rcrd.dirPrefix) }
      }
      // Apply this level (parents are in: the previous level was applied).
      var i = 0
      while i < items.count {
        let batch = items[i..<min(items.count, i + config.fullScanBatch)]
        try context.catalog.write(context.userID) { tx in
          for item in batch {
            let skipped = result.skipped
            try self.apply(item, tx: tx, result: &result)
            // Not placed here (its parent unknown here, or it would close a loop with a move
            // of this device's that the store does not show yet): a later scan places it.
            if result.skipped > skipped { notApplied.append(item.rcrdKey) }
          }
        }
        i += config.fullScanBatch
      }
      level = next
    }
    try settleDuplicates(duplicates, homeOf: homeOf, listed: listed, result: &result)
    // RCRDs below no directory the walk reached (normally none): nodes in a loop that crossed
    // moves of two devices made, or below a directory being deleted. They are in the store:
    // not deleted. A node with a change other than a move outstanding here cannot be written
    // where this device knows it: a file or symlink whose change is staged (or that is empty)
    // is taken for deleted, kept, and uploaded again as a node of its own (see
    // `applyDeletions`); any other (a directory, or a file whose content is only cached) keeps
    // its change queued until a later scan reaches it and places it when it sits in or below a
    // loop (broken by this scan), and is taken for deleted and uploaded again under its old
    // cloudID otherwise (nothing is sure to place it). Uploaded again under its old cloudID it
    // is a second RCRD of one node, which two devices took each for where the node is, for
    // good (tools/fsx-sync seed 111; where it still happens, `settleDuplicates` ends it).
    let unreachedKeys = listed.keys.filter { key in
      layout.parse(key: key).map { !visitedPrefixes.contains($0.dirPrefix) } ?? false
    }
    if !unreachedKeys.isEmpty {
      let (found, _) = try self.items(
        fetch(unreachedKeys.sorted().map { ($0, nil, true) }), result: &result)
      result.fetchedRcrds += unreachedKeys.count
      // A loop among them is broken here (see `breakStoreLoops`). What such an RCRD holds is
      // not applied: a node not known here is not made, a known one not moved there nor
      // changed. The scan is incomplete until the moves that break the loop land (this
      // device's, queued now or by a pull that met the closing move, or another device's). So
      // another full scan follows while this device has operations queued or the unreached
      // part changed since the last scan, and an incremental pull that reads a change at one of
      // these keys asks for one. Before, a node this device deleted while another edited it
      // (kept by the delete, which asks for a full scan to bring it back) stayed missing here
      // when it sat in such a loop, and a new device never saw what the loop held
      // (tools/fsx-sync seeds 5, 15, 18, 26).
      let loops = StoreLoops(found)
      try context.catalog.write(context.userID) { tx in
        try breakStoreLoops(loops, tx: tx, result: &result)
        for item in found {
          guard let e = try tx.node(cloudID: item.rcrd.cloudID), e.trunk == nil else {
            seen.insert(item.rcrd.cloudID)
            if !item.rcrd.meta.moving && !item.rcrd.meta.arriving {
              trace("not applied: below no directory reached", item)
              notApplied.append(item.rcrdKey)
            }
            continue
          }
          let kinds = try tx.outstandingKinds(ofNodeID: e.id)
          if kinds.contains(.move) {
            // Its move starts from where it is found (as when it moved elsewhere too) — unless
            // what is found is this device's own write at a target of that move. Taken for the
            // node's place, it made the move settle there, in place, leaving the origin with
            // another device's edit of the node beside it: two RCRDs with DATA (tools/fsx-sync
            // seed 191: the move's first attempt met the edit at the origin, and the scan that
            // followed did not reach the target's directory).
            if try !Self.isOwnMoveWrite(item.rcrdKey, nodeID: e.id, tx: tx),
              try Self.storeLocation(of: e.id, tx: tx) != item.rcrdKey
            {
              try tx.setMoveOrigin(item.ref(of: e, layout: layout), forNodeID: e.id)
            }
          } else if !kinds.isEmpty {
            // Not applied here: a later scan places it once a walk reaches it.
            notApplied.append(item.rcrdKey)
            if e.kind != .directory, try tx.childCount(of: e.id) == 0,
              e.kind == .symlink || e.dataSize == 0 || kinds.contains(.putData)
            {
              // Taken for deleted below, kept and uploaded again as a node of its own.
              elsewhere.insert(item.rcrd.cloudID)
              trace("not applied: below no directory reached; kept here", item, node: e.id)
              continue
            }
            if !loops.holds(item) {
              if try e.kind != .file || tx.childCount(of: e.id) > 0 {
                // Below a directory no longer in the store: no scan will place it. Taken for
                // deleted and kept, as before (that RCRD is one no walk reaches).
                trace(
                  "not applied: below no directory in the store; kept here", item, node: e.id)
                continue
              }
              // A file whose change here is no content of its own (a mode, a time, an xattr).
              // Uploaded again under its cloudID, it was a second RCRD of one file, with DATA
              // at both places, which two devices each kept at another place (tools/fsx-sync
              // seed 176: another device moved it into a directory this device removed, while
              // this device changed its mode). With its content here in full, it goes up as a
              // node of its own; without, its change waits until a scan places it.
              if context.delegate.hasContent(for: e, at: try tx.path(of: e.id), transaction: tx) {
                elsewhere.insert(item.rcrd.cloudID)
                trace(
                  "not applied: below no directory in the store; kept here as a node of its own",
                  item, node: e.id)
                continue
              }
            }
            trace("not applied: below no directory reached; its change waits", item, node: e.id)
          } else if !item.rcrd.meta.moving && !item.rcrd.meta.arriving,
            try tx.objectLocation(of: e.id)?.rcrdKey != item.rcrdKey
              || e.eTagRcrd != item.rcrdInfo.eTag
          {
            trace("not applied: below no directory reached", item, node: e.id)
            notApplied.append(item.rcrdKey)
          }
          seen.insert(item.rcrd.cloudID)
        }
      }
    }
    notApplied.sort()
    let (before, queued) = try context.catalog.read(context.userID) { tx in
      (
        Self.keys(try tx.syncValue(forKey: Self.notAppliedKey)),
        try tx.operationCount()
      )
    }
    if !notApplied.isEmpty {
      let again = queued > 0 || notApplied != before
      context.logger.info(
        "full scan: remote nodes not applied; placed by a later scan",
        metadata: ["count": "\(notApplied.count)", "scanAgain": "\(again)"])
      if again { rescan = true }
    }
    // Nodes that were in the cloud and are no longer anywhere in it — unless an RCRD vanished
    // between the listing and its fetch (the node may have been there: the next scan decides).
    if !vanished {
      var gone = Set(
        index.filter { $0.trunk == nil && $0.eTagRcrd != nil && !seen.contains($0.cloudID) }
          .map(\.cloudID))
      // A node whose RCRD is still where this device knows it, unchanged, was not deleted (a
      // delete removes it, as the incremental pull also checks): the walk did not reach it,
      // because a directory above it moved while the listing ran, or sits in a loop that
      // crossed moves of two devices made (which the pull that meets the closing move breaks).
      // Taking it for deleted would upload what it holds again as new: two RCRDs of one node.
      let unreached = gone.filter { id in
        guard let home = homeOf[id], let eTag = home.eTag else { return false }
        return listed[home.key]?.rcrd.eTag == eTag
      }
      gone.subtract(unreached)
      if !unreached.isEmpty {
        context.logger.info(
          "full scan: nodes still in the store not reached from the top",
          metadata: ["count": "\(unreached.count)"])
      }
      if !gone.isEmpty || !unreached.isEmpty {
        // A listing is no snapshot: a node moved elsewhere while it ran, from a part not listed
        // yet to a part listed already, is in neither. Before taking unseen nodes for deleted,
        // the tree is listed again and what appeared or changed since is fetched: a node found
        // there has moved (the next scan applies it, and reaches what is below it).
        let moved = try movedDuringListing(listed, result: &result)
        if !gone.isDisjoint(with: moved) || (!unreached.isEmpty && !moved.isEmpty) {
          gone.subtract(moved)
          rescan = true
        }
      }
      try applyDeletions(
        Array(gone), listed: Set(listed.keys), foundElsewhere: elsewhere, result: &result)
    }
    if rescan { cond.withLock { forceFull = true } }
    try context.catalog.write(context.userID) { tx in
      try tx.setSyncValue(newCursor ?? "", forKey: Self.cursorKey)
      try tx.setSyncValue(
        newCursor.flatMap { recentJSON(logKeys, cursor: $0) }, forKey: Self.recentKey)
      try tx.setSyncValue("\(Date().timeIntervalSince1970)", forKey: Self.lastFullScanKey)
      try tx.setSyncValue(rescan ? "1" : nil, forKey: Self.needsFullScanKey)
      try tx.setSyncValue(
        notApplied.isEmpty
          ? nil : String(decoding: try JSONEncoder().encode(notApplied), as: UTF8.self),
        forKey: Self.notAppliedKey)
    }
    return result
  }

  /// The cloudIDs of the RCRDs a second listing of the tree finds that the first one
  /// (`listed`) did not have, or had with another eTag.
  private func movedDuringListing(_ listed: Listed, result: inout PullResult) throws
    -> Set<String>
  {
    let layout = context.layout
    let marker = ChangeLogCodec.compactedMarkerKey(layout)
    var fresh: [(rcrdKey: String, dataInfo: ObjectInfo?, headData: Bool)] = []
    for o in try context.store.listAll(prefix: layout.treePrefix) {
      if o.key.hasPrefix(layout.changesPrefix) || o.key == marker { continue }
      guard let p = layout.parse(key: o.key), p.isRcrd, listed[o.key]?.rcrd.eTag != o.eTag else {
        continue
      }
      fresh.append((o.key, nil, false))
    }
    let (found, _) = try items(fetch(fresh), result: &result)
    result.fetchedRcrds += fresh.count
    return Set(found.map(\.rcrd.cloudID))
  }

  // MARK: Incremental

  private func incremental(after cursor: String) throws -> PullResult {
    var result = PullResult()
    let layout = context.layout
    // From `logLookback` before the cursor, skipping what was read already.
    let (recent, notApplied) = try context.catalog.read(context.userID) { tx in
      (
        Self.keys(try tx.syncValue(forKey: Self.recentKey)),
        Set(Self.keys(try tx.syncValue(forKey: Self.notAppliedKey)))
      )
    }
    let read = Set(recent).union(cursor.isEmpty ? [] : [cursor])
    let bound = cursor.isEmpty ? nil : (lookbackBound(before: cursor) ?? "")
    let logObjects = try context.store.listAll(
      prefix: layout.changesPrefix, startAfter: bound.flatMap { $0.isEmpty ? nil : $0 }
    ).filter {
      ChangeLogCodec.parse(key: $0.key, layout: layout) != nil && !read.contains($0.key)
        && (cursor.isEmpty || $0.key > cursor || bound != nil)
    }
    guard let newest = logObjects.last else { return result }
    let newCursor = max(cursor, newest.key)
    let recentAfter = recentJSON(read.union(logObjects.map(\.key)), cursor: newCursor)
    let mine = context.account.deviceID
    let others = logObjects.filter {
      ChangeLogCodec.parse(key: $0.key, layout: layout)!.deviceID != mine
    }
    result.logObjects = others.count
    let ctx = context
    let decoded = parallelMap(others.map(\.key), width: config.fetchConcurrency) {
      key -> [ChangeLogEntry]? in
      let name = String(key.dropFirst(layout.changesPrefix.count))
      do {
        let data = try ctx.store.get(key: key)
        return try ChangeLogCodec.decode(data, name: name, key: ctx.changeLogKey)
      } catch StoreError.notFound {
        return []  // compacted meanwhile
      } catch let e as StoreError {
        ctx.logger.warning("change-log read failed", metadata: ["key": "\(key)", "error": "\(e)"])
        return nil
      } catch {
        ctx.logger.error(
          "undecodable change-log object skipped", metadata: ["key": "\(key)", "error": "\(error)"])
        return []
      }
    }
    if decoded.contains(where: { $0 == nil }) {
      throw StoreError.transient("change log could not be read completely")
    }
    let entries = decoded.compactMap { $0 }.flatMap { $0 }
    // A change at a key the last full scan could not apply (e.g. a loop being broken
    // elsewhere): what is below it comes with a full scan.
    let touchesNotApplied = entries.contains {
      notApplied.contains($0.rcrd) || $0.fromRcrd.map(notApplied.contains) == true
    }
    for (key, list) in zip(others.map(\.key), decoded) where context.logger.logLevel <= .debug {
      for e in list ?? [] {
        context.logger.debug(
          "pull: change-log entry",
          metadata: [
            "log": "\(key.suffix(40))", "kind": "\(e.kind)", "cloudID": "\(e.cloudID)",
            "key": "\(e.rcrd)",
          ])
      }
    }
    var rcrdKeys: [String] = []
    var seenKeys = Set<String>()
    var deleted: [String] = []
    for e in entries {
      switch e.kind {
      case .put, .move:
        if seenKeys.insert(e.rcrd).inserted { rcrdKeys.append(e.rcrd) }
      case .delete:
        deleted.append(e.cloudID)
      }
    }
    let (items, _) = try self.items(fetch(rcrdKeys.map { ($0, nil, true) }), result: &result)
    result.fetchedRcrds = rcrdKeys.count
    let present = Set(items.map(\.rcrd.cloudID))
    // A deleted node is gone if its RCRD is no longer where this device knows it (for a node
    // with a move outstanding: the move's origin, or the target it was committed to) nor at a
    // target its move wrote: the deleting device may have found nothing where it knew the
    // node (this device's move took it elsewhere meanwhile), and this device's own knowledge
    // of the origin may be older than its move's progress. A node left here by mistake is
    // found missing by a full scan (which an operation waiting for a pull asks for).
    var gone: [String] = []
    for cloudID in Set(deleted) where !present.contains(cloudID) {
      let keys = try context.catalog.read(context.userID) { tx -> [String] in
        guard let n = try tx.node(cloudID: cloudID) else { return [] }
        var keys = try Self.storeLocation(of: n.id, tx: tx).map { [$0] } ?? []
        for move in try tx.pendingOperations(forNodeID: n.id) where move.kind == .move {
          for ref in move.payload.written ?? [] where !keys.contains(ref.rcrdKey) {
            keys.append(ref.rcrdKey)
          }
        }
        return keys
      }
      guard !keys.isEmpty else { continue }
      var found = false
      for key in keys where !found {
        if let r = try context.fetchRcrd(key), r.decoded == nil || r.decoded?.cloudID == cloudID {
          found = true
        }
      }
      if !found { gone.append(cloudID) }
    }
    try applyDeletions(gone, result: &result)
    // Parents first: apply what has a known parent, until nothing more can be applied. A move
    // into what is here still below the node waits too: another move of the batch may take
    // that out first (a directory taken out of another, which then moves into it).
    var pending = items
    // Of the last pass, the items whose parent is known that would close a loop.
    var loops: [Item] = []
    var progress = true
    while !pending.isEmpty && progress {
      progress = false
      loops = []
      var rest: [Item] = []
      for item in pending {
        let (hasParent, closesLoop) = try context.catalog.read(context.userID) { tx in
          try tx.node(dirPrefix: item.parentDirPrefix) == nil
            ? (try self.isOriginOfOwnMove(item, tx: tx), false)
            : (true, self.loopClosed(by: item, tx: tx) != nil)
        }
        if !hasParent || closesLoop {
          rest.append(item)
          if closesLoop { loops.append(item) }
          continue
        }
        progress = true
        try context.catalog.write(context.userID) { tx in
          try self.apply(item, tx: tx, result: &result)
        }
      }
      pending = rest
    }
    // What is left that has its parent would close a loop: moves of two devices that crossed.
    let looping = Set(loops.map(\.rcrdKey))
    pending.removeAll { looping.contains($0.rcrdKey) }
    for item in loops {
      try context.catalog.write(context.userID) { tx in
        try self.breakLoop(closedBy: item, tx: tx, result: &result)
        try self.apply(item, tx: tx, result: &result)
      }
    }
    if !pending.isEmpty {
      context.logger.error(
        "remote nodes without a known parent skipped", metadata: ["count": "\(pending.count)"])
      result.skipped += pending.count
    }
    try context.catalog.write(context.userID) { tx in
      try tx.setSyncValue(newCursor, forKey: Self.cursorKey)
      try tx.setSyncValue(recentAfter, forKey: Self.recentKey)
      if !pending.isEmpty || touchesNotApplied {
        try tx.setSyncValue("1", forKey: Self.needsFullScanKey)
      }
    }
    return result
  }

  /// The RCRD key where the store holds a node as far as this device knows: for a node with a
  /// move outstanding, the move's origin (or, once the move released the origin, its target);
  /// otherwise the node's own keys.
  static func storeLocation(of id: NodeID, tx: CloudTransaction) throws -> String? {
    let loc = try tx.objectLocation(of: id)
    guard let move = try tx.pendingOperations(forNodeID: id).first(where: { $0.kind == .move }),
      let origin = move.payload.origin
    else { return loc?.rcrdKey }
    if let raw = move.multipartState,
      let state = try? JSONDecoder().decode(MoveState.self, from: raw),
      state.origin == origin.rcrdKey, state.releasing, let committed = state.committedRcrd
    {
      return committed
    }
    return origin.rcrdKey
  }

  // MARK: Applying

  /// A debug line about what the pull did with a remote RCRD (opaque keys only).
  private func trace(_ what: @autoclosure () -> String, _ item: Item, node: NodeID? = nil) {
    context.logger.debug(
      "pull: \(what())",
      metadata: [
        "cloudID": "\(item.rcrd.cloudID)", "key": "\(item.rcrdKey)",
        "eTag": "\(item.rcrdInfo.eTag)", "node": "\(node.map { "\($0)" } ?? "-")",
      ])
  }

  /// Whether `item` is where this device's outstanding move of its node starts (see `apply`).
  private func isOriginOfOwnMove(_ item: Item, tx: CloudTransaction) throws -> Bool {
    guard let e = try tx.node(cloudID: item.rcrd.cloudID), e.trunk == nil else { return false }
    return try tx.outstandingKinds(ofNodeID: e.id).contains(.move)
      && Self.storeLocation(of: e.id, tx: tx) == item.rcrdKey
  }

  /// Applies one remote node (new, modified, moved) in `tx`, telling the delegate.
  func apply(_ item: Item, tx: CloudTransaction, result: inout PullResult) throws {
    let dl = context.delegate
    // Without its parent here, only a change at the origin of a move this device has
    // outstanding applies (the move starts from it): a node moved out of a directory deleted
    // here since, edited meanwhile by another device. Before, nothing refreshed the eTags
    // that move claims the origin with, and it waited for the claim lease (5 minutes;
    // tools/fsx-sync seed 34).
    let knownParent = try tx.node(dirPrefix: item.parentDirPrefix)
    if knownParent == nil, try !isOriginOfOwnMove(item, tx: tx) {
      trace("skipped: parent not known", item)
      result.skipped += 1
      return
    }
    let r = item.rcrd
    let meta = r.meta
    guard !meta.name.isEmpty else {
      result.skipped += 1
      return
    }
    // A move's claim (the node is about to leave this place) or a move's target before it
    // commits (the node may never come here): the move's log entry tells where the node went.
    if meta.moving || meta.arriving {
      trace("left: a move's claim or target", item)
      return
    }
    if let e = try tx.node(cloudID: r.cloudID) {
      guard e.trunk == nil, let curLoc = try tx.objectLocation(of: e.id) else { return }
      let sameLocation = curLoc.rcrdKey == item.rcrdKey
      if sameLocation && e.eTagRcrd == item.rcrdInfo.eTag && e.eTagData == item.dataInfo?.eTag {
        return
      }
      let kinds = try tx.outstandingKinds(ofNodeID: e.id)
      let oldPath = try tx.path(of: e.id)
      var n = e
      var change: NodeChange = []
      var moved = false
      var cloudName = try tx.cloudName(of: e.id)
      if kinds.contains(.move), try Self.isOwnMoveWrite(item.rcrdKey, nodeID: e.id, tx: tx) {
        // This device's own write at a target of its move (an earlier attempt, which the move
        // settles itself): not the node as another device left it.
        trace("left: this device's move wrote it", item)
        return
      }
      if !sameLocation {
        if kinds.contains(.move) {
          // Moved here and there: this device's move wins, starting from where the node is now.
          trace("moved here and there: this device's move starts from there", item)
          try tx.setMoveOrigin(item.ref(of: e, layout: context.layout), forNodeID: e.id)
        } else {
          guard let parent = knownParent else { return }
          if try ancestors(from: parent, upTo: e.id, tx: tx) != nil {
            trace("skipped: the move would close a loop", item)
            result.skipped += 1
            return
          }
          try makeRoom(for: meta.name, in: parent, except: e.id, tx: tx, result: &result)
          n.parentID = parent.id
          n.name = meta.name
          cloudName = item.cloudName
          moved = true
          if parent.id != e.parentID { change.insert(.parent) }
          if Array(meta.name.utf8) != Array(e.name.utf8) { change.insert(.name) }
        }
      } else if Array(meta.name.utf8) != Array(e.name.utf8), !kinds.contains(.putRcrd),
        !kinds.contains(.move)
      {
        n.name = meta.name
        change.insert(.name)
      }
      if !kinds.contains(.putRcrd) {
        if n.mode != meta.mode || n.mtime != meta.mtime || n.xattrs != meta.xattrs
          || n.symlinkTarget != meta.symlinkTarget
        {
          change.insert(.attributes)
        }
        n.mode = meta.mode
        n.mtime = meta.mtime
        n.xattrs = meta.xattrs
        n.symlinkTarget = meta.symlinkTarget
        let hasChildren = try tx.childCount(of: e.id) > 0
        let kind: NodeKind =
          (meta.kind == .file && e.kind == .directory && hasChildren) ? .directory : meta.kind
        if kind != n.kind {
          change.insert(.kind)
          n.kind = kind
        }
        if n.shareList.userIDs != r.shareList.userIDs { change.insert(.permissions) }
        if n.burnDate != r.burnDate { change.insert(.burnDate) }
        n.burnDate = r.burnDate
        // The size belongs to the DATA: with a local DATA upload outstanding, that upload's
        // (the local content is not the remote version the RCRD describes).
        if !kinds.contains(.putData) {
          if n.dataSize != meta.dataSize { change.insert(.data) }
          n.dataSize = meta.dataSize
        }
      }
      n.eTagRcrd = item.rcrdInfo.eTag
      n.lastModifiedRcrd = item.rcrdInfo.lastModified
      if item.dataInfo?.eTag != e.eTagData, !kinds.contains(.putData) {
        n.eTagData = item.dataInfo?.eTag
        n.lastModifiedData = item.dataInfo?.lastModified
        n.cloudDataInfo = nil
        // The size belongs to the DATA, not to the local attributes an RCRD upload keeps.
        n.dataSize = meta.dataSize
        change.insert(.data)
      }
      try tx.applyRemoteNode(n, cloudName: cloudName)
      trace(moved ? "applied: moved" : "applied: changed", item, node: e.id)
      let newPath = try tx.path(of: e.id)
      if moved {
        dl.didDiscoverMovedNode(n, from: oldPath, to: newPath, transaction: tx)
        result.movedNodes += 1
        if kinds.contains(.putData) || kinds.contains(.putRcrd) {
          dl.didDiscoverConflict(
            .movedWhileEdited, node: n, other: nil, at: newPath, transaction: tx)
        }
      }
      // Renamed in place (a spelling that differs only in case): the mount forgets the old one.
      if !moved, change.contains(.name) {
        dl.didRenameNode(n, oldName: e.name, transaction: tx)
      }
      let rest = change.subtracting([.parent, .name])
      if !rest.isEmpty || (!moved && !change.isEmpty) {
        dl.didDiscoverModifiedNode(n, change: moved ? rest : change, at: newPath, transaction: tx)
        result.modifiedNodes += 1
      }
      if change.contains(.name) || change.contains(.parent) {
        try settleCaseVariantClash(at: n, tx: tx)
      }
      return
    }
    // A new node — unless this device is deleting it here: its delete decides. It removes the
    // RCRD found here if unchanged, or keeps the node for a remote change (its RCRD or DATA)
    // and asks for a full scan, which brings it back. An RCRD that differs from the one the
    // delete knows is not proof of a remote change: it may be this device's own upload, in
    // flight when the node was deleted, whose answer was lost — the delete learns its eTag
    // when it runs again, and removes it (brought back here, the node would then stay without
    // any RCRD in the store).
    // (Read in this transaction: the node may have been deleted here since the pull began.)
    for op in try tx.deleteOperations(referencing: r.cloudID) {
      if (op.payload.objects ?? []).contains(where: {
        $0.cloudID == r.cloudID && $0.rcrdKey == item.rcrdKey
      }) {
        trace("left: deleted here", item)
        return
      }
    }
    guard let parent = knownParent else { return }
    try makeRoom(for: meta.name, in: parent, except: nil, tx: tx, result: &result)
    if parent.kind == .file {
      var p = parent
      p.kind = .directory
      try tx.applyRemoteNode(p, cloudName: try tx.cloudName(of: p.id))
      dl.didDiscoverModifiedNode(p, change: .kind, at: try tx.path(of: p.id), transaction: tx)
    }
    let node = Node(
      uuid: "", localUserID: context.userID, parentID: parent.id, name: meta.name,
      kind: meta.kind == .trunk ? .directory : meta.kind, shareList: r.shareList,
      burnDate: r.burnDate, encryptionKey: r.nodeKey, dirSalt: meta.dirSalt, dirPrefix: r.dirPrefix,
      cloudID: r.cloudID, eTagRcrd: item.rcrdInfo.eTag, eTagData: item.dataInfo?.eTag,
      lastModifiedRcrd: item.rcrdInfo.lastModified, lastModifiedData: item.dataInfo?.lastModified,
      mode: meta.mode, mtime: meta.mtime, xattrs: meta.xattrs, symlinkTarget: meta.symlinkTarget,
      dataSize: meta.dataSize)
    let stored = try tx.insertRemoteNode(node, cloudName: item.cloudName)
    trace("applied: new", item, node: stored.id)
    dl.didDiscoverNewNode(stored, at: try tx.path(of: stored.id), transaction: tx)
    result.newNodes += 1
    try settleCaseVariantClash(at: stored, tx: tx)
  }

  /// A name and the case variant of that same name (see `CaseVariant`) may not stay siblings:
  /// the mount could show both only by escaping the variant, and would show it under another
  /// name once the plain one went. They meet when one device kept its spelling as a variant of
  /// another's, which a third change renamed to exactly that spelling. The variant takes a
  /// numbered name, as in a path conflict, and its move is pushed; every device that meets the
  /// pair first renames the same node to the same name, so their moves agree.
  private func settleCaseVariantClash(at placed: Node, tx: CloudTransaction) throws {
    guard let parentID = placed.parentID else { return }
    func exactChild(_ name: String) throws -> Node? {
      guard let c = try tx.child(of: parentID, named: name), Array(c.name.utf8) == Array(name.utf8)
      else { return nil }
      return c
    }
    let base: String
    let variant: Node
    if let b = CaseVariant.base(of: placed.name) {
      guard try exactChild(b) != nil else { return }
      (base, variant) = (b, placed)
    } else {
      guard let v = try exactChild(CaseVariant.name(for: placed.name)) else { return }
      (base, variant) = (placed.name, v)
    }
    guard variant.trunk == nil else { return }
    let renamed = try tx.moveNode(
      variant.id, toParent: parentID, name: try tx.freeChildName(base, in: parentID))
    let dl = context.delegate
    dl.didRenameNode(renamed, oldName: variant.name, transaction: tx)
    dl.didDiscoverConflict(
      .path, node: renamed, other: nil, at: try tx.path(of: renamed.id), transaction: tx)
    context.logger.info(
      "a name beside its own case variant: the variant renamed",
      metadata: ["node": "\(renamed.id)"])
  }

  /// The nodes a remote move would close into a loop here — the moved node, then its new
  /// parent and that parent's ancestors up to it — or nil when applying it makes no loop.
  private func loopClosed(by item: Item, tx: CloudTransaction) throws -> [Node]? {
    let meta = item.rcrd.meta
    guard !meta.moving, !meta.arriving, let e = try tx.node(cloudID: item.rcrd.cloudID),
      e.trunk == nil, let parent = try tx.node(dirPrefix: item.parentDirPrefix),
      let loc = try tx.objectLocation(of: e.id), loc.rcrdKey != item.rcrdKey,
      !(try tx.outstandingKinds(ofNodeID: e.id).contains(.move))
    else { return nil }
    return try ancestors(from: parent, upTo: e.id, tx: tx).map { [e] + $0 }
  }

  /// `start` and its ancestors below `stop`, when `stop` is `start` or one of its ancestors;
  /// otherwise nil.
  private func ancestors(from start: Node, upTo stop: NodeID, tx: CloudTransaction) throws
    -> [Node]?
  {
    var chain: [Node] = []
    var cur: Node? = start
    while let c = cur, chain.count < 100_000 {
      if c.id == stop { return chain }
      chain.append(c)
      cur = try c.parentID.flatMap { try tx.node(id: $0) }
    }
    return nil
  }

  /// Breaks the loop a remote move would close (two devices moved directories into each
  /// other): of the nodes in it, the one with the smallest cloudID — the same on every device
  /// that meets the loop — moves to the top of the home tree, and its move is pushed.
  private func breakLoop(closedBy item: Item, tx: CloudTransaction, result: inout PullResult)
    throws
  {
    guard let chain = try loopClosed(by: item, tx: tx), let home = try tx.trunkNode(.home) else {
      return
    }
    let loser = chain.filter { !$0.cloudID.isEmpty }.min { $0.cloudID < $1.cloudID } ?? chain[0]
    context.logger.info(
      "crossed moves: a directory goes to the top of the tree",
      metadata: ["node": "\(loser.id)", "closing": "\(chain[0].id)"])
    _ = try moveToTop(loser, home: home, tx: tx, result: &result)
  }

  /// Moves the node that breaks a loop to the top of the home tree (its own name, or `name 2`
  /// if taken), telling the delegate (a crossed-moves conflict); returns it as moved.
  private func moveToTop(_ node: Node, home: Node, tx: CloudTransaction, result: inout PullResult)
    throws -> Node
  {
    let oldPath = try tx.path(of: node.id)
    let name = try tx.freeChildName(node.name, in: home.id, except: node.id)
    let moved = try tx.moveNode(node.id, toParent: home.id, name: name)
    let newPath = try tx.path(of: node.id)
    context.delegate.didDiscoverMovedNode(moved, from: oldPath, to: newPath, transaction: tx)
    context.delegate.didDiscoverConflict(
      .crossedMoves, node: moved, other: nil, at: newPath, transaction: tx)
    result.movedNodes += 1
    return moved
  }

  /// Breaks the loops that the RCRDs a full scan could not reach from the top form in the store
  /// (two devices' moves that crossed, met by no pull that breaks them as it applies the
  /// closing move — e.g. each device read the other's move in a full scan): as there, the node
  /// of each loop with the smallest cloudID goes to the top of the home tree, here and, by a
  /// move from where the store has it, in the store. Every device that finds the loop picks the
  /// same node; a node not known here is left to a device that knows it.
  private func breakStoreLoops(_ loops: StoreLoops, tx: CloudTransaction, result: inout PullResult)
    throws
  {
    guard !loops.losers.isEmpty, let home = try tx.trunkNode(.home) else { return }
    for item in loops.losers {
      guard var n = try tx.node(cloudID: item.rcrd.cloudID), n.trunk == nil else { continue }
      trace("loop in the store: its node goes to the top", item, node: n.id)
      if n.parentID != home.id { n = try moveToTop(n, home: home, tx: tx, result: &result) }
      try tx.moveFromStoreLocation(item.ref(of: n, layout: context.layout), forNodeID: n.id)
      context.logger.info(
        "crossed moves in the store: a directory goes to the top of the tree",
        metadata: ["node": "\(n.id)"])
    }
  }

  /// Settles nodes that the store holds at two places (an RCRD where this device knows the node,
  /// listed unchanged, and `duplicates`' other one, neither marked by a move): a move writes its
  /// target marked `arriving` and deletes its origin before it unmarks the target, so two
  /// unmarked RCRDs of one node are no move under way but a node uploaded again where a device
  /// kept it (e.g. one that a full scan found below a directory briefly missing from the store,
  /// and took for deleted while it had local changes). The "still listed unchanged" rule keeps
  /// every device where it knows the node, so two devices that knew it at different places
  /// stayed apart for good (tools/fsx-sync seed 138). Every device picks the same place, the
  /// RCRD written last (the greater key on a tie): a device that knows the node at the other
  /// place applies it there, and a move from the other place to it is queued, which deletes
  /// the other RCRD and tells the other devices by its change-log entry. A node with
  /// operations outstanding here is left to a later scan, as is a place holding DATA (it is
  /// not carried over the chosen place's).
  private func settleDuplicates(
    _ duplicates: [Item], homeOf: [String: (key: String, eTag: String?)],
    listed: Listed, result: inout PullResult
  ) throws {
    guard !duplicates.isEmpty else { return }
    let layout = context.layout
    try context.catalog.write(context.userID) { tx in
      for item in duplicates {
        guard let home = homeOf[item.rcrd.cloudID], let known = listed[home.key],
          let parsed = layout.parse(key: home.key),
          let n = try tx.node(cloudID: item.rcrd.cloudID), n.trunk == nil,
          try tx.outstandingKinds(ofNodeID: n.id).isEmpty
        else { continue }
        let foundWins =
          (item.rcrdInfo.lastModified, item.rcrdKey) > (known.rcrd.lastModified, home.key)
        let other =
          foundWins
          ? Self.storePlace(
            of: n, rcrdKey: home.key, dirPrefix: parsed.dirPrefix, cloudName: parsed.cloudName,
            rcrd: known.rcrd, data: known.data, layout: layout)
          : item.ref(of: n, layout: layout)
        guard other.eTagData == nil else {
          trace("left: a second RCRD of the node, with DATA", item, node: n.id)
          continue
        }
        if foundWins {
          try apply(item, tx: tx, result: &result)
          guard try tx.objectLocation(of: n.id)?.rcrdKey == item.rcrdKey else { continue }
        }
        trace("two RCRDs of the node: the other goes", item, node: n.id)
        try tx.moveFromStoreLocation(other, forNodeID: n.id)
        context.logger.info(
          "a node at two places in the store: the RCRD written last stays",
          metadata: ["node": "\(n.id)"])
      }
    }
  }

  /// The loops that RCRDs a full scan could not reach from the top form in the store (RCRDs
  /// of moves under way left out): the node each loop is broken at (its smallest cloudID), and
  /// which RCRDs sit in or below a loop (the others sit below a directory the store no longer
  /// holds).
  struct StoreLoops {
    /// The placed RCRDs by the dirPrefix of their node.
    let byDirPrefix: [String: Item]
    /// For each loop, its RCRD with the smallest cloudID.
    let losers: [Item]
    /// The cloudIDs of the placed RCRDs in or below a loop.
    let inOrBelow: Set<String>

    init(_ found: [Item]) {
      let placed = found.filter { !$0.rcrd.meta.moving && !$0.rcrd.meta.arriving }
      var byDirPrefix: [String: Item] = [:]
      for item in placed { byDirPrefix[item.rcrd.dirPrefix] = item }
      var done = Set<String>()
      var losers: [Item] = []
      var inOrBelow = Set<String>()
      for start in placed where !done.contains(start.rcrd.cloudID) {
        var path: [Item] = []
        var onPath = Set<String>()
        var cur: Item? = start
        while let c = cur, !done.contains(c.rcrd.cloudID), !onPath.contains(c.rcrd.cloudID) {
          path.append(c)
          onPath.insert(c.rcrd.cloudID)
          cur = byDirPrefix[c.parentDirPrefix]
        }
        if let c = cur, onPath.contains(c.rcrd.cloudID),
          let first = path.firstIndex(where: { $0.rcrd.cloudID == c.rcrd.cloudID }),
          let loser = path[first...].min(by: { $0.rcrd.cloudID < $1.rcrd.cloudID })
        {
          losers.append(loser)
          inOrBelow.formUnion(onPath)
        } else if let c = cur, inOrBelow.contains(c.rcrd.cloudID) {
          inOrBelow.formUnion(onPath)
        }
        done.formUnion(onPath)
      }
      self.byDirPrefix = byDirPrefix
      self.losers = losers
      self.inOrBelow = inOrBelow
    }

    /// Whether `item` (placed or not) sits in or below a loop.
    func holds(_ item: Item) -> Bool {
      inOrBelow.contains(item.rcrd.cloudID)
        || byDirPrefix[item.parentDirPrefix].map { inOrBelow.contains($0.rcrd.cloudID) } == true
    }
  }

  /// Frees `name` in `parent` for a remote node: a local node there that never reached the
  /// store loses the name (path conflict); one whose object was replaced is set aside.
  private func makeRoom(
    for name: String, in parent: Node, except: NodeID?, tx: CloudTransaction,
    result: inout PullResult
  ) throws {
    guard let c = try tx.child(of: parent.id, named: name), c.id != except else { return }
    if c.eTagRcrd == nil, Array(c.name.utf8) != Array(name.utf8), !c.name.utf8.contains(0) {
      // A never-uploaded node whose name differs from the remote one's only in case: like the
      // mount, keep both, this one as its case variant (see `CaseVariant`) — not a conflict.
      let variant = CaseVariant.name(for: c.name)
      if try tx.child(of: parent.id, named: variant) == nil {
        let renamed = try tx.moveNode(c.id, toParent: parent.id, name: variant)
        context.delegate.didRenameNode(renamed, oldName: c.name, transaction: tx)
        return
      }
    }
    let free = try tx.freeChildName(c.name, in: parent.id)
    if c.eTagRcrd == nil {
      let renamed = try tx.moveNode(c.id, toParent: parent.id, name: free)
      context.delegate.didRenameNode(renamed, oldName: c.name, transaction: tx)
      context.delegate.didDiscoverConflict(
        .path, node: renamed, other: nil, at: try tx.path(of: c.id), transaction: tx)
      return
    }
    let dirty = try tx.dirtyNodes(inSubtreeOf: c.id)
    let renamed = try tx.renameWithoutMove(c.id, to: free)
    context.delegate.didRenameNode(renamed, oldName: c.name, transaction: tx)
    // Its object was replaced: it moved or was deleted elsewhere; a full scan will tell (it
    // applies the move, or the delete — which keeps a node with local changes). Taking it for
    // deleted here would upload a node with local changes again as new while it may only have
    // moved (its target not announced yet): two RCRDs of one node.
    try tx.setSyncValue("1", forKey: Self.needsFullScanKey)
    cond.withLock { forceFull = true }
    if !dirty.isEmpty {
      context.delegate.didDiscoverConflict(
        .path, node: renamed, other: nil, at: try tx.path(of: c.id), transaction: tx)
    }
  }

  /// A subtree deleted remotely holds local changes: keeps the dirty nodes and the nodes that
  /// hold them, deletes the other (clean) ones, and re-uploads what is kept as new (except the
  /// DATA found still at its keys, `existingData`).
  private func keepDirty(
    _ root: NodeID, dirty: [NodeID], existingData: [NodeID: CloudDataInfo] = [:],
    movingIn: [NodeID] = [], tx: CloudTransaction
  ) throws {
    var keep = Set<NodeID>()
    for d in dirty + movingIn {
      var cur: NodeID? = d
      while let c = cur, keep.insert(c).inserted, c != root { cur = try tx.node(id: c)?.parentID }
    }
    // A node moving in keeps its cloud state, its move, and what is below it.
    var leaving = Set<NodeID>()
    for m in movingIn { leaving.formUnion(try tx.subtreeIDs(of: m)) }
    for id in try tx.subtreeIDs(of: root).reversed()
    where !keep.contains(id) && !leaving.contains(id) {
      guard let n = try tx.node(id: id), let parentID = n.parentID, keep.contains(parentID) else {
        continue
      }
      var doomed: [(Node, TreesystemPath)] = []
      for sid in try tx.subtreeIDs(of: id).reversed() {
        if let d = try tx.node(id: sid) { doomed.append((d, try tx.path(of: sid))) }
      }
      try tx.deleteRemoteSubtree(id)
      for (d, p) in doomed {
        context.delegate.didDiscoverDeletedNode(d, at: p, timestamp: nil, transaction: tx)
      }
    }
    var before: [NodeID: String?] = [:]
    for id in existingData.keys {
      if let n = try tx.node(id: id) { before[id] = n.eTagData }
    }
    // A kept file whose DATA this device never knew (none was in the store when it pulled the
    // node) and has no upload of has its content uploaded too — whatever the delegate has, if
    // only nothing: its RCRD alone would describe a size no DATA has.
    var withoutData: [NodeID] = []
    for id in keep where existingData[id] == nil && !leaving.contains(id) {
      guard let n = try tx.node(id: id), n.kind == .file, n.eTagData == nil, n.dataSize > 0,
        try !tx.outstandingKinds(ofNodeID: id).contains(.putData)
      else { continue }
      withoutData.append(id)
    }
    try tx.reuploadSubtree(root, existingData: existingData, leaving: leaving)
    for id in withoutData where try tx.node(id: id) != nil {
      try tx.queueDataUpload(nodeID: id)
    }
    // A node that keeps DATA found at its keys now stands for that version.
    for (id, old) in before {
      guard let n = try tx.node(id: id), n.eTagData != nil, n.eTagData != old else { continue }
      context.delegate.didDiscoverModifiedNode(
        n, change: .data, at: try tx.path(of: id), transaction: tx)
    }
  }

  /// The DATA at `key` with its sizes (read from its header), or nil when there is none or it
  /// cannot be read as a CloudFile of the node.
  private func existingDataInfo(key: String, nodeKey: Data) throws -> CloudDataInfo? {
    guard let info = try context.headIfExists(key) else { return nil }
    let result: Result<CloudFileSizes, any Error>
    do {
      result = try context.store.cloudFileSizes(
        key: key, nodeKey: nodeKey, ciphertextSize: info.size)
    } catch StoreError.notFound {
      return nil
    }
    switch result {
    case .success(let sizes):
      return CloudDataInfo(sizes, eTag: info.eTag, lastModified: info.lastModified)
    case .failure(let error):
      context.logger.error(
        "DATA kept by a node deleted remotely cannot be read; uploaded again",
        metadata: ["key": "\(key)", "error": "\(error)"])
      return nil
    }
  }

  /// Applies remote deletions (one transaction each); dirty subtrees are kept and re-uploaded.
  ///
  /// Descendants whose RCRD is still in the store (created or moved there by this device while
  /// the deletion happened elsewhere) count as dirty: they are kept, with what holds them.
  /// `listed` is the full scan's set of RCRD keys; without it the store is listed.
  private func applyDeletions(
    _ cloudIDs: [String], listed: Set<String>? = nil, foundElsewhere: Set<String> = [],
    result: inout PullResult
  ) throws {
    var handled = Set<NodeID>()
    let explicit = Set(cloudIDs)
    var deferred = false
    // Shallow first, so a deleted directory takes its deleted children with it.
    let ordered = try context.catalog.read(context.userID) { tx -> [(String, Int)] in
      try cloudIDs.compactMap { id in
        guard let n = try tx.node(cloudID: id) else { return nil }
        return (id, try tx.path(of: n.id).components.count)
      }.sorted { $0.1 < $1.1 }
    }
    for (cloudID, _) in ordered {
      // Which descendants still have their RCRD in the store, and which nodes with changes
      // outstanding (but none to their content) still have DATA at their keys (I/O before the
      // transaction).
      // `unchanged`: (id, DATA key, node key, clean) — a clean file counts only if alive.
      let (below, unchanged) = try context.catalog.read(context.userID) {
        tx -> ([(NodeID, CloudObjectRef)], [(NodeID, String, Data, Bool)]) in
        guard let n = try tx.node(cloudID: cloudID) else { return ([], []) }
        var below: [(NodeID, CloudObjectRef)] = []
        var unchanged: [(NodeID, String, Data, Bool)] = []
        for (i, id) in try tx.subtreeIDs(of: n.id).enumerated() {
          guard let loc = try tx.objectLocation(of: id), let node = try tx.node(id: id) else {
            continue
          }
          if i > 0 { below.append((id, loc)) }
          let kinds = try tx.outstandingKinds(ofNodeID: id)
          if !kinds.isEmpty, !kinds.contains(.putData), node.kind != .directory {
            unchanged.append((id, loc.dataKey, node.encryptionKey, false))
          } else if i > 0, kinds.isEmpty, node.kind == .file, node.eTagData != nil {
            unchanged.append((id, loc.dataKey, node.encryptionKey, true))
          }
        }
        return (below, unchanged)
      }
      var alive = Set<NodeID>()
      if !below.isEmpty {
        var present: Set<String>
        if let listed {
          present = listed
        } else {
          present = []
          for prefix in Set(below.map(\.1.dirPrefix)) {
            for o in try context.store.listAll(
              prefix: context.layout.childrenPrefix(dirPrefix: prefix))
            {
              present.insert(o.key)
            }
          }
        }
        for (id, loc) in below where present.contains(loc.rcrdKey) { alive.insert(id) }
      }
      // A clean file still in the store (uploaded here while the deletion happened elsewhere)
      // is kept with the DATA at its keys: its content is known only by that version.
      var existingData: [NodeID: CloudDataInfo] = [:]
      for (id, key, nodeKey, clean) in unchanged where !clean || alive.contains(id) {
        if let info = try existingDataInfo(key: key, nodeKey: nodeKey) { existingData[id] = info }
      }
      try context.catalog.write(context.userID) { tx in
        guard let n = try tx.node(cloudID: cloudID), n.trunk == nil, !handled.contains(n.id) else {
          return
        }
        let ids = try tx.subtreeIDs(of: n.id)
        if listed == nil {
          // A descendant with local changes that was in the cloud, is no longer at its keys and
          // was not deleted itself may have been moved out of the deleted subtree before it
          // went (its move not announced yet): taken for deleted, it would be uploaded again
          // as new beside its RCRD elsewhere. A full scan decides (it finds it, or not).
          for id in ids.dropFirst() where !alive.contains(id) {
            guard let d = try tx.node(id: id), d.eTagRcrd != nil, !explicit.contains(d.cloudID),
              try tx.isDirty(nodeID: id)
            else { continue }
            deferred = true
            return
          }
        }
        let dirty = try tx.dirtyNodes(inSubtreeOf: n.id) + ids.filter { alive.contains($0) }
        let path = try tx.path(of: n.id)
        result.deletedNodes += 1
        context.logger.info(
          "remote delete applied",
          metadata: [
            "cloudID": "\(cloudID)", "node": "\(n.id)", "nodes": "\(ids.count)",
            "kept": "\(dirty.count)", "fullScan": "\(listed != nil)",
          ])
        if dirty.isEmpty {
          var doomed: [(Node, TreesystemPath)] = []
          for id in ids.reversed() {
            if let d = try tx.node(id: id) { doomed.append((d, try tx.path(of: id))) }
          }
          try tx.deleteRemoteSubtree(n.id)
          for (d, p) in doomed {
            context.delegate.didDiscoverDeletedNode(d, at: p, timestamp: nil, transaction: tx)
          }
        } else {
          // A node kept here, the deleted one or one below it, whose RCRD is in the store
          // elsewhere (`foundElsewhere`: a file or symlink whose change is staged here), where
          // this device cannot place it: it goes up as a node of its own, and the other
          // device's version stays where it is. Before, one below a kept directory went up
          // under its old cloudID: a second RCRD of one file, with DATA at both places, which
          // the two devices each kept at another place (tools/fsx-sync seed 138).
          for id in ids where !alive.contains(id) {
            guard let d = try tx.node(id: id), foundElsewhere.contains(d.cloudID),
              try tx.childCount(of: id) == 0
            else { continue }
            // The application keeps its content for the new identity (the mount stages what
            // it has cached by the old cloudID), which the upload then carries.
            context.delegate.willAssignNewCloudID(to: d, at: try tx.path(of: id), transaction: tx)
            try tx.assignNewCloudID(to: id)
            context.logger.info(
              "kept node found elsewhere in the store: uploaded as a node of its own",
              metadata: ["node": "\(id)"])
          }
          // A node below it that this device moved there from a place the store still holds
          // it at (the move outstanding) is not uploaded again: its move brings it into the
          // kept directory (after that one's upload). Uploaded again, under its old cloudID, it
          // was a second RCRD of the node beside the one at its move's origin, which the two
          // devices each kept (tools/fsx-sync seed 138).
          var movingIn: [NodeID] = []
          if let listed {
            for id in ids.dropFirst() {
              let origins = try tx.pendingOperations(forNodeID: id).compactMap {
                $0.kind == .move ? $0.payload.origin?.rcrdKey : nil
              }
              if origins.contains(where: listed.contains) { movingIn.append(id) }
            }
          }
          try keepDirty(
            n.id, dirty: dirty, existingData: existingData, movingIn: movingIn, tx: tx)
          context.delegate.didDiscoverDeletedDirtyNode(
            n, dirtyDescendants: dirty, timestamp: nil, transaction: tx)
          context.delegate.didDiscoverConflict(
            .deletedWhileDirty, node: n, other: nil, at: path, transaction: tx)
        }
        handled.formUnion(ids)
      }
    }
    if deferred {
      try context.catalog.write(context.userID) { tx in
        try tx.setSyncValue("1", forKey: Self.needsFullScanKey)
      }
      cond.withLock { forceFull = true }
    }
  }

  // MARK: Compaction

  /// Deletes change-log objects older than `compactionAge`, after recording the newest of them
  /// in the marker. Returns how many were deleted. Failures are logged, never thrown.
  private func compact() -> Int {
    let layout = context.layout
    let store = context.store
    let cutoff = UInt64(max(0, (Date().timeIntervalSince1970 - config.compactionAge) * 1000))
    do {
      let page = try store.list(
        prefix: layout.changesPrefix, startAfter: nil, continuationToken: nil, maxKeys: 1000)
      let old = page.objects.filter {
        guard let p = ChangeLogCodec.parse(key: $0.key, layout: layout), let u = ULID(p.ulid) else {
          return false
        }
        return u.milliseconds < cutoff
      }
      guard let newest = old.last,
        let newestULID = ChangeLogCodec.parse(key: newest.key, layout: layout)?.ulid
      else { return 0 }
      let markerKey = ChangeLogCodec.compactedMarkerKey(layout)
      var written = false
      for _ in 0..<5 where !written {
        let current = try context.headIfExists(markerKey)
        var value = newestULID
        if current != nil {
          let existing = String(decoding: try store.get(key: markerKey), as: UTF8.self)
          if existing > value { value = existing }
        }
        do {
          _ = try store.put(
            key: markerKey, body: .data(Data(value.utf8)),
            condition: current.map { .ifMatch($0.eTag) } ?? .ifNoneMatch)
          written = true
        } catch StoreError.preconditionFailed {
          continue
        }
      }
      guard written else { return 0 }
      for o in old { try? store.delete(key: o.key, condition: .none) }
      return old.count
    } catch {
      context.logger.warning("change-log compaction failed", metadata: ["error": "\(error)"])
      return 0
    }
  }
}

/// A "random" source of zero bits: the lowest ULID of a millisecond.
private struct ZeroRandom: RandomNumberGenerator {
  mutating func next() -> UInt64 { 0 }
}

/// Maps `items` with `transform` on up to `width` threads (not Swift concurrency's pool),
/// keeping order.
func parallelMap<T: Sendable, R: Sendable>(
  _ items: [T], width: Int, _ transform: @escaping @Sendable (T) -> R
) -> [R] {
  if items.isEmpty { return [] }
  if items.count == 1 || width <= 1 { return items.map(transform) }
  let box = ParallelBox<R>(items.count)
  DispatchQueue.concurrentPerform(iterations: min(width, items.count)) { _ in
    while true {
      let i = box.lock.withLock { () -> Int in
        let i = box.next
        box.next += 1
        return i
      }
      if i >= items.count { return }
      let r = transform(items[i])
      box.lock.withLock { box.results[i] = r }
    }
  }
  return box.results.map { $0! }
}

/// Shared state of one `parallelMap`.
private final class ParallelBox<R>: @unchecked Sendable {
  // Safe: `next` and `results` are only touched under `lock`.
  let lock = NSLock()
  var next = 0
  var results: [R?]
  init(_ n: Int) { results = Array(repeating: nil, count: n) }
}
