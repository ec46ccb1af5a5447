public import GRDB
import Synchronization

/// Which commits of a write-ahead-log database (`synchronous=NORMAL`: a commit survives a crash
/// of the process and reaches stable storage with the log's next flush) are known to be on
/// stable storage, counted in the writer connection's changes (`sqlite3_total_changes`).
///
/// The main database file never needs a flush of its own here: a checkpoint flushes it before
/// the log starts over.
public final class WALFlush: Sendable {
  /// The database file's path.
  public let path: String
  private let flushed = Mutex<Int?>(nil)

  public init(path: String) { self.path = path }

  /// The flush that makes every commit of `db` (the writer connection) so far durable: the log,
  /// or nothing when no change was made since a flush that covered them all.
  public func pending(_ db: Database) -> PendingFlush {
    let count = db.totalChangesCount
    let clean = flushed.withLock { $0.map { count <= $0 } ?? false }
    return PendingFlush(paths: clean ? [] : [path + "-wal"], mark: clean ? nil : (self, count))
  }

  fileprivate func didFlush(_ count: Int) {
    flushed.withLock { $0 = max($0 ?? count, count) }
  }
}

/// Files to flush to make some commits durable; ``done()`` after they were flushed.
public struct PendingFlush: Sendable {
  /// The files, for `LocalDurability.sync(paths:before:)`.
  public let paths: [String]
  fileprivate let mark: (WALFlush, Int)?

  /// Nothing to flush.
  public static let none = PendingFlush(paths: [], mark: nil)

  fileprivate init(paths: [String], mark: (WALFlush, Int)?) {
    self.paths = paths
    self.mark = mark
  }

  /// Records that ``paths`` were flushed.
  public func done() { mark.map { $0.0.didFlush($0.1) } }
}
