public import Foundation
import Logging
public import ZDCCatalog
public import ZDCCore
public import ZDCCrypto

/// Tunables of the push side.
public struct PushConfiguration: Sendable {
  /// Operations run at once.
  public var maxConcurrentOperations: Int
  /// First retry delay after a failure; doubles per failed attempt.
  public var retryBase: TimeInterval
  /// Longest retry delay.
  public var retryCap: TimeInterval
  /// DATA objects at least this large (encoded) are uploaded in parts.
  public var multipartThreshold: UInt64
  /// Size of each part (the last may be smaller); an object that would need more than
  /// ``maxPartCount`` parts gets parts of a multiple of it instead.
  public var partSize: UInt64
  /// The most parts one upload has (S3 takes part numbers 1 to 10,000): with parts of
  /// ``partSize``, an object over 78 GiB would need more.
  public var maxPartCount: Int
  /// Whether DATA objects of at least ``multipartThreshold`` go to a store that writes as it
  /// receives (`StreamingPutStore`: the local folder) in one streamed put instead of in parts
  /// (which the store would copy together again).
  public var streamLargeUploads: Bool
  /// How often the queue is checked for new or due operations.
  public var pollInterval: TimeInterval
  /// Completions within this window share one change-log object.
  public var logBatchWindow: TimeInterval
  /// At most this many entries per change-log object.
  public var logBatchMaxEntries: Int
  /// Where encoded multipart uploads wait (ciphertext only).
  public var workDirectory: URL
  /// How long a data promise may take.
  public var promiseTimeout: TimeInterval
  /// An operation waits until its node has been left alone this long (coalescing a burst of
  /// changes — a build, a copy, an editor's saves — into one upload, and leaving the CPU to
  /// them meanwhile). ``PushManager/waitUntilIdle(timeout:)`` does not wait for it.
  public var settleDelay: TimeInterval
  /// The CPU priority (nice value, 0…19) of the threads that run operations: above 0 they give
  /// way to the application's own work.
  public var workerNice: Int32
  /// The user's activity on the files (the mount's requests). While they are busy (their last
  /// request less than ``quietPeriod`` ago), operations wait — up to ``maxDeferral`` — so that
  /// uploads do not compete with the work that produces them; ``PushManager/waitUntilIdle(timeout:)``
  /// does not wait for quiet.
  public var activity: ActivityMonitor?
  /// See ``activity``.
  public var quietPeriod: TimeInterval
  /// The longest an operation waits for quiet; past it, operations run one at a time meanwhile.
  /// A large DATA upload that started in a pause waits at most as long again between its
  /// pieces once the user is back (see `UploadPacer`).
  public var maxDeferral: TimeInterval
  /// How long a move waits for another device's claim on the node's origin RCRD to go away
  /// before taking it over (that device may have stopped for good in the middle of its move).
  public var moveClaimLease: TimeInterval

  /// The size of the parts of an upload of `size` bytes: ``partSize``, or the smallest multiple
  /// of it that keeps the upload within ``maxPartCount`` parts (a 100 GiB object in parts of
  /// 8 MiB would need 12,800; it gets parts of 16 MiB). A recorded upload resumes with its own.
  public func partSize(forObjectOf size: UInt64) -> UInt64 {
    let unit = max(partSize, 1)
    let parts = UInt64(max(maxPartCount, 1))
    let smallest = size / parts + (size % parts == 0 ? 0 : 1)
    return unit * max(1, smallest / unit + (smallest % unit == 0 ? 0 : 1))
  }

  /// ``maxConcurrentOperations`` by default.
  public static let defaultConcurrentOperations = 6

  public init(
    workDirectory: URL, maxConcurrentOperations: Int = defaultConcurrentOperations,
    retryBase: TimeInterval = 1, retryCap: TimeInterval = 60, multipartThreshold: UInt64 = 10 << 20,
    partSize: UInt64 = 8 << 20, maxPartCount: Int = 10_000,
    streamLargeUploads: Bool = true,
    pollInterval: TimeInterval = 0.5, logBatchWindow: TimeInterval = 0.2,
    logBatchMaxEntries: Int = 500, promiseTimeout: TimeInterval = 60,
    settleDelay: TimeInterval = 0, workerNice: Int32 = 0, activity: ActivityMonitor? = nil,
    quietPeriod: TimeInterval = 1, maxDeferral: TimeInterval = 300,
    moveClaimLease: TimeInterval = 300
  ) {
    self.moveClaimLease = moveClaimLease
    self.workDirectory = workDirectory
    self.maxConcurrentOperations = maxConcurrentOperations
    self.retryBase = retryBase
    self.retryCap = retryCap
    self.multipartThreshold = multipartThreshold
    self.partSize = partSize
    self.maxPartCount = maxPartCount
    self.streamLargeUploads = streamLargeUploads
    self.pollInterval = pollInterval
    self.logBatchWindow = logBatchWindow
    self.logBatchMaxEntries = logBatchMaxEntries
    self.promiseTimeout = promiseTimeout
    self.settleDelay = settleDelay
    self.workerNice = workerNice
    self.activity = activity
    self.quietPeriod = quietPeriod
    self.maxDeferral = maxDeferral
  }
}

/// Runs the persistent push queue: uploads node records and data, moves and deletes, resolves
/// conflicts, and writes the change log (DESIGN §4).
///
/// Work happens on the manager's own threads; the public methods only signal or wait.
public final class PushManager: @unchecked Sendable {
  // Safe: mutable state (`running`, flags) is only touched under `cond`; the rest is immutable.
  let context: SyncContext
  let config: PushConfiguration
  private let cond = NSCondition()
  private var running: Set<Int64> = []
  private var stopped = true
  private var pauseCount = 0
  private var dispatching = false
  private var wake = false
  private var dispatcherDone = DispatchSemaphore(value: 0)
  private var hasDispatcher = false
  private var workers: WorkerPool?
  /// Callers waiting in ``waitUntilIdle(timeout:)``: while any, operations start unsettled.
  private var urgent = 0
  /// When a search of the queue, while the user was busy, for operations that waited
  /// ``PushConfiguration/maxDeferral`` last found none.
  private var lastBusySearch = Date.distantPast
  private var lastProgressCount = Date.distantPast
  private var failedAttempts = 0

  /// How many times an operation or a change-log write has failed (and gone back to wait for a
  /// retry) since the manager started: while it grows and nothing completes, the store is not
  /// taking uploads.
  public var failures: Int { cond.withLock { failedAttempts } }
  private let logQueue = DispatchQueue(label: "zdc.push.changelog")
  private var logScheduled = false
  private var logFailures = 0
  /// The change-log object of the last write whose outcome is unknown (it failed, perhaps after
  /// landing), and the pending entries it held.
  private var logAttempt: (key: String, ids: [Int64])?
  private let ulids = ULIDGenerator()
  /// The RCRDs this device wrote lately, by key: what each says that a DATA upload checks
  /// afterwards (see ``RcrdSummary``).
  let ownRcrds = BoundedMap<String, RcrdSummary>(capacity: 4096)
  /// Uploads that failed in a way that may have written the store: they stay in flight in
  /// the catalog and run again when due (opID → due date, failures so far).
  private var parked: [Int64: (due: Date, failures: Int)] = [:]
  /// Called (on a push thread) when an operation needs a pull first (e.g. a node changed or
  /// vanished remotely).
  public var onNeedsPull: (@Sendable () -> Void)? {
    get { cond.withLock { _onNeedsPull } }
    set { cond.withLock { _onNeedsPull = newValue } }
  }
  private var _onNeedsPull: (@Sendable () -> Void)?
  /// True when a pull side listens (``onNeedsPull`` is set).
  var hasPullSide: Bool { cond.withLock { _onNeedsPull != nil } }

  /// A push manager for one local user of `catalog`.
  public init(
    catalog: Catalog, store: any CloudStore, account: SyncAccount, delegate: any SyncDelegate,
    progress: ProgressTracker = ProgressTracker(), configuration: PushConfiguration
  ) throws {
    context = try SyncContext(
      catalog: catalog, store: store, account: account, delegate: delegate, progress: progress,
      label: "push")
    config = configuration
    try FileManager.default.createDirectory(
      at: configuration.workDirectory, withIntermediateDirectories: true,
      attributes: [.posixPermissions: 0o700])
  }

  /// A push manager for one local user of `catalog`, the identity given field by field.
  public convenience init(
    catalog: Catalog, store: any CloudStore, userID: String, keys: UserKeyPair, deviceID: String,
    deviceName: String, delegate: any SyncDelegate, progress: ProgressTracker = ProgressTracker(),
    configuration: PushConfiguration
  ) throws {
    try self.init(
      catalog: catalog, store: store,
      account: SyncAccount(
        userID: userID, keys: keys, deviceID: deviceID, deviceName: deviceName),
      delegate: delegate, progress: progress, configuration: configuration)
  }

  /// Starts the queue: operations left in flight by a previous run are returned to it first.
  public func start() throws {
    // Started already: nothing to do (a second dispatcher would run beside the first).
    guard cond.withLock({ stopped }) else { return }
    // Uploads left in flight by a crash may have landed: they run again first, still in
    // flight (so a delete of their node meanwhile knows to look for their objects), and adopt
    // what they find of themselves. Other kinds go back to the queue.
    let resumed = try context.catalog.write(context.userID) { tx -> [Int64] in
      let inFlight = try tx.allOperations().filter { $0.state == .inFlight }
      var resumed: [Int64] = []
      for op in inFlight where op.kind == .putRcrd || op.kind == .putData {
        resumed.append(op.id)
      }
      let others = inFlight.filter { !resumed.contains($0.id) }
      if !others.isEmpty {
        for op in others { try tx.failOperation(id: op.id, retryAt: Date()) }
      }
      return resumed
    }
    cond.withLock {
      for id in resumed { parked[id] = (Date(), 0) }
    }
    // The semaphore is handed to the dispatcher thread, never read from the property outside
    // the lock: a later start replaces the property.
    let done = cond.withLock { () -> DispatchSemaphore? in
      guard stopped else { return nil }
      stopped = false
      hasDispatcher = true
      dispatcherDone = DispatchSemaphore(value: 0)
      return dispatcherDone
    }
    guard let done else { return }
    do {
      try cond.withLock {
        if workers == nil {
          workers = try WorkerPool(
            name: "zdc.push.worker", count: config.maxConcurrentOperations,
            nice: config.workerNice)
        }
      }
      try Threads.start(name: "zdc.push.dispatcher") { [self] in
        Threads.lowerPriority(nice: config.workerNice)
        dispatchLoop()
        done.signal()
      }
    } catch {
      cond.withLock {
        stopped = true
        hasDispatcher = false
        workers?.stop()
        workers = nil
      }
      throw error
    }
    scheduleLogFlush(after: 0)
  }

  /// Stops taking operations and waits for the running ones to finish or give up.
  public func stop() {
    let done = cond.withLock { () -> DispatchSemaphore? in
      guard !stopped else { return nil }
      stopped = true
      cond.broadcast()
      return hasDispatcher ? dispatcherDone : nil
    }
    done?.wait()
    cond.withLock {
      while !running.isEmpty { cond.wait() }
      hasDispatcher = false
      workers?.stop()
      workers = nil
    }
  }

  /// True while stopped (operations are not taken).
  public var isStopped: Bool { cond.withLock { stopped } }

  /// Looks at the queue now instead of at the next poll, and writes the change log now.
  public func pushNow() {
    cond.withLock {
      wake = true
      cond.broadcast()
    }
    scheduleLogFlush(after: 0)
  }

  /// Waits until the queue is empty and the change log written, or `timeout` passes.
  /// Returns true when idle.
  @discardableResult
  public func waitUntilIdle(timeout: TimeInterval) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    cond.withLock { urgent += 1 }
    defer { cond.withLock { urgent -= 1 } }
    pushNow()
    while Date() < deadline {
      let busy = cond.withLock { !running.isEmpty || dispatching }
      if !busy,
        let counts = try? context.catalog.read(
          context.userID, { tx in (try tx.operationCount(), try tx.pendingChangeCount()) })
      {
        if counts.0 == 0 && counts.1 == 0 { return true }
        if counts.0 == 0 { scheduleLogFlush(after: 0) }
      }
      Thread.sleep(forTimeInterval: 0.02)
    }
    return false
  }

  /// Runs `body` while no operation runs (the pull applies remote changes this way).
  func whileQuiesced<T>(_ body: () throws -> T) rethrows -> T {
    cond.withLock {
      pauseCount += 1
      while !running.isEmpty || dispatching { cond.wait() }
    }
    defer {
      cond.withLock {
        pauseCount -= 1
        cond.broadcast()
      }
    }
    return try body()
  }

  // MARK: Dispatch

  private func dispatchLoop() {
    while true {
      let slots = cond.withLock { () -> Int? in
        if stopped { return nil }
        if pauseCount > 0 { return 0 }
        let n = config.maxConcurrentOperations - running.count
        if n > 0 { dispatching = true }
        return n
      }
      guard let slots else { break }
      var started = 0
      if slots > 0 {
        let jobs = takeJobs(slots)
        cond.withLock {
          for j in jobs { running.insert(j.op.id) }
          dispatching = false
          cond.broadcast()
        }
        let pool = cond.withLock { workers }
        for job in jobs {
          pool?.submit { [self] in run(job) }
        }
        started = jobs.count
        updateProgress()
      }
      cond.withLock {
        if !stopped && !wake && (started == 0 || running.count >= config.maxConcurrentOperations) {
          _ = cond.wait(until: Date().addingTimeInterval(config.pollInterval))
        }
        wake = false
      }
    }
  }

  /// How long a search of the queue for operations that waited too long, while the user is
  /// busy, waits after one that found none: a tenth of ``PushConfiguration/maxDeferral``, at
  /// most 5 s.
  private var busySearchInterval: TimeInterval { min(config.maxDeferral / 10, 5) }

  private func takeJobs(_ slots: Int) -> [PushJob] {
    let now = Date()
    let due = cond.withLock { () -> [(Int64, Int)] in
      let ids = parked.filter { $0.value.due <= now }.sorted { $0.key < $1.key }.prefix(slots)
      for (id, _) in ids { parked[id] = nil }
      return ids.map { ($0.key, $0.value.failures) }
    }
    var slots = slots
    let settled: Date
    var busySearch = false
    if cond.withLock({ urgent > 0 }) {
      settled = now
    } else if let activity = config.activity,
      activity.secondsSinceLastActivity < config.quietPeriod
    {
      // The user is busy: only operations that waited too long, one at a time. After a
      // search that found none, the next waits ``busySearchInterval`` (a search is a catalog
      // write, which commits the batch of the user's changes: searching every poll made a
      // copy of many files commit twice as often).
      if due.isEmpty {
        let search = cond.withLock { () -> Bool in
          running.isEmpty && now.timeIntervalSince(lastBusySearch) >= busySearchInterval
        }
        if !search { return [] }
      }
      slots = 1
      busySearch = true
      settled = now.addingTimeInterval(-max(config.settleDelay, config.maxDeferral))
    } else {
      settled = now.addingTimeInterval(-config.settleDelay)
    }
    var jobs = takeJobs(slots, due: due, now: now, settledBefore: settled)
    if busySearch {
      cond.withLock { lastBusySearch = jobs.isEmpty ? now : .distantPast }
      // They waited long enough for the user already.
      for i in jobs.indices { jobs[i].paced = false }
    }
    return jobs
  }

  /// Marks up to `slots` ready operations (the `due` parked ones first) in flight and returns
  /// them with what their execution needs.
  private func takeJobs(
    _ slots: Int, due: [(Int64, Int)], now: Date, settledBefore settled: Date
  ) -> [PushJob] {
    do {
      return try context.catalog.write(context.userID) { tx in
        var jobs: [PushJob] = []
        var candidates: [(PushOperation, Int)] = []
        for (id, failures) in due {
          if let op = try tx.operation(id: id) { candidates.append((op, failures)) }
        }
        if candidates.count < slots {
          for op in try tx.readyOperations(
            limit: slots - candidates.count, now: now, settledBefore: settled)
          {
            try tx.markInFlight(op.id)
            candidates.append((op, 0))
          }
        }
        for (op, failures) in candidates {
          var node: Node? = nil
          var location: CloudObjectRef? = nil
          var path: TreesystemPath? = nil
          if let id = op.nodeID, let n = try tx.node(id: id) {
            node = n
            location = try tx.objectLocation(of: id)
            path = try tx.path(of: id)
            // An upload resumed in flight belongs where the node was when it started: a move
            // queued since then (which waits for it) starts from there.
            if op.kind == .putRcrd || op.kind == .putData,
              let origin = try tx.queuedMoveOrigin(ofNodeID: id)
            {
              location = origin
            }
          }
          var taken = op
          taken.state = .inFlight
          taken.attempts += failures
          jobs.append(
            PushJob(op: taken, node: node, location: location, path: path, parkedFailures: failures)
          )
        }
        return jobs
      }
    } catch {
      context.logger.error("push queue read failed", metadata: ["error": "\(error)"])
      return []
    }
  }

  private func run(_ job: PushJob) {
    let executor = PushExecutor(manager: self, job: job)
    do {
      try executor.execute()
      context.logger.debug(
        "push: operation done",
        metadata: [
          "op": "\(job.op.id)", "kind": "\(job.op.kind)",
          "node": "\(job.op.nodeID.map { "\($0)" } ?? "-")",
          "cloudID": "\(job.node?.cloudID ?? job.op.cloudID ?? "-")",
          "key": "\(job.location?.rcrdKey ?? "-")",
        ])
      context.progress.update { $0.push.doneItems += 1 }
    } catch {
      fail(job, error)
    }
    // Entries the job logged are committed now: write them after the batch window.
    scheduleLogFlush(after: config.logBatchWindow)
    cond.withLock {
      running.remove(job.op.id)
      wake = true
      cond.broadcast()
    }
    updateProgress()
  }

  private func fail(_ job: PushJob, _ error: any Error) {
    var immediate = false
    switch error {
    case PushIssue.needsPull:
      if job.op.attempts + job.parkedFailures >= Self.pullsBeforeFullScan {
        // Pulls of the change log did not settle it (what it waits for was announced before, or
        // never): the next pull is a full scan.
        do {
          try context.catalog.write(context.userID) { tx in
            try tx.setSyncValue("1", forKey: PullManager.needsFullScanKey)
          }
        } catch {
          context.logger.error("cannot ask for a full scan", metadata: ["error": "\(error)"])
        }
      }
      requestPull()
    case PushIssue.retryNow:
      immediate = true
    case PushIssue.deferred:
      return  // already back in the queue, waiting for another operation
    default:
      break
    }
    if !immediate { cond.withLock { failedAttempts += 1 } }
    let attempts = immediate ? 0 : job.op.attempts
    let delay =
      immediate ? 0 : min(config.retryCap, config.retryBase * pow(2, Double(min(attempts, 30))))
    let mayHaveWritten: Bool
    switch error {
    case is PushIssue, is CatalogError, is SyncError: mayHaveWritten = false
    default: mayHaveWritten = job.op.kind == .putRcrd || job.op.kind == .putData
    }
    if !immediate {
      context.logger.warning(
        "push operation failed; will retry",
        metadata: [
          "op": "\(job.op.id)", "kind": "\(job.op.kind.rawValue)", "error": "\(error)",
          "retryIn": "\(delay)",
        ])
      context.progress.update { $0.lastError = "\(job.op.kind.rawValue): \(error)" }
    }
    if mayHaveWritten {
      // Keep it in flight: its write may have landed, and a delete of the node must know.
      cond.withLock {
        parked[job.op.id] = (Date().addingTimeInterval(delay), job.parkedFailures + 1)
      }
      return
    }
    do {
      try context.catalog.write(context.userID) { tx in
        try tx.failOperation(id: job.op.id, retryAt: Date().addingTimeInterval(delay))
      }
    } catch {
      context.logger.error("cannot return operation to the queue", metadata: ["error": "\(error)"])
    }
  }

  /// Failures of an operation waiting for a pull after which the pull is a full scan.
  static let pullsBeforeFullScan = 4

  func requestPull() {
    let cb = cond.withLock { _onNeedsPull }
    cb?()
  }

  var isStopping: Bool { cond.withLock { stopped } }

  /// True while something needs the queue to move on: a caller of
  /// ``waitUntilIdle(timeout:)`` (`zdc sync`, an unmount that drains), a pull waiting for the
  /// running operations to end, a stop.
  var queueWanted: Bool { cond.withLock { stopped || urgent > 0 || pauseCount > 0 } }

  /// Publishes the operations in flight, and the queue's length at most every 0.2 s (a count
  /// per started or finished operation made a long queue's upload quadratic).
  private func updateProgress() {
    let (inFlight, countNow) = cond.withLock { () -> (Int, Bool) in
      let due = Date().timeIntervalSince(lastProgressCount) >= 0.2
      if due { lastProgressCount = Date() }
      return (running.count, due)
    }
    let counts =
      countNow ? try? context.catalog.read(context.userID) { tx in try tx.operationCount() } : nil
    context.progress.update {
      $0.push.inFlightItems = inFlight
      if let counts { $0.push.pendingItems = max(0, counts - inFlight) }
    }
  }

  // MARK: Change log

  /// Queues a change-log entry in `tx` (written to the store after the batch window).
  func log(_ entries: [ChangeLogEntry], in tx: CloudTransaction) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = .sortedKeys
    for e in entries { try tx.appendPendingChange(try encoder.encode(e)) }
    // The flush is scheduled by `run` once the transaction has committed.
  }

  func scheduleLogFlush(after delay: TimeInterval) {
    let go = cond.withLock { () -> Bool in
      if logScheduled { return false }
      logScheduled = true
      return true
    }
    guard go else { return }
    logQueue.asyncAfter(deadline: .now() + delay) { [self] in
      cond.withLock { logScheduled = false }
      flushLog()
    }
  }

  /// Writes every pending change-log entry, in objects of at most `logBatchMaxEntries`.
  func flushLog() {
    let decoder = JSONDecoder()
    while true {
      do {
        // A write whose answer was lost may have landed: its entries are not written again
        // under another name (a second copy read after the first was applied is not harmless:
        // a delete read again after its node was kept, uploaded again and moved elsewhere
        // takes it for deleted once more).
        if let attempt = cond.withLock({ logAttempt }) {
          if try context.headIfExists(attempt.key) != nil {
            try context.catalog.write(context.userID) { tx in
              try tx.removePendingChanges(ids: attempt.ids)
            }
          }
          cond.withLock { logAttempt = nil }
        }
        let pending = try context.catalog.read(context.userID) {
          try $0.pendingChanges(limit: config.logBatchMaxEntries)
        }
        if pending.isEmpty {
          cond.withLock { logFailures = 0 }
          return
        }
        var entries: [ChangeLogEntry] = []
        for p in pending {
          if let e = try? decoder.decode(ChangeLogEntry.self, from: p.entry) { entries.append(e) }
        }
        let ulid = ulids.next()
        let name = "\(ulid.string)-\(context.account.deviceID)"
        let key = context.layout.changeKey(ulid: ulid.string, deviceID: context.account.deviceID)
        let body = try ChangeLogCodec.encode(
          entries, deviceID: context.account.deviceID, name: name, key: context.changeLogKey)
        cond.withLock { logAttempt = (key, pending.map(\.id)) }
        _ = try context.store.put(key: key, body: .data(body), condition: .ifNoneMatch)
        try context.catalog.write(context.userID) { tx in
          try tx.removePendingChanges(ids: pending.map(\.id))
        }
        cond.withLock { logAttempt = nil }
      } catch {
        // Counted with the operations' failures too: a store that takes no change-log
        // object is one that takes no uploads (an unmount's drain stops waiting for it).
        let n = cond.withLock { () -> Int in
          logFailures += 1
          failedAttempts += 1
          return logFailures
        }
        let delay = min(config.retryCap, config.retryBase * pow(2, Double(min(n - 1, 30))))
        context.logger.warning(
          "change-log write failed; will retry", metadata: ["error": "\(error)"])
        if !isStopping || n < 3 { scheduleLogFlush(after: delay) }
        return
      }
    }
  }
}

/// An operation taken from the queue with what it needs, read in the same transaction.
struct PushJob: Sendable {
  var op: PushOperation
  var node: Node?
  var location: CloudObjectRef?
  var path: TreesystemPath?
  /// Failures while parked in flight (not counted in `op.attempts`).
  var parkedFailures = 0
  /// Whether a long DATA upload of this job gives way to the user (``UploadPacer``); not for
  /// an operation taken because it waited ``PushConfiguration/maxDeferral`` already.
  var paced = true
}

/// Spreads a long DATA upload (reading, encrypting and writing a large file, then its parts)
/// around the user's work: while they are busy — their last request less than
/// ``PushConfiguration/quietPeriod`` ago — the upload waits between its pieces, as an operation
/// that has not started waits. It goes on when they pause, once it has waited
/// ``PushConfiguration/maxDeferral`` in all, and at once when something needs the queue to move
/// on (``PushManager/waitUntilIdle(timeout:)``, a pull, a stop).
final class UploadPacer {
  private let manager: PushManager
  /// The user's activity, when this job gives way to it.
  private let activity: ActivityMonitor?
  private var waited: UInt64 = 0
  private var noted = false

  init(manager: PushManager, job: PushJob) {
    self.manager = manager
    activity = job.paced ? manager.config.activity : nil
  }

  /// Waits while the user is busy (see ``UploadPacer``); cheap when they are not.
  func giveWay() {
    guard let activity else { return }
    let limit = UInt64(max(0, manager.config.maxDeferral) * 1e9)
    while waited < limit {
      guard let left = activity.remainingUntilQuiet(manager.config.quietPeriod),
        !manager.queueWanted
      else { return }
      if !noted {
        noted = true
        manager.context.logger.debug("push: a DATA upload waits while the user is busy")
      }
      // At most 50 ms at a time, so that a sync, a pull or a stop finds it going on soon.
      let slice = min(left, 0.05, Double(limit - waited) / 1e9)
      let t0 = DispatchTime.now().uptimeNanoseconds
      Thread.sleep(forTimeInterval: max(slice, 0.001))
      waited += DispatchTime.now().uptimeNanoseconds - t0
    }
  }
}

/// Why an operation did not finish (besides store and crypto errors).
enum PushIssue: Error, Sendable {
  /// The node changed or vanished remotely: pull, then retry.
  case needsPull(String)
  /// Run the operation again at once (newer data arrived, a name was freed).
  case retryNow
  /// The operation went back to the queue to wait for another one (see
  /// `CloudTransaction.deferOperation(id:until:)`).
  case deferred
  /// The manager is stopping.
  case stopped
}
