import CSQLiteTuning
import Foundation
import GRDB
import Synchronization
import ZDCCore
import ZDCCrypto
import ZDCSQLite

/// One row of the disk index, as stored.
struct IndexRow: Sendable {
  var id: Int64
  var pool: DiskPool
  var nodeID: NodeID?
  var version: Int64
  var cloudID: String?
  var eTag: String?
  var fileName: String
  var size: UInt64
  var diskBytes: UInt64
  var lastAccess: Int64
  var dirty: Bool
  var committed: Bool
  var complete: Bool
  var chunks: Data?
  /// A committed staging version whose file is a copy made when its own file went on as the
  /// next version's, written in place: that file (see `DiskManager.stagingFile`). Start-up
  /// falls back to it when the copy did not survive a power loss.
  var origin: String? = nil
  /// The copy is made as it is needed (`CopyBeforeWrite`): its holes are blocks not copied
  /// yet, which `origin` still has unchanged.
  var copiedAsNeeded = false
}

/// The index database (`disk.sqlite`): schema, migrations and the few statements the disk
/// manager runs. Every method runs on the caller's thread through one serialized connection.
final class DiskIndex: Sendable {
  let queue: DatabaseQueue
  let path: String
  /// Rows whose deletion waits for the next write of the index (or ``flushDeletes()``): the
  /// staged file of every deleted node would otherwise cost a transaction of its own.
  private let pendingDeletes = Mutex<[Int64]>([])

  static var migrator: DatabaseMigrator {
    var m = DatabaseMigrator()
    m.registerMigration("v1") { db in
      try db.execute(
        sql: """
          CREATE TABLE entries (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            pool TEXT NOT NULL CHECK (pool IN ('staging', 'cache')),
            nodeID INTEGER,
            version INTEGER NOT NULL DEFAULT 0,
            cloudID TEXT,
            eTag TEXT,
            fileName TEXT NOT NULL UNIQUE,
            size INTEGER NOT NULL,
            diskBytes INTEGER NOT NULL,
            lastAccess INTEGER NOT NULL,
            dirty INTEGER NOT NULL DEFAULT 0,
            committed INTEGER NOT NULL DEFAULT 1,
            complete INTEGER NOT NULL DEFAULT 1,
            chunks BLOB
          );
          CREATE UNIQUE INDEX entries_cache ON entries (cloudID, eTag) WHERE pool = 'cache';
          CREATE INDEX entries_node ON entries (nodeID, version);
          """)
    }
    m.registerMigration("v2") { db in
      try db.execute(sql: "ALTER TABLE entries ADD COLUMN origin TEXT")
    }
    m.registerMigration("v3") { db in
      try db.execute(
        sql: "ALTER TABLE entries ADD COLUMN copiedAsNeeded INTEGER NOT NULL DEFAULT 0")
    }
    return m
  }

  init(path: String) throws {
    // Before the process's first connection (a no-op afterwards).
    _ = zdc_sqlite_tune_process()
    self.path = path
    walFlush = WALFlush(path: path)
    checkpointer = WALCheckpointer(path: path, synchronous: Self.synchronous)
    var config = Configuration()
    config.busyMode = .timeout(10)
    config.prepareDatabase { db in
      try db.execute(sql: "PRAGMA journal_mode = WAL")
      try db.execute(sql: "PRAGMA synchronous = \(Self.synchronous)")
    }
    queue = try DatabaseQueue(path: path, configuration: config)
    try Self.migrator.migrate(queue)
    // A checkpoint on the writer would hold the disk manager's lock through its flushes, and
    // with it every commit of a closed file.
    queue.inDatabase { checkpointer.install(on: $0) }
  }

  deinit { queue.inDatabase { checkpointer.uninstall(from: $0) } }

  /// The index's connections' `synchronous` level.
  private static let synchronous = "NORMAL"

  /// Commits are `synchronous=NORMAL`: they survive a crash of the process, and wait in the
  /// write-ahead log for power-loss safety.
  private let walFlush: WALFlush
  /// Makes the checkpoints of the index's log beside its writer.
  private let checkpointer: WALCheckpointer

  /// The flush that makes every commit so far durable (nothing when one already did).
  func pendingFlush() -> PendingFlush {
    queue.inDatabase { walFlush.pending($0) }
  }

  func allRows() throws -> [IndexRow] {
    try queue.read { db in
      try Row.fetchAll(db, sql: "SELECT * FROM entries ORDER BY id").map { r in
        IndexRow(
          id: r["id"], pool: DiskPool(rawValue: r["pool"]) ?? .cache, nodeID: r["nodeID"],
          version: r["version"], cloudID: r["cloudID"], eTag: r["eTag"], fileName: r["fileName"],
          size: UInt64(bitPattern: r["size"]), diskBytes: UInt64(bitPattern: r["diskBytes"]),
          lastAccess: r["lastAccess"], dirty: r["dirty"], committed: r["committed"],
          complete: r["complete"], chunks: r["chunks"], origin: r["origin"],
          copiedAsNeeded: r["copiedAsNeeded"])
      }
    }
  }

  /// Inserts a row (its `id` is ignored) and returns the new id.
  func insert(_ row: IndexRow) throws -> Int64 {
    try insert([row])[0]
  }

  /// Inserts rows (their `id`s are ignored) in one transaction; returns their new ids.
  func insert(_ rows: [IndexRow]) throws -> [Int64] {
    try write { db in
      let stmt = try db.cachedStatement(
        sql: """
          INSERT INTO entries (pool, nodeID, version, cloudID, eTag, fileName, size, diskBytes,
            lastAccess, dirty, committed, complete, chunks, origin, copiedAsNeeded)
          VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
          """)
      var ids: [Int64] = []
      for row in rows {
        // SQLite's C API directly (see `Statement.runRaw`): the index has no observer.
        try stmt.runRaw([
          row.pool.rawValue, row.nodeID, row.version, row.cloudID, row.eTag, row.fileName,
          Int64(bitPattern: row.size), Int64(bitPattern: row.diskBytes), row.lastAccess,
          row.dirty, row.committed, row.complete, row.chunks, row.origin, row.copiedAsNeeded,
        ]) { _ in false }
        ids.append(db.lastInsertedRowID)
      }
      return ids
    }
  }

  /// Rewrites every column of an existing row.
  func update(_ row: IndexRow) throws {
    try write { db in
      try db.cachedStatement(
        sql: """
          UPDATE entries SET pool = ?, nodeID = ?, version = ?, cloudID = ?, eTag = ?,
            size = ?, diskBytes = ?, lastAccess = ?, dirty = ?, committed = ?, complete = ?,
            chunks = ?
          WHERE id = ?
          """
      ).execute(
        arguments: [
          row.pool.rawValue, row.nodeID, row.version, row.cloudID, row.eTag,
          Int64(bitPattern: row.size), Int64(bitPattern: row.diskBytes), row.lastAccess,
          row.dirty, row.committed, row.complete, row.chunks, row.id,
        ])
    }
  }

  /// Gives a row another file (and records the one it had as its `origin`, and whether the
  /// new one is a copy made as it is needed).
  func moveFile(id: Int64, to fileName: String, origin: String?, copiedAsNeeded: Bool = false)
    throws
  {
    try write { db in
      try db.cachedStatement(
        sql: "UPDATE entries SET fileName = ?, origin = ?, copiedAsNeeded = ? WHERE id = ?"
      )
      .execute(arguments: [fileName, origin, copiedAsNeeded, id])
    }
  }

  func delete(ids: [Int64]) throws {
    guard !ids.isEmpty else { return }
    try queue.write { db in try deleteRows(ids, db) }
  }

  /// Deletes rows with the next write of the index. Until then a crash leaves them listed
  /// (their files may be gone: the next start drops such rows).
  func deleteSoon(ids: [Int64]) {
    guard !ids.isEmpty else { return }
    pendingDeletes.withLock { $0 += ids }
  }

  /// Deletes the rows ``deleteSoon(ids:)`` left now.
  func flushDeletes() throws {
    guard pendingDeletes.withLock({ !$0.isEmpty }) else { return }
    try write { _ in }
  }

  /// One transaction: the deletions waiting, then `body`.
  private func write<T>(_ body: (Database) throws -> T) throws -> T {
    let ids = pendingDeletes.withLock { ids in
      defer { ids.removeAll() }
      return ids
    }
    do {
      return try queue.writeWithoutTransaction { db in
        // Transaction statements prepared once (`write` parses them again every time).
        try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
        do {
          try deleteRows(ids, db)
          let result = try body(db)
          try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
          return result
        } catch {
          if db.isInsideTransaction {
            try? db.cachedStatement(sql: "ROLLBACK TRANSACTION").execute()
          }
          throw error
        }
      }
    } catch {
      // Rolled back: the deletions wait for the next write.
      pendingDeletes.withLock { $0 = ids + $0 }
      throw error
    }
  }

  private func deleteRows(_ ids: [Int64], _ db: Database) throws {
    guard !ids.isEmpty else { return }
    let stmt = try db.cachedStatement(sql: "DELETE FROM entries WHERE id = ?")
    for id in ids { try stmt.runRaw([id]) { _ in false } }
  }

  /// Stores a batch of access times in one transaction.
  func setLastAccess(_ ticks: [(Int64, Int64)]) throws {
    guard !ticks.isEmpty else { return try flushDeletes() }
    try write { db in
      let stmt = try db.cachedStatement(sql: "UPDATE entries SET lastAccess = ? WHERE id = ?")
      for (id, tick) in ticks { try stmt.runRaw([tick, id]) { _ in false } }
    }
  }
}
