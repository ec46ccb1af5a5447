public import Foundation
public import ZDCCore

/// A promise of node data that the delegate fulfils later, from any thread.
public final class NodeDataPromise: @unchecked Sendable {
  private let condition = NSCondition()
  private var result: Result<NodeData, any Error>?

  public init() {}

  /// Delivers the data. Later calls are ignored.
  public func fulfill(_ data: NodeData) { settle(.success(data)) }

  /// Reports that the data cannot be supplied; the upload is retried later.
  public func reject(_ error: any Error) { settle(.failure(error)) }

  private func settle(_ r: Result<NodeData, any Error>) {
    condition.lock()
    if result == nil { result = r }
    condition.broadcast()
    condition.unlock()
  }

  /// Waits (blocking the calling thread, never a FUSE thread) until settled or `timeout` passes.
  public func wait(timeout: TimeInterval) throws -> NodeData {
    let deadline = Date().addingTimeInterval(timeout)
    condition.lock()
    defer { condition.unlock() }
    while result == nil {
      if !condition.wait(until: deadline) { throw SyncError.dataUnavailable("promise timed out") }
    }
    return try result!.get()
  }
}

/// Where the content of a node comes from when it is uploaded (the seeds' ZDCData).
public enum NodeData: Sendable {
  /// Bytes in memory.
  case data(Data)
  /// A cleartext file, read when the upload runs.
  case cleartextFile(URL)
  /// A CryptoFile (DiskManager staging or cache), opened with `key`.
  case cryptoFile(URL, key: Data)
  /// Supplied later by the delegate.
  case promise(NodeDataPromise)
}

/// Errors of the sync engine.
public enum SyncError: Error, Sendable, Equatable, CustomStringConvertible {
  /// The delegate could not supply a node's data (yet).
  case dataUnavailable(String)
  /// A remote object could not be decoded (malformed, tampered, or not for us).
  case badRemoteObject(key: String, reason: String)
  /// The engine was stopped.
  case stopped
  /// A node vanished while an operation on it was running.
  case nodeGone(NodeID)

  public var description: String {
    switch self {
    case .dataUnavailable(let m): return "node data unavailable: \(m)"
    case .badRemoteObject(let k, let r): return "skipped remote object \(k): \(r)"
    case .stopped: return "sync engine stopped"
    case .nodeGone(let id): return "node \(id) no longer exists"
    }
  }
}
