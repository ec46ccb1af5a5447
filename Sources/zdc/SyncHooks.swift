import Foundation
import ZDCFileSystem
import ZDCSync

/// What the mount needs from the sync engine (PushManager and PullManager).
///
/// `zdc mount` starts it with the engine's delegate, the control socket's `sync` command calls
/// ``syncNow(timeout:)``, `status` reads ``progress``, and unmount calls
/// ``drain(timeout:stall:progress:)`` before the process exits.
protocol MountSyncHooks: AnyObject, Sendable {
  /// Starts pushing and pulling with this delegate.
  func start(delegate: FileSystemSyncDelegate) throws
  /// Pushes everything ready and pulls (`zdc sync`); true when in sync before `timeout`.
  func syncNow(timeout: TimeInterval) throws -> Bool
  /// Waits until the push queue is empty, `timeout` passes, ``cancelDrain()`` is called, or
  /// the uploads stall: nothing completes and no byte goes up for `stall` seconds while
  /// operations keep failing (the store is unreachable). Reports (items, bytes) left about
  /// twice a second. True when the queue is empty.
  func drain(timeout: TimeInterval, stall: TimeInterval, progress: (Int, UInt64) -> Void) -> Bool
  /// Makes a running or later ``drain(timeout:stall:progress:)`` return at once.
  func cancelDrain()
  /// Stops both managers; what is left stays queued for the next mount.
  func stop()
  /// The engine's progress now.
  var progress: SyncProgress { get }
  /// Whether the next pull reads the whole tree (a pull could not place everything it found).
  var fullScanDue: Bool { get }
}

/// ``MountSyncHooks`` over a ``SyncEngine`` pushing to and pulling from the account's store.
final class EngineSyncHooks: MountSyncHooks, @unchecked Sendable {
  // @unchecked: `engine` and `drainCancelled` are only touched under `lock`.
  let make: @Sendable (any SyncDelegate, ProgressTracker) throws -> SyncEngine
  let tracker = ProgressTracker()
  let pendingCount: @Sendable () -> (Int, UInt64)
  private let lock = NSLock()
  private var engine: SyncEngine?
  private var drainCancelled = false

  /// Hooks that build their engine with `make` on ``start(delegate:)``; `pending` counts what
  /// waits for upload (items, bytes).
  init(
    make: @escaping @Sendable (any SyncDelegate, ProgressTracker) throws -> SyncEngine,
    pending: @escaping @Sendable () -> (Int, UInt64)
  ) {
    self.make = make
    pendingCount = pending
  }

  func start(delegate: FileSystemSyncDelegate) throws {
    let e = try make(delegate, tracker)
    try e.start()
    lock.withLock { engine = e }
  }

  func syncNow(timeout: TimeInterval) throws -> Bool {
    guard let e = lock.withLock({ engine }) else { throw CLIError.usage("sync is not running") }
    return try e.syncNow(timeout: timeout)
  }

  func drain(timeout: TimeInterval, stall: TimeInterval, progress: (Int, UInt64) -> Void) -> Bool {
    guard let e = lock.withLock({ engine }) else { return false }
    let deadline = Date().addingTimeInterval(timeout)
    // The last progress seen (items done, bytes up), when, and the failures until then.
    func made() -> (Int, UInt64) {
      let p = tracker.snapshot.push
      return (p.doneItems, p.doneBytes + p.inFlightDoneBytes)
    }
    var last = made()
    var lastAt = Date()
    var failuresThen = e.push.failures
    while true {
      if e.push.waitUntilIdle(timeout: min(0.5, max(0, deadline.timeIntervalSinceNow))) {
        return true
      }
      if lock.withLock({ drainCancelled }) || Date() >= deadline { return false }
      let now = made()
      if now != last {
        (last, lastAt, failuresThen) = (now, Date(), e.push.failures)
      } else if e.push.failures > failuresThen, Date().timeIntervalSince(lastAt) >= stall {
        return false
      }
      let (items, bytes) = pendingCount()
      progress(items, bytes)
    }
  }

  func cancelDrain() { lock.withLock { drainCancelled = true } }

  func stop() {
    let e = lock.withLock { () -> SyncEngine? in
      defer { engine = nil }
      return engine
    }
    e?.stop()
  }

  var progress: SyncProgress { tracker.snapshot }

  var fullScanDue: Bool {
    guard let e = lock.withLock({ engine }) else { return false }
    return (try? e.pull.fullScanDue) ?? false
  }
}
