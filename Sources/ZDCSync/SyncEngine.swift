public import Foundation
public import ZDCCatalog
public import ZDCCore

/// Push and pull for one local user, as one object (the seeds' headless framework).
public final class SyncEngine: Sendable {
  /// The push side.
  public let push: PushManager
  /// The pull side.
  public let pull: PullManager
  /// Progress of both.
  public let progress: ProgressTracker

  /// An engine for one local user of `catalog`, syncing with `store`.
  public init(
    catalog: Catalog, store: any CloudStore, account: SyncAccount, delegate: any SyncDelegate,
    push pushConfiguration: PushConfiguration, pull pullConfiguration: PullConfiguration = .init(),
    progress: ProgressTracker = ProgressTracker()
  ) throws {
    self.progress = progress
    push = try PushManager(
      catalog: catalog, store: store, account: account, delegate: delegate, progress: progress,
      configuration: pushConfiguration)
    pull = try PullManager(
      catalog: catalog, store: store, account: account, delegate: delegate, progress: progress,
      configuration: pullConfiguration, push: push)
    let pull = self.pull
    push.onNeedsPull = { pull.pullSoon() }
  }

  /// Starts pushing and periodic pulling.
  public func start() throws {
    try push.start()
    try pull.start()
    pull.pullSoon()
  }

  /// Stops both sides; whatever is left stays queued for the next start.
  public func stop() {
    pull.stop()
    push.stop()
  }

  /// Pushes everything queued, pulls, and returns when both are done (true) or `timeout`
  /// passed (false). Needs `start()` for the push side.
  @discardableResult
  public func syncNow(timeout: TimeInterval = 120) throws -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    // A pull may queue work (conflicts, re-uploads), and a push may need a pull: alternate.
    for _ in 0..<4 {
      guard push.waitUntilIdle(timeout: max(0, deadline.timeIntervalSinceNow)) else {
        return false
      }
      try pull.pull()
      // In sync: nothing left to push, and no pull asked for a full scan to follow (one that
      // could not place everything, e.g. a loop that crossed moves left in the store until a
      // queued move breaks it).
      let queued = try push.context.catalog.read(push.context.userID) { try $0.operationCount() }
      if queued == 0, try !pull.fullScanDue { return true }
    }
    return push.waitUntilIdle(timeout: max(0, deadline.timeIntervalSinceNow))
  }
}
