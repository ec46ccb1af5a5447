import Dispatch
public import GRDB
import GRDBSQLite
import Logging
import Synchronization

/// Checkpoints of a write-ahead-log database, made off its writer connection: on a connection
/// of its own, on a background queue, once the log holds ``threshold`` frames.
///
/// SQLite checkpoints on the connection whose commit took the log past its threshold, inside
/// that commit: the writer then flushes the log, copies its pages into the database and flushes
/// the database before the commit returns. Every statement waiting for the writer waits for
/// those flushes too — a file operation in the mount for as long as the disk takes (300 ms
/// measured on a slow one, in the middle of a copy). A checkpoint on another connection runs
/// beside the writer's transactions (SQLite's write-ahead log lets one checkpointer and one
/// writer work at once), so the writer only notes that one is due.
///
/// The checkpoints are `PASSIVE` (never waiting for a reader or a writer) at the database's own
/// `synchronous` level, so that what a checkpoint copies is on stable storage before the log
/// starts over (see ``WALFlush``).
public final class WALCheckpointer: Sendable {
  /// Log frames (pages) that make a checkpoint due: SQLite's own default.
  public static let threshold: Int32 = 1_000
  /// Log frames past which the writer checkpoints itself after all (the background checkpoints
  /// have fallen behind, or cannot be made).
  public static let writerThreshold: Int32 = 10 * threshold

  private let path: String
  private let synchronous: String
  private let queue = DispatchQueue(label: "zdc.sqlite.checkpoint", qos: .utility)
  /// A checkpoint is queued and has not started yet.
  private let queued = Atomic<Bool>(false)
  /// The checkpoint connection (opened at the first checkpoint) and whether this is closed; on
  /// `queue` only.
  private let state = Mutex<(connection: OpaquePointer?, closed: Bool)>((nil, false))
  private let completed = Atomic<Int>(0)
  private let logger = Logger(label: "zdc.sqlite")

  /// A checkpointer of the database at `path`, whose connections run at `synchronous`
  /// (`NORMAL` or `FULL`).
  public init(path: String, synchronous: String) {
    self.path = path
    self.synchronous = synchronous
  }

  /// How many checkpoints ran to their end (tests).
  public var checkpoints: Int { completed.load(ordering: .relaxed) }

  /// Makes `db` (the writer connection) leave its checkpoints to this checkpointer, until
  /// ``uninstall(from:)``.
  public func install(on db: Database) {
    guard let c = db.sqliteConnection else { return }
    // Retained by the hook until `uninstall` (the hook may run as long as the connection).
    let context = Unmanaged.passRetained(self).toOpaque()
    sqlite3_wal_hook(
      c,
      { context, connection, name, frames in
        if frames >= WALCheckpointer.writerThreshold {
          // The background checkpoints fall behind, or fail: the writer checkpoints, as
          // SQLite would have, so that the log stays bounded.
          sqlite3_wal_checkpoint(connection, name)
        } else if let context, frames >= WALCheckpointer.threshold {
          Unmanaged<WALCheckpointer>.fromOpaque(context).takeUnretainedValue().request()
        }
        return SQLITE_OK
      }, context)
  }

  /// Gives `db` its own checkpoints back and closes the checkpoint connection (after a
  /// checkpoint under way).
  public func uninstall(from db: Database) {
    guard let c = db.sqliteConnection else { return }
    let previous = sqlite3_wal_hook(c, nil, nil)
    sqlite3_wal_autocheckpoint(c, WALCheckpointer.threshold)
    if let previous, previous == Unmanaged.passUnretained(self).toOpaque() {
      Unmanaged<WALCheckpointer>.fromOpaque(previous).release()
    }
    close()
  }

  /// Queues a checkpoint (one at a time: a request while one is queued adds nothing).
  public func request() {
    guard !queued.exchange(true, ordering: .acquiringAndReleasing) else { return }
    queue.async { self.checkpoint() }
  }

  private func checkpoint() {
    queued.store(false, ordering: .releasing)
    state.withLock { s in
      guard !s.closed else { return }
      if s.connection == nil { s.connection = open() }
      guard let c = s.connection else { return }
      var log: Int32 = 0
      var copied: Int32 = 0
      let rc = sqlite3_wal_checkpoint_v2(c, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &copied)
      if rc == SQLITE_OK {
        completed.add(1, ordering: .relaxed)
      } else if rc != SQLITE_BUSY {
        logger.error("checkpoint of \(path): \(String(cString: sqlite3_errmsg(c)))")
      }
    }
  }

  /// The checkpoint connection, or `nil` (logged) when it cannot be opened.
  private func open() -> OpaquePointer? {
    var c: OpaquePointer?
    var rc = sqlite3_open_v2(
      path, &c, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE, nil)
    if rc == SQLITE_OK {
      rc = sqlite3_exec(c, "PRAGMA synchronous = \(synchronous)", nil, nil, nil)
    }
    guard rc == SQLITE_OK, let c else {
      let message = c.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
      logger.error("checkpoint connection to \(path): \(message)")
      sqlite3_close_v2(c)
      return nil
    }
    return c
  }

  private func close() {
    queue.sync {
      state.withLock { s in
        s.closed = true
        if let c = s.connection { sqlite3_close_v2(c) }
        s.connection = nil
      }
    }
  }
}
