public import Foundation
public import ZDCCore

/// Counts of items and bytes, for one direction of transfer.
public struct TransferCounts: Sendable, Hashable, Codable {
  /// Items waiting to start.
  public var pendingItems = 0
  /// Bytes waiting to start (where known).
  public var pendingBytes: UInt64 = 0
  /// Items being transferred.
  public var inFlightItems = 0
  /// Bytes of in-flight items in total.
  public var inFlightBytes: UInt64 = 0
  /// Bytes of in-flight items already sent or received.
  public var inFlightDoneBytes: UInt64 = 0
  /// Items finished since the engine started.
  public var doneItems = 0
  /// Bytes finished since the engine started.
  public var doneBytes: UInt64 = 0
  /// Items that failed and wait for a retry.
  public var failedItems = 0

  public init() {}
}

/// The progress of one operation (an upload or a download of one node).
public struct OperationProgress: Sendable, Hashable, Codable {
  /// The node concerned.
  public var nodeID: NodeID
  /// What is being done.
  public var kind: String
  /// Bytes in total (0 when unknown).
  public var totalBytes: UInt64
  /// Bytes done.
  public var doneBytes: UInt64

  public init(nodeID: NodeID, kind: String, totalBytes: UInt64, doneBytes: UInt64) {
    self.nodeID = nodeID
    self.kind = kind
    self.totalBytes = totalBytes
    self.doneBytes = doneBytes
  }
}

/// A snapshot of sync progress, overall and per operation.
public struct SyncProgress: Sendable, Hashable, Codable {
  /// Uploads (push operations).
  public var push = TransferCounts()
  /// Downloads.
  public var download = TransferCounts()
  /// Operations now running.
  public var operations: [OperationProgress] = []
  /// When the last pull finished, if any.
  public var lastPull: Date?
  /// The last error seen, if any (redacted: no plaintext names).
  public var lastError: String?

  public init() {}

  /// True when nothing is pending, running or failed in either direction.
  public var isIdle: Bool {
    push.pendingItems == 0 && push.inFlightItems == 0 && push.failedItems == 0
      && download.inFlightItems == 0
  }
}

/// A thread-safe holder of progress that managers update and observers read.
public final class ProgressTracker: @unchecked Sendable {
  private let lock = NSLock()
  private var state = SyncProgress()
  private var observers: [UUID: @Sendable (SyncProgress) -> Void] = [:]

  public init() {}

  /// The current snapshot.
  public var snapshot: SyncProgress { lock.withLock { state } }

  /// Changes the state and notifies observers (outside the lock).
  public func update(_ change: (inout SyncProgress) -> Void) {
    let (s, obs) = lock.withLock { () -> (SyncProgress, [@Sendable (SyncProgress) -> Void]) in
      change(&state)
      return (state, Array(observers.values))
    }
    for o in obs { o(s) }
  }

  /// Registers an observer called after each change; returns a token for `removeObserver`.
  @discardableResult
  public func addObserver(_ body: @escaping @Sendable (SyncProgress) -> Void) -> UUID {
    let id = UUID()
    lock.withLock { observers[id] = body }
    return id
  }

  /// Unregisters an observer.
  public func removeObserver(_ id: UUID) { _ = lock.withLock { observers.removeValue(forKey: id) } }
}
