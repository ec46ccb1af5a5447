import CSQLiteTuning
public import Foundation
import GRDB
import Logging
import Synchronization
public import ZDCCore
import ZDCCrypto
public import ZDCSQLite

/// The local catalog: every local user's treesystem metadata and push queue, in one SQLite
/// database.
///
/// Changes go through ``write(_:_:)``, which runs one SQLite transaction: the node changes and
/// the push operations they cause commit together or not at all. Safe to use from any thread.
public final class Catalog: Sendable {
  /// How hard a commit waits for the disk.
  public enum Durability: String, Sendable {
    /// `synchronous=FULL`: an acknowledged commit survives a crash and a power loss.
    case full = "FULL"
    /// `synchronous=NORMAL`: survives a crash of the process; the last commits may be lost on
    /// power loss.
    case normal = "NORMAL"
  }

  /// Open options.
  public struct Options: Sendable {
    /// Commit durability; `.full` by default.
    public var durability: Durability
    /// How long a writer waits for a lock held by another process, in seconds.
    public var busyTimeout: Double
    /// How long a ``Commit/soon`` write waits for its commit, in seconds, while writes pause
    /// (see ``Commit/soon``).
    public var batchWindow: Double
    /// The key (32 bytes) that seals the catalog's sensitive fields at rest — names, symlink
    /// targets, node keys, directory salts, extended attributes, data tags and redo journal
    /// records — and keys its name index; `nil` leaves a catalog that was never sealed as it is
    /// (and cannot read a sealed one's fields).
    public var fieldKey: Data?
    /// The sealing level a keyed open brings the catalog to (tests make older catalogs with a
    /// lower one).
    @_spi(Testing) public var sealingLevel = Catalog.fieldSealingLevel

    public init(
      durability: Durability = .full, busyTimeout: Double = 10,
      batchWindow: Double = Catalog.batchWindow, fieldKey: Data? = nil
    ) {
      self.durability = durability
      self.busyTimeout = busyTimeout
      self.batchWindow = batchWindow
      self.fieldKey = fieldKey
    }
  }

  let writer: any DatabaseWriter
  /// The database file, or `nil` in memory.
  public let path: String?
  /// What of the write-ahead log is on stable storage (`nil` in memory).
  private let walFlush: WALFlush?
  /// Makes the checkpoints of the database's log beside the writer (`nil` in memory).
  private let checkpointer: WALCheckpointer?
  private let temporaryDirectory: URL?
  private let failpointBox = LockedBox<String?>(nil)
  /// Share lists decoded and encoded, shared by every transaction.
  let shareLists = ShareListCache()
  /// Nodes read on the writer connection, shared by the transactions that run there.
  let nodes = NodeCache()
  /// The writer connection's prepared statements of ``CatalogSQL`` texts.
  let writerStatements = StatementTable()
  /// New nodes whose first uploads are not queued yet (held by the process that holds the
  /// journal; see ``DeferredUploads``).
  let deferredUploads = DeferredUploads()
  /// New file nodes of the open batch whose rows are not inserted yet (see ``HeldRows``).
  let heldRows = HeldRows()
  /// How this catalog's sensitive fields are stored (see ``Options/fieldKey``).
  let fields: FieldCoding
  /// Layouts of the local users seen so far (a user's treeID never changes).
  private let layouts = LockedBox<[String: CloudLayout]>([:])

  /// A cloud transaction on `db` with this catalog's share lists and field coding, and the
  /// writer's node cache unless `shared` is false (a reader connection).
  func transaction(
    _ db: Database, _ layout: CloudLayout, readOnly: Bool = false, failpoint: String? = nil,
    shared: Bool = true
  ) -> CloudTransaction {
    CloudTransaction(
      db: db, layout: layout, readOnly: readOnly, failpoint: failpoint, shareLists: shareLists,
      nodes: shared ? nodes : nil, statements: shared ? writerStatements : nil,
      deferred: shared && batchesAllowed ? deferredUploads : nil,
      held: shared && batchesAllowed ? heldRows : nil, fields: fields)
  }

  /// The names of the schema migrations this build knows, in order.
  public static var knownMigrations: [String] { Schema.migrator.migrations }

  /// Opens (creating if needed) the catalog at `path`, in WAL mode, and migrates it. Changes
  /// of ``Commit/soon`` writes a crash left uncommitted are made again from the redo journal
  /// (`path` + `.redo`, see ``replayedJournalEntries``).
  public convenience init(path: String, options: Options = Options()) throws {
    let pool = try DatabasePool(path: path, configuration: Self.configuration(options))
    try self.init(
      writer: pool, path: path, temporaryDirectory: nil, batchWindow: options.batchWindow,
      durability: options.durability, fieldKey: options.fieldKey,
      sealingLevel: options.sealingLevel)
  }

  /// A catalog in a fresh temporary directory, removed when the catalog is released (tests).
  public static func temporary(options: Options = Options()) throws -> Catalog {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
      "zdc-catalog-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    let path = dir.appendingPathComponent("catalog.sqlite").path
    let pool = try DatabasePool(path: path, configuration: configuration(options))
    return try Catalog(
      writer: pool, path: path, temporaryDirectory: dir, batchWindow: options.batchWindow,
      durability: options.durability, fieldKey: options.fieldKey,
      sealingLevel: options.sealingLevel)
  }

  /// A catalog in memory (tests): one connection, nothing on disk.
  public static func inMemory() throws -> Catalog {
    let options = Options(durability: .normal)
    let queue = try DatabaseQueue(configuration: configuration(options))
    return try Catalog(
      writer: queue, path: nil, temporaryDirectory: nil, batchWindow: Catalog.batchWindow,
      durability: options.durability)
  }

  private init(
    writer: any DatabaseWriter, path: String?, temporaryDirectory: URL?, batchWindow: Double,
    durability: Durability, fieldKey: Data? = nil,
    sealingLevel: Int = Catalog.fieldSealingLevel
  ) throws {
    self.writer = writer
    self.batchWindowSeconds = batchWindow
    self.path = path
    walFlush = path.map { WALFlush(path: $0) }
    checkpointer = path.map { WALCheckpointer(path: $0, synchronous: durability.rawValue) }
    self.temporaryDirectory = temporaryDirectory
    self.commitHooks = CommitHooks(
      nodes: nodes, deferred: deferredUploads, held: heldRows, coverage: coverage)
    try Schema.migrator.migrate(writer)
    // Before the log's first flush: `WALFlush` learns its size then (sealing may shorten it).
    fields = try Self.sealFields(writer, key: fieldKey, level: sealingLevel)
    if let checkpointer { writer.writeWithoutTransaction { checkpointer.install(on: $0) } }
    writer.add(transactionObserver: commitHooks, extent: .databaseLifetime)
    if let path {
      do {
        journal = try RedoJournal(path: path + ".redo")
        batchesAllowed = true
      } catch RedoJournal.Failure.busy {
        // Another process writes this catalog and holds its journal: no batches here.
        journal = nil
        batchesAllowed = false
      }
      if batchesAllowed {
        deferredUploads.load(try writer.read { try CloudTransaction.storedDeferredUploads($0) })
      }
      try replayJournal()
    } else {
      journal = nil
      batchesAllowed = true
    }
  }

  deinit {
    try? commitPending()
    if let checkpointer { writer.writeWithoutTransaction { checkpointer.uninstall(from: $0) } }
    if let temporaryDirectory {
      try? FileManager.default.removeItem(at: temporaryDirectory)
    }
  }

  private static func configuration(_ options: Options) -> Configuration {
    // Before the process's first connection (a no-op afterwards).
    _ = zdc_sqlite_tune_process()
    var config = Configuration()
    // No foreign-key enforcement: its referential actions run as trigger programs that each
    // build a temporary b-tree, most of the cost of deleting a node or finishing an upload. The
    // catalog deletes dependent rows itself (`deleteRows`, `deleteOperation`,
    // `completeOperation`, `deleteLocalUser`), and tests check that
    // ``Catalog/foreignKeyViolations()`` stays empty.
    config.foreignKeysEnabled = false
    config.busyMode = .timeout(options.busyTimeout)
    // `Commit.soon` writes leave their transaction open between accesses until it commits.
    config.allowsUnsafeTransactions = true
    let sync = options.durability.rawValue
    config.prepareDatabase { db in
      try db.execute(sql: "PRAGMA synchronous = \(sync)")
      try db.execute(sql: "PRAGMA temp_store = MEMORY")
    }
    return config
  }

  /// The migrations applied to the database, in order.
  public func appliedMigrations() throws -> [String] {
    try writer.read { db in
      let applied = try Schema.migrator.appliedIdentifiers(db)
      return Schema.migrator.migrations.filter { applied.contains($0) }
    }
  }

  /// Makes every commit so far durable against power loss (with ``Durability/normal`` a commit
  /// survives a crash of the process but may wait in the write-ahead log for the next
  /// checkpoint's flush): flushes the log, unless no change was made since its last flush.
  public func makeDurable() throws {
    let flush = try prepareDurable()
    _ = try withExtendedLifetime(flush) {
      try LocalDurability.sync(
        paths: flush.paths, dataOnlyDescriptors: flush.dataOnly.map(\.descriptor))
    }
    flush.done()
  }

  /// Returns the flush that makes every write so far durable (see ``makeDurable()``), for a
  /// caller that flushes its files with its own and then calls its `done()`.
  ///
  /// While every commit since the write-ahead log's last flush holds only ``Commit/soon``
  /// writes, all of which are in the redo journal, that flush is the journal's (its data alone,
  /// in the room made ahead for it), and the open batch stays open: an `fsync` through the mount
  /// then costs no commit (its median 1.32 → 1.25 ms). Otherwise the pending writes are
  /// committed and the log is flushed. The journal is emptied only after the log holding its
  /// entries' commits was flushed (``commitBatch(_:)``, ``replayJournal()``).
  public func prepareDurable() throws -> PendingFlush {
    guard let walFlush else {
      try commitPending()
      return .none
    }
    if let journal,
      let viaJournal = writer.writeWithoutTransaction({ _ -> PendingFlush? in
        coverage.isComplete ? journal.flush() : nil
      })
    {
      return viaJournal
    }
    // The commit and the log's count in one access of the writer: a `.soon` write between them
    // would be counted as flushed with the log before its commit.
    return try writeMappingFullDisk { db in
      if batchOpen.value { try commitBatch(db) }
      return logFlush(walFlush, db)
    }
  }

  /// Which commits the redo journal does not hold (see ``prepareDurable()``).
  private let coverage = JournalCoverage()

  /// The flush of the write-ahead log that makes every commit so far durable (on the writer
  /// connection, `db`, outside a transaction); once done, neither those commits nor the redo
  /// journal's entries so far (all committed) need the journal to be durable.
  private func logFlush(_ walFlush: WALFlush, _ db: Database) -> PendingFlush {
    let (coverage, journal) = (self.coverage, self.journal)
    let pending = walFlush.pending(db)
    // Counted after `pending`, whose lengthening of the log is a commit of its own.
    let uncovered = coverage.uncovered
    let entries = journal?.coverMark()
    return pending.merged(
      with: PendingFlush(paths: [], dataOnly: []) {
        coverage.logFlushed(upTo: uncovered)
        if let journal, let entries { journal.didCover(entries) }
      })
  }

  /// Flushes the write-ahead log (on the writer connection, `db`, after a commit): every commit
  /// so far is then durable without the redo journal. False when the flush failed (logged).
  private func makeLogDurable(_ db: Database) -> Bool {
    guard let walFlush else { return true }
    let flush = logFlush(walFlush, db)
    do {
      _ = try withExtendedLifetime(flush) {
        try LocalDurability.sync(
          paths: flush.paths, dataOnlyDescriptors: flush.dataOnly.map(\.descriptor))
      }
    } catch {
      logger.error("catalog: the write-ahead log could not be flushed: \(error)")
      return false
    }
    flush.done()
    return true
  }

  /// Rows whose reference to another row is dangling, as `table: count` (empty when the catalog
  /// is consistent; `PRAGMA foreign_key_check`).
  public func foreignKeyViolations() throws -> [String: Int] {
    try writer.read { db in
      var out: [String: Int] = [:]
      for row in try Row.fetchAll(db, sql: "PRAGMA foreign_key_check") {
        out[row[0] as String, default: 0] += 1
      }
      return out
    }
  }

  /// SQLite's query plan for a statement, one line per step (tests: which index serves it).
  @_spi(Testing) public func queryPlan(_ sql: String) throws -> [String] {
    try writer.read { db in
      // Values don't change the plan: every `?` gets NULL.
      let nulls = [DatabaseValue](repeating: .null, count: sql.filter { $0 == "?" }.count)
      let statement = try db.makeStatement(sql: "EXPLAIN QUERY PLAN " + sql)
      return try Row.fetchAll(statement, arguments: StatementArguments(nulls)).map {
        $0["detail"] as String
      }
    }
  }

  /// The current value of a pragma (diagnostics and tests), e.g. `journal_mode`.
  public func pragma(_ name: String) throws -> String? {
    guard name.allSatisfy({ $0.isLetter || $0 == "_" }) else {
      throw CatalogError.invalidOperation("bad pragma name")
    }
    return try writer.read { db in try String.fetchOne(db, sql: "PRAGMA \(name)") }
  }

  // MARK: Failpoints

  /// Test seam: when set, the mutation that reaches the named point throws
  /// ``CatalogError/injectedFailure(_:)`` there, in the middle of its transaction.
  @_spi(Testing) public var failpoint: String? {
    get { failpointBox.value }
    set { failpointBox.value = newValue }
  }

  // MARK: Transactions

  /// When a write's changes reach the database file.
  public enum Commit: Sendable {
    /// Committed before ``Catalog/write(_:commit:_:)`` returns: it survives a crash of the
    /// process from then on.
    case now
    /// Committed with the writes around it ``Options/batchWindow`` seconds after the batch
    /// opened — later while `.soon` writes keep coming without a pause of
    /// ``Catalog/batchQuietSeconds``, up to ``Catalog/batchBusyWindows`` windows or
    /// ``Catalog/maxBatchUnits`` writes —, or earlier by the next ``now`` write or
    /// ``Catalog/commitPending()``. Seen at once by every read and write of this catalog.
    /// Survives a crash of the process once the write returns: its changes are in the
    /// catalog's redo journal (see ``replayedJournalEntries``), made again at the next open if
    /// the commit did not happen. Not yet power-loss safe (like ``Durability/normal``;
    /// ``makeDurable()`` makes it so).
    case soon
  }

  /// How long a ``Commit/soon`` write waits for its commit by default, in seconds (while writes
  /// pause; see ``Commit/soon``). Each
  /// commit writes every page its batch changed, and a burst of creates changes the same index
  /// pages over and over: a copy of /usr/include took 9% less time with 0.5 s than with 0.1 s
  /// (no better with 1 s). Durability does not depend on it (the redo journal has each write).
  public static let batchWindow: Double = 0.5
  private let batchWindowSeconds: Double
  /// The pause in ``Commit/soon`` writes that lets a batch whose window has passed commit:
  /// during a burst (a copy of many files) a commit stops every file operation behind it for
  /// as long as it takes to insert the batch's held rows and write its pages (about 11 ms per
  /// half second of a copy of /usr/include), so the batch waits for the burst to pause.
  public static let batchQuietSeconds: Double = 0.1
  /// The most windows a batch waits for a pause in a burst (5 s by default).
  public static let batchBusyWindows: Double = 10
  /// The most ``Commit/soon`` writes a batch that waits for a pause takes (they are held in
  /// memory and in the redo journal until it commits).
  public static let maxBatchUnits = 40_000
  /// When the open batch began (uptime nanoseconds), when its last ``Commit/soon`` write was
  /// made, and how many such writes it has.
  private let batchOpenedAt = Atomic<UInt64>(0)
  /// Whether the batch timer is armed (see ``scheduleBatchCommit()``).
  private let batchTimerArmed = Atomic<Bool>(false)
  private let _batchTimerFirings = Atomic<Int>(0)
  private let soonWrites = ActivityMonitor()
  private let batchUnits = Atomic<Int>(0)

  /// The redo journal of ``Commit/soon`` writes (`nil` in memory, or when another process holds
  /// it: ``Commit/soon`` then commits at once).
  private let journal: RedoJournal?
  /// False when `.soon` writes must commit at once (no journal for a catalog on disk).
  private let batchesAllowed: Bool
  /// The last journal entry of the open batch, and the last one a commit covered. Touched
  /// only on the writer connection.
  nonisolated(unsafe) private var batchJournalSeq: UInt64 = 0
  nonisolated(unsafe) private var committedJournalSeq: UInt64 = 0
  /// True when `.soon` writes go through the redo journal (false in memory, or when another
  /// process holds this catalog's journal: they then commit at once).
  public var isJournaled: Bool { journal != nil }
  /// How many journal entries the opening of this catalog made again (a crash had left them
  /// uncommitted), and how many of those failed (logged, skipped).
  nonisolated(unsafe) public private(set) var replayedJournalEntries = 0
  nonisolated(unsafe) public private(set) var failedJournalEntries = 0
  /// How many times a unit that failed after changing rows had its batch rebuilt (tests).
  nonisolated(unsafe) public private(set) var rebuiltBatches = 0

  /// True while ``Commit/soon`` writes wait for their commit (an open SQLite transaction on
  /// the writer connection).
  private let batchOpen = LockedBox<Bool>(false)
  private let batchTimer = DispatchQueue(label: "zdc.catalog.batch")
  /// What ``CloudTransaction/afterCommit(_:)`` asked for, run when the writer commits. (One
  /// observer for the catalog's lifetime: GRDB drops its cached DELETE statements whenever an
  /// observer is added, as `afterNextTransaction` would for every hook.)
  private let commitHooks: CommitHooks
  private let logger = Logger(label: "zdc.catalog")

  /// Runs `body` as one unit of work for a local user's treesystem.
  ///
  /// Everything `body` does (node changes, the push operations they enqueue, tags, links) is
  /// kept together when it returns, and undone if it throws. With `commit: .now` (the default)
  /// it is committed before this returns; with `.soon`, see ``Commit/soon``.
  @discardableResult
  public func write<T>(
    _ userID: String, commit: Commit = .now, _ body: (CloudTransaction) throws -> T
  ) throws -> T {
    let failpoint = failpointBox.value
    let known = layouts.value[userID]
    let commit: Commit = batchesAllowed ? commit : .now
    do {
      return try writer.writeWithoutTransaction { db in
        // Set by a `.soon` unit that could not be journaled: it commits before returning.
        var commitNow = false
        func unit(journaled: Bool) throws -> T {
          let layout = try known ?? CloudTransaction.layout(userID: userID, db: db)
          let tx = transaction(db, layout, failpoint: failpoint)
          if journaled {
            tx.journalRecords = []
            tx.defersFirstUploads = true
          }
          let result: T
          do { result = try body(tx) } catch {
            // Its changes are rolled back: nodes read after them may be cached.
            nodes.removeAll()
            throw error
          }
          if journaled, let journal {
            if tx.needsCommit {
              commitNow = true
            } else if let records = tx.journalRecords, !records.isEmpty {
              do {
                batchJournalSeq = try journal.append(userID: userID, records: records)
              } catch {
                logger.error("catalog journal: \(error); committing at once")
                commitNow = true
              }
            }
          }
          commitHooks.append(tx.commitHooks)
          if known == nil { layouts.value[userID] = layout }
          return result
        }
        if !db.rawIsInsideTransaction {
          if commit == .now {
            try control(db, "BEGIN IMMEDIATE TRANSACTION")
            do {
              let result = try unit(journaled: false)
              try CloudTransaction.storeDeferredUploads(deferredUploads, db)
              try control(db, "COMMIT TRANSACTION")
              return result
            } catch {
              if db.rawIsInsideTransaction { try? control(db, "ROLLBACK TRANSACTION") }
              nodes.removeAll()
              throw error
            }
          }
          try control(db, "BEGIN IMMEDIATE TRANSACTION")
          batchOpen.value = true
          batchOpenedAt.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
          batchUnits.store(0, ordering: .relaxed)
          scheduleBatchCommit()
        }
        // No savepoint around the unit: one costs a copy of every page the unit touches (about
        // an eighth of a file operation). A unit that fails having changed nothing leaves the
        // batch as it was; one that fails after changing rows has the batch rebuilt without it.
        let result: T
        let changesBefore = db.rawTotalChangesCount
        deferredUploads.beginUnit()
        heldRows.beginUnit()
        do {
          result = try unit(journaled: commit == .soon && journal != nil)
        } catch {
          nodes.removeAll()
          if !db.rawIsInsideTransaction {
            // SQLite ended the transaction (it rolls back on a full disk).
            deferredUploads.didRollback()
            heldRows.didRollback()
            batchOpen.value = false
          } else if db.rawTotalChangesCount != changesBefore {
            rebuildBatch(db)
          } else {
            deferredUploads.undoUnit()
            heldRows.undoUnit()
          }
          throw error
        }
        if commit == .now || commitNow {
          // A unit the journal does not hold: the log must be flushed for this commit.
          try commitBatch(db, journaledOnly: false)
        } else {
          soonWrites.touch()
          batchUnits.add(1, ordering: .relaxed)
        }
        return result
      }
    } catch let error as DatabaseError where error.resultCode == .SQLITE_FULL {
      throw CatalogError.outOfSpace
    }
  }

  /// How many lookups of a name found it absent without a query (tests).
  @_spi(Testing) public var absentNamesAnswered: Int {
    nodes.absentAnswers.load(ordering: .relaxed)
  }

  /// How many checkpoints of the database's log ran beside the writer (tests).
  @_spi(Testing) public var backgroundCheckpoints: Int { checkpointer?.checkpoints ?? 0 }

  /// How many directories the node cache keeps the child names of (tests).
  @_spi(Testing) public var directoriesWithChildNames: Int { nodes.directoriesWithNames }

  /// How many new nodes' first uploads are not queued yet (tests).
  @_spi(Testing) public var deferredFirstUploads: Int { deferredUploads.count }
  /// True while a batch of ``Commit/soon`` writes waits for its commit (tests).
  @_spi(Testing) public var hasOpenBatch: Bool { batchOpen.value }
  /// How many batches of ``Commit/soon`` writes committed (tests).
  @_spi(Testing) public var committedBatches: Int { batchCommits.load(ordering: .relaxed) }
  private let batchCommits = Atomic<Int>(0)
  /// How many times the batch timer fired (tests).
  @_spi(Testing) public var batchTimerFirings: Int { _batchTimerFirings.load(ordering: .relaxed) }

  /// How many new files are held without a row (tests; see ``HeldRows``).
  @_spi(Testing) public var heldNodes: Int { heldRows.count }

  /// The rows of `nodes` as they are, held nodes not inserted (tests).
  @_spi(Testing) public func nodeRows() throws -> Int {
    try writer.unsafeReentrantWrite { db in
      try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM nodes") ?? 0
    }
  }

  /// The rows of the push queue as they are, deferred first uploads not queued (tests).
  @_spi(Testing) public func queuedOperationRows() throws -> Int {
    try writer.unsafeReentrantWrite { db in
      try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM pushOperations") ?? 0
    }
  }

  /// Commits the ``Commit/soon`` writes still waiting.
  public func commitPending() throws {
    guard batchOpen.value else { return }
    try writeMappingFullDisk { db in try commitBatch(db) }
  }

  /// `body` on the writer connection, outside a transaction; a full disk is
  /// ``CatalogError/outOfSpace``.
  private func writeMappingFullDisk<T>(_ body: (Database) throws -> T) throws -> T {
    do {
      return try writer.writeWithoutTransaction(body)
    } catch let error as DatabaseError where error.resultCode == .SQLITE_FULL {
      throw CatalogError.outOfSpace
    }
  }

  /// Commits the open batch; `journaledOnly` when each of its units is in the redo journal
  /// (a unit that is not commits its batch at once).
  private func commitBatch(_ db: Database, journaledOnly: Bool = true) throws {
    guard db.rawIsInsideTransaction else {
      deferredUploads.didRollback()
      heldRows.didRollback()
      batchOpen.value = false
      return
    }
    do {
      // The held nodes' rows go in first (the deferred uploads' rows refer to them).
      try insertHeldRows(db)
      // The new nodes' first uploads wait, stored with the nodes.
      try CloudTransaction.storeDeferredUploads(deferredUploads, db)
      if batchJournalSeq > committedJournalSeq {
        // The journal entries this commit makes redundant.
        try db.cachedStatement(sql: "UPDATE journalState SET seq = ? WHERE id = 1").execute(
          arguments: [Int64(bitPattern: batchJournalSeq)])
      }
      coverage.committingJournaledBatch = journaledOnly
      defer { coverage.committingJournaledBatch = false }
      try control(db, "COMMIT TRANSACTION")
      batchOpen.value = false
      batchCommits.add(1, ordering: .relaxed)
      committedJournalSeq = batchJournalSeq
      // Every entry is committed now (entries are appended on this connection only).
      if let journal, journal.size >= RedoJournal.truncateThreshold {
        emptyJournal(journal, db)
      }
    } catch {
      nodes.removeAll()
      deferredUploads.didRollback()
      heldRows.didRollback()
      if !db.rawIsInsideTransaction {
        batchOpen.value = false
      } else {
        // Not committed and still open: give up on it rather than leave it half-done.
        try? control(db, "ROLLBACK TRANSACTION")
        batchOpen.value = false
      }
      // The batch's journal entries describe changes the catalog no longer holds; replaying
      // them at the next open would bring back, on a later state, what this process has
      // dropped: they go too.
      if let journal, batchJournalSeq > committedJournalSeq {
        try? journal.truncate()
        committedJournalSeq = batchJournalSeq
      }
      logger.error(
        "catalog commit failed; metadata changes of the last moments are lost: \(error)")
      throw error
    }
  }

  /// Empties the journal, whose entries are all committed (on the writer connection, `db`).
  ///
  /// When an `fsync` may rely on its entries (a flush of them was prepared, see
  /// ``prepareDurable()``), the log holding their commits is flushed first. Otherwise no flush
  /// is owed: their commits, in the log, survive a crash of the process as the entries did, and
  /// the next `fsync` flushes the log (the journal no longer holds every commit the log's last
  /// flush missed). A flush of the log here, on the writer, held every file operation for as
  /// long as the disk took (200 ms measured in the middle of a copy).
  private func emptyJournal(_ journal: RedoJournal, _ db: Database) {
    if journal.flushPrepared {
      guard makeLogDurable(db) else { return }
    } else {
      coverage.journalEmptied()
    }
    do { try journal.truncate() } catch {
      logger.error("catalog journal: \(error)")
    }
  }

  /// Inserts the rows of the nodes held for the open batch (see ``HeldRows``).
  private func insertHeldRows(_ db: Database) throws {
    guard heldRows.mustInsert, let userID = heldRows.anyUserID else { return }
    let layout = try layouts.value[userID] ?? CloudTransaction.layout(userID: userID, db: db)
    try transaction(db, layout).insertHeldRows()
  }

  /// Undoes a batch that a failed unit left half-done and makes its journaled units again, in
  /// order, from the redo journal (each unit of an open batch is journaled: units that are not
  /// commit the batch before returning). Node and operation ids come out as they were: the
  /// rollback rewinds their sequences too. If the batch cannot be made again, it is given up
  /// with its journal entries, as a failed commit is.
  private func rebuildBatch(_ db: Database) {
    do {
      try control(db, "ROLLBACK TRANSACTION")
      batchOpen.value = false
      guard let journal, batchJournalSeq > committedJournalSeq else { return }
      let entries = try journal.readAll().entries.filter {
        $0.seq > committedJournalSeq && $0.seq <= batchJournalSeq
      }
      try control(db, "BEGIN IMMEDIATE TRANSACTION")
      batchOpen.value = true
      scheduleBatchCommit()
      for entry in entries {
        try control(db, "SAVEPOINT replay")
        do {
          let layout = try CloudTransaction.layout(userID: entry.userID, db: db)
          // Its commit hooks were kept when it first ran.
          let tx = transaction(db, layout)
          for record in entry.records { try tx.replay(record) }
          try control(db, "RELEASE SAVEPOINT replay")
        } catch {
          nodes.removeAll()
          try control(db, "ROLLBACK TO SAVEPOINT replay")
          try control(db, "RELEASE SAVEPOINT replay")
          logger.error("catalog: a change of the batch could not be made again: \(error)")
        }
      }
      rebuiltBatches += 1
    } catch {
      nodes.removeAll()
      deferredUploads.didRollback()
      heldRows.didRollback()
      if db.rawIsInsideTransaction { try? control(db, "ROLLBACK TRANSACTION") }
      batchOpen.value = false
      if let journal, batchJournalSeq > committedJournalSeq {
        try? journal.truncate()
        committedJournalSeq = batchJournalSeq
      }
      logger.error(
        "catalog: a batch could not be rebuilt; metadata changes of the last moments are lost: \(error)"
      )
    }
  }

  /// Makes again the journal entries a crash left uncommitted (at open, before any other
  /// write), one savepoint each; an entry that fails is logged and skipped. Then empties the
  /// journal.
  private func replayJournal() throws {
    guard let journal else { return }
    let (entries, valid) = try journal.readAll()
    if valid < journal.size {
      logger.warning("catalog journal: a damaged tail of \(journal.size - valid) bytes dropped")
    }
    let applied = try writer.read { db in
      try Int64.fetchOne(db, sql: "SELECT seq FROM journalState WHERE id = 1") ?? 0
    }
    var pending = entries.filter { $0.seq > UInt64(bitPattern: applied) }
    if let first = pending.first, first.seq != UInt64(bitPattern: applied) + 1 {
      // The entries do not continue the database's state (a power loss took commits of the
      // database the journal had already been emptied of): replaying them would apply changes
      // out of their context.
      logger.error(
        "catalog journal: entries \(first.seq)… do not follow the database's \(applied); not replayed"
      )
      pending = []
    }
    if !pending.isEmpty {
      var failed = 0
      try writer.write { db in
        for entry in pending {
          let layout = try CloudTransaction.layout(userID: entry.userID, db: db)
          do {
            try db.inSavepoint {
              let tx = transaction(db, layout)
              for record in entry.records { try tx.replay(record) }
              commitHooks.append(tx.commitHooks)
              return .commit
            }
          } catch {
            nodes.removeAll()
            failed += 1
            logger.error("catalog journal: entry \(entry.seq) could not be made again: \(error)")
          }
        }
        try db.execute(
          sql: "UPDATE journalState SET seq = ? WHERE id = 1",
          arguments: [Int64(bitPattern: pending.last!.seq)])
      }
      replayedJournalEntries = pending.count
      failedJournalEntries = failed
      logger.info(
        "catalog journal: \(pending.count) uncommitted changes made again after a crash")
      // The journal held them durably (an `fsync` flushed it, not the log): the log holding
      // their commit goes to stable storage before the journal is emptied.
      guard writer.writeWithoutTransaction({ makeLogDurable($0) }) else {
        // The entries stay (the next open skips those the database holds); a damaged tail
        // goes, so that the next entries follow the valid ones.
        try journal.truncate(to: valid)
        batchJournalSeq = journal.lastSeq
        committedJournalSeq = batchJournalSeq
        return
      }
    }
    try journal.truncate()
    // Entries are numbered on from the database's mark, or a crash would find this process's
    // entries numbered as if committed (from 1, when the journal was found empty).
    journal.continueAfter(UInt64(bitPattern: applied))
    batchJournalSeq = max(journal.lastSeq, UInt64(bitPattern: applied))
    committedJournalSeq = batchJournalSeq
  }

  /// Runs a transaction statement prepared once (GRDB's `inTransaction`, `inSavepoint` and
  /// `commit` parse theirs again at every use: several per file operation). GRDB still sees it
  /// run and keeps its transaction state and observers informed.
  private func control(_ db: Database, _ sql: String) throws {
    try db.cachedStatement(sql: sql).execute()
  }

  /// Arms the batch timer for the batch just opened, unless it is armed already: one timer at
  /// a time. (A timer per batch, each of which kept checking while `.soon` writes went on,
  /// piled up when an `fsync` committed the batch after every write: a database's
  /// transactions in the mount left thousands re-armed tens of thousands of times a second,
  /// and their wake-ups took more of the machine than the transactions.)
  private func scheduleBatchCommit() {
    guard
      batchTimerArmed.compareExchange(
        expected: false, desired: true, ordering: .sequentiallyConsistent
      ).exchanged
    else { return }
    armBatchTimer(after: batchWindowSeconds)
  }

  private func armBatchTimer(after seconds: Double) {
    batchTimer.asyncAfter(deadline: .now() + seconds) { [weak self] in
      self?.batchTimerFired()
    }
  }

  /// The open batch commits once its window has passed and its writes pause (see
  /// ``busyBatchWait()``); the timer stays armed while a batch is open.
  private func batchTimerFired() {
    _batchTimerFirings.add(1, ordering: .relaxed)
    if batchOpen.value {
      let age =
        Double(DispatchTime.now().uptimeNanoseconds &- batchOpenedAt.load(ordering: .relaxed))
        / 1e9
      // A batch opened after the one the timer was armed for: its own window.
      if age < batchWindowSeconds {
        armBatchTimer(after: batchWindowSeconds - age)
        return
      }
      if let wait = busyBatchWait() {
        armBatchTimer(after: wait)
        return
      }
      do { try commitPending() } catch {
        // Logged by commitBatch; the next write retries.
      }
    }
    batchTimerArmed.store(false, ordering: .sequentiallyConsistent)
    // A batch opened since found the timer armed and left it to this one.
    if batchOpen.value,
      batchTimerArmed.compareExchange(
        expected: false, desired: true, ordering: .sequentiallyConsistent
      ).exchanged
    {
      batchTimerFired()
    }
  }

  /// How much longer the open batch waits for a pause in `.soon` writes, or `nil` when it
  /// commits now (writes have paused, or it waited as long as it may).
  private func busyBatchWait() -> Double? {
    let age =
      Double(DispatchTime.now().uptimeNanoseconds &- batchOpenedAt.load(ordering: .relaxed)) / 1e9
    guard let wait = soonWrites.remainingUntilQuiet(Self.batchQuietSeconds),
      age < batchWindowSeconds * Self.batchBusyWindows,
      batchUnits.load(ordering: .relaxed) < Self.maxBatchUnits
    else { return nil }
    return wait
  }

  /// Runs `body` with a read-only, consistent view of a local user's treesystem (including
  /// ``Commit/soon`` writes not committed yet).
  ///
  /// With `onWriter`, it runs on the writer connection, between writes (no snapshot to set up
  /// and no page cache to refresh: cheaper for the short reads of a file system; a long read
  /// there delays writes).
  public func read<T>(
    _ userID: String, onWriter: Bool = false, _ body: (CloudTransaction) throws -> T
  ) throws -> T {
    let known = layouts.value[userID]
    func unit(_ db: Database, onWriter: Bool) throws -> T {
      let layout = try known ?? CloudTransaction.layout(userID: userID, db: db)
      let tx = transaction(db, layout, readOnly: true, shared: onWriter)
      let result = try body(tx)
      if known == nil { layouts.value[userID] = layout }
      return result
    }
    if onWriter {
      // Writes of this process are serialized on this connection: no statement of another
      // one can interleave with `body`'s, so it needs no transaction of its own.
      return try writer.unsafeReentrantWrite { db in try unit(db, onWriter: true) }
    }
    if batchOpen.value {
      // Uncommitted writes are visible on the writer connection only.
      return try writer.unsafeReentrantWrite { db in
        if db.rawIsInsideTransaction { return try unit(db, onWriter: true) }
        var result: T?
        try db.inTransaction(.deferred) {
          result = try unit(db, onWriter: true)
          return .commit
        }
        return result!
      }
    }
    return try writer.read { db in try unit(db, onWriter: false) }
  }

  /// Which of `ids` are nodes of any local user.
  public func existingNodeIDs(among ids: [NodeID]) throws -> Set<NodeID> {
    try writer.read { db in
      let stmt = try db.cachedStatement(sql: "SELECT 1 FROM nodes WHERE id = ?")
      return Set(try ids.filter { try Bool.fetchOne(stmt, arguments: [$0]) ?? false })
    }
  }

  // MARK: Local users

  /// Adds a local user and creates its four trunk nodes; returns them by trunk.
  @discardableResult
  public func createLocalUser(_ user: LocalUser) throws -> [Trunk: Node] {
    try writer.write { db in
      if try Bool.fetchOne(db, sql: "SELECT 1 FROM localUsers WHERE id = ?", arguments: [user.id])
        ?? false
      {
        throw CatalogError.userExists(user.id)
      }
      try db.execute(
        sql: """
          INSERT INTO localUsers (id, treeID, boxPublicKey, signPublicKey, createdAt, settings)
          VALUES (?, ?, ?, ?, ?, ?)
          """,
        arguments: [
          user.id, user.treeID, user.boxPublicKey, user.signPublicKey,
          user.createdAt.timeIntervalSinceReferenceDate,
          String(decoding: user.settings, as: UTF8.self),
        ])
      let tx = transaction(db, user.layout)
      var trunks: [Trunk: Node] = [:]
      for trunk in Trunk.allCases {
        trunks[trunk] = try tx.insertTrunk(trunk)
      }
      return trunks
    }
  }

  /// One local user, or `nil`.
  public func localUser(id: String) throws -> LocalUser? {
    try writer.read { db in
      try Row.fetchOne(db, sql: "SELECT * FROM localUsers WHERE id = ?", arguments: [id]).map(
        Self.decodeUser)
    }
  }

  /// Every local user, by creation order.
  public func localUsers() throws -> [LocalUser] {
    try writer.read { db in
      try Row.fetchAll(db, sql: "SELECT * FROM localUsers ORDER BY createdAt, id").map(
        Self.decodeUser)
    }
  }

  /// Replaces a local user's settings document.
  public func setSettings(_ settings: Data, forUserID userID: String) throws {
    try writer.write { db in
      try db.execute(
        sql: "UPDATE localUsers SET settings = ? WHERE id = ?",
        arguments: [String(decoding: settings, as: UTF8.self), userID])
      if db.rawChangesCount == 0 { throw CatalogError.userNotFound(userID) }
    }
  }

  /// Removes a local user with its whole treesystem, tags, links and push queue.
  public func deleteLocalUser(id: String) throws {
    layouts.value[id] = nil
    try writer.write { db in
      let layout = try CloudTransaction.layout(userID: id, db: db)
      let tx = transaction(db, layout)
      try tx.queueDeferredUploads()
      try db.execute(
        sql: """
          DELETE FROM pushOperationDeps WHERE opID IN
            (SELECT id FROM pushOperations WHERE localUserID = ?)
          """, arguments: [id])
      try db.execute(sql: "DELETE FROM pushOperations WHERE localUserID = ?", arguments: [id])
      for trunk in Trunk.allCases {
        if let root = try tx.trunkNode(trunk) { try tx.deleteRows(subtreeOf: root.id) }
      }
      try db.execute(sql: "DELETE FROM syncState WHERE localUserID = ?", arguments: [id])
      try db.execute(sql: "DELETE FROM changeLogPending WHERE localUserID = ?", arguments: [id])
      try db.execute(sql: "DELETE FROM localUsers WHERE id = ?", arguments: [id])
    }
    layouts.value[id] = nil
  }

  private static func decodeUser(_ row: Row) -> LocalUser {
    LocalUser(
      id: row["id"], treeID: row["treeID"], boxPublicKey: row["boxPublicKey"],
      signPublicKey: row["signPublicKey"],
      createdAt: Date(timeIntervalSinceReferenceDate: row["createdAt"]),
      settings: Data((row["settings"] as String).utf8))
  }
}

/// A value behind a lock.
final class LockedBox<Value: Sendable>: @unchecked Sendable {
  private let lock = NSLock()
  private var stored: Value
  init(_ value: Value) { stored = value }
  var value: Value {
    get { lock.withLock { stored } }
    set { lock.withLock { stored = newValue } }
  }
}

/// Share lists by their JSON and back: most nodes share a few lists (the owner's alone,
/// usually), and decoding JSON for every node read would dominate lookups.
final class ShareListCache: @unchecked Sendable {
  // @unchecked: both maps are only touched under `lock`.
  private let lock = NSLock()
  private var byJSON: [String: ShareList] = [:]
  private var byList: [ShareList: String] = [:]

  func decoded(_ json: String) -> ShareList? { lock.withLock { byJSON[json] } }

  func encoded(_ list: ShareList) -> String? { lock.withLock { byList[list] } }

  func remember(_ list: ShareList, json: String) {
    lock.withLock {
      if byJSON.count > 256 {
        byJSON.removeAll()
        byList.removeAll()
      }
      byJSON[json] = list
      byList[list] = json
    }
  }
}

/// Runs the work queued for after a commit of the writer connection; drops it on a rollback.
final class CommitHooks: TransactionObserver, @unchecked Sendable {
  // @unchecked: `pending` is only touched under `lock`.
  private let lock = NSLock()
  private var pending: [@Sendable () -> Void] = []
  /// Emptied on every rollback.
  let nodes: NodeCache
  let deferred: DeferredUploads
  let held: HeldRows
  /// Told of every commit.
  let coverage: JournalCoverage

  init(nodes: NodeCache, deferred: DeferredUploads, held: HeldRows, coverage: JournalCoverage) {
    self.nodes = nodes
    self.deferred = deferred
    self.held = held
    self.coverage = coverage
  }

  func append(_ hooks: [@Sendable () -> Void]) {
    guard !hooks.isEmpty else { return }
    lock.withLock { pending += hooks }
  }

  func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool { false }
  func databaseDidChange(with event: DatabaseEvent) {}

  func databaseDidCommit(_ db: Database) {
    coverage.didCommit()
    deferred.didCommit()
    let hooks = lock.withLock { () -> [@Sendable () -> Void] in
      defer { pending.removeAll() }
      return pending
    }
    for hook in hooks { hook() }
  }

  func databaseDidRollback(_ db: Database) {
    lock.withLock { pending.removeAll() }
    nodes.removeAll()
    deferred.didRollback()
    held.didRollback()
  }
}

/// Whether every commit since the write-ahead log's last flush is also in the redo journal:
/// the commits of batches of ``Catalog/Commit/soon`` writes, each journaled, are; any other
/// commit (a ``Catalog/Commit/now`` write, a batch with a unit that could not be journaled, the
/// sync engine's writes, a replay) is not, until the log is flushed.
final class JournalCoverage: @unchecked Sendable {
  // @unchecked: `committingJournaledBatch` is touched only on the writer connection
  // (serialized); the counts are atomics.
  /// Commits the journal does not hold, and how many of them a flush of the log covered. (One
  /// at first: what the database held when it was opened is not known to be durable.)
  private let uncoveredCount = Atomic<UInt64>(1)
  private let flushedCount = Atomic<UInt64>(0)
  /// Set while a batch whose units are all journaled commits: its commit is covered.
  var committingJournaledBatch = false

  var uncovered: UInt64 { uncoveredCount.load(ordering: .acquiring) }

  /// True when the journal holds every commit a flush of the log has not covered.
  var isComplete: Bool {
    flushedCount.load(ordering: .acquiring) >= uncoveredCount.load(ordering: .acquiring)
  }

  func didCommit() {
    if !committingJournaledBatch {
      uncoveredCount.add(1, ordering: .releasing)
    }
  }

  /// The journal was emptied without a flush of the log: the commits its entries held are
  /// covered by neither any more.
  func journalEmptied() {
    uncoveredCount.add(1, ordering: .releasing)
  }

  /// A flush of the log that began with `count` uncovered commits ended.
  func logFlushed(upTo count: UInt64) {
    var current = flushedCount.load(ordering: .relaxed)
    while current < count {
      let (exchanged, original) = flushedCount.compareExchange(
        expected: current, desired: count, ordering: .acquiringAndReleasing)
      if exchanged { break }
      current = original
    }
  }
}

/// Nodes read on the writer connection, kept across its transactions: the file system asks for
/// the same few nodes (a directory, the file just created) many times a second.
///
/// Every statement that changes a row of `nodes` removes that node (``CloudTransaction`` does
/// it where it changes rows), and every rollback empties the cache, so an entry always equals
/// the row the writer connection sees. This holds because the catalog's writer connection is
/// the only writer of its database (one process per state directory). Reader connections,
/// which may see an older snapshot, don't use it.
final class NodeCache: Sendable {
  /// Past this many entries the cache starts over (a scan of a large tree touches each node
  /// once; what matters is the few hot ones).
  static let capacity = 16_384
  private let entries = BoundedMap<NodeID, Node>(capacity: NodeCache.capacity)

  func get(_ id: NodeID) -> Node? { entries.get(id) }

  func put(_ node: Node) { entries.put(node.id, node) }

  func remove(_ id: NodeID) { entries.remove(id) }

  func removeAll() {
    entries.removeAll()
    childless.removeAll()
    bare.removeAll()
    childNames.withLock { $0.removeAll() }
  }

  // Every statement that changes the rows tells the cache through one of the three calls below
  // (``inserted(_:kind:under:named:)``, ``placed(under:named:)``, ``deleted(_:)``), which keep
  // every set at once; only tags and links have calls of their own (``clothed(_:)``).

  /// A row inserted: it has no children, tags or links (nor, a directory, named children), and
  /// sits under `parentID` named `key`.
  func inserted(_ id: NodeID, kind: NodeKind, under parentID: NodeID?, named key: NameKey) {
    placed(under: parentID, named: key)
    childless.put(id, true)
    bare.put(id, true)
    if kind == .directory { madeDirectory(id) }
  }

  /// A row now sits under `parentID` named `key` (an insert, a rename, a move, a change from
  /// the cloud): the parent has a child, and one of that name.
  func placed(under parentID: NodeID?, named key: NameKey) {
    guard let parentID else { return }
    childless.remove(parentID)
    namedChild(parentID, key)
  }

  /// A row deleted: it leaves the cache and its sets.
  func deleted(_ id: NodeID) {
    entries.remove(id)
    childless.remove(id)
    bare.remove(id)
    childNames.withLock { _ = $0.removeValue(forKey: id) }
  }

  /// Nodes known to have no children (a file node shows as a directory once it has some, so
  /// every `stat` of a file asks). Every statement that gives a node a child (an insert, a
  /// move) calls ``placed(under:named:)``; a rollback empties the set with the nodes.
  private let childless = BoundedMap<NodeID, Bool>(capacity: NodeCache.capacity)

  func isChildless(_ id: NodeID) -> Bool { childless.get(id) != nil }

  func noteChildless(_ id: NodeID) { childless.put(id, true) }

  func noteChildless(_ ids: [NodeID]) { childless.put(contentsOf: ids.map { ($0, true) }) }

  /// Nodes known to have no tag and no link: rows inserted since the cache last started over
  /// that no tag or link has been given since (a node's rename clears its conflict tag, its
  /// delete its tags and links: statements that find nothing to delete on a new node). Every
  /// statement that gives a node a tag or a link calls ``clothed(_:)``; a rollback empties the
  /// set with the nodes.
  private let bare = BoundedMap<NodeID, Bool>(capacity: NodeCache.capacity)

  func isBare(_ id: NodeID) -> Bool { bare.get(id) != nil }

  func clothed(_ id: NodeID) { bare.remove(id) }

  /// The names of the children of directories made or listed whole since the cache last
  /// started over, each by the key it is matched by (a case variant's by the key of the name it
  /// stands for): a directory made here starts empty, a listed one with the names listed, and
  /// each statement that names a node (an insert, a rename, a move, a change from the cloud)
  /// calls ``placed(under:named:)``, so a name missing from its set is not taken, and the
  /// lookup of an absent name (every new file's, twice for a rename's target) needs no query. Names leaving are not removed: a name in the set
  /// only sends the lookup to the catalog. A rollback empties them with the nodes.
  private let childNames = Mutex<[NodeID: Set<String>]>([:])
  /// Past this many directories the sets start over; a set past `namesPerDirectory` is dropped.
  static let directoriesWithNames = 4_096
  static let namesPerDirectory = 100_000

  /// A directory made in this transaction: no child yet.
  private func madeDirectory(_ id: NodeID) {
    childNames.withLock {
      if $0.count >= Self.directoriesWithNames { $0.removeAll() }
      $0[id] = []
    }
  }

  /// A directory listed whole: `keys` are all its children's names (a directory made before
  /// the cache started over — after a remount, say — gets its set from its first listing).
  /// `keys` is asked only when the set is not kept yet (a listing again costs nothing here).
  func listed(_ id: NodeID, keys: () -> [NameKey]) {
    guard childNames.withLock({ $0[id] == nil }) else { return }
    let keys = keys()
    guard keys.count < Self.namesPerDirectory else { return }
    let names = Set(keys.lazy.map(Self.matchKey))
    childNames.withLock {
      guard $0[id] == nil else { return }
      if $0.count >= Self.directoriesWithNames { $0.removeAll() }
      $0[id] = names
    }
  }

  /// A node of `parentID` is now named `key`.
  private func namedChild(_ parentID: NodeID, _ key: NameKey) {
    let base = Self.matchKey(key)
    childNames.withLock {
      guard $0[parentID] != nil else { return }
      if $0[parentID]!.count >= Self.namesPerDirectory {
        $0[parentID] = nil
      } else {
        $0[parentID]!.insert(base)
      }
    }
  }

  /// True when no child of `parentID` has a name that `key` matches up to case, nor a case
  /// variant of one, as far as the names kept tell; false when they do not tell.
  func hasNoChild(of parentID: NodeID, matching key: NameKey) -> Bool {
    // A key of a case variant's shape matches a narrower range: the catalog answers it.
    guard CaseVariant.splitKey(key.value) == nil else { return false }
    let absent = childNames.withLock { $0[parentID].map { !$0.contains(key.value) } ?? false }
    if absent { absentAnswers.add(1, ordering: .relaxed) }
    return absent
  }

  /// How many directories have their child names kept (tests).
  var directoriesWithNames: Int { childNames.withLock { $0.count } }

  /// How many times ``hasNoChild(of:matching:)`` answered (tests).
  let absentAnswers = Atomic<Int>(0)

  /// The key a child's name is matched by: a case variant's by the name it stands for.
  private static func matchKey(_ key: NameKey) -> String {
    CaseVariant.splitKey(key.value).map { String($0.base) } ?? key.value
  }
}
