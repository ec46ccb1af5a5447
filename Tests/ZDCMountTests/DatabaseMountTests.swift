import Foundation
import Testing
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// A SQLite database in the mount (Python's `sqlite3`, rollback journal): each transaction
/// writes a few pages of the database after the last one's `fsync`, the path where a new
/// version goes on in the committed version's own file, in place. A `kill -9` of the daemon in
/// the middle of a transaction (its pages partly written over the database, its journal
/// flushed) leaves the committed transactions and an intact database after the remount, and
/// the database reaches another device.
@Suite(.serialized) struct DatabaseMountTests {
  static let transactions = 150

  /// Python: a 2,000-row table and a counter, then `transactions` committed transactions (the
  /// database as they left it copied out of the mount), then one that spills pages into the
  /// database and waits, uncommitted, for the kill.
  static let writer = """
    import shutil, sqlite3, sys, time
    db = sqlite3.connect('db.sqlite', isolation_level=None)
    db.execute('create table t(id integer primary key, b blob)')
    db.execute('create table c(n integer)')
    db.execute('begin')
    db.executemany('insert into t values(?, randomblob(1000))', [(i,) for i in range(2000)])
    db.execute('insert into c values(0)')
    db.execute('commit')
    for i in range(\(transactions)):
        db.execute('begin')
        db.execute('update t set b = randomblob(1000) where id = ?', ((i * 37) % 2000,))
        db.execute('update c set n = n + 1')
        db.execute('commit')
    shutil.copyfile('db.sqlite', sys.argv[2])
    db.execute('pragma cache_size = 1')
    db.execute('begin')
    db.execute('update t set b = randomblob(1000)')
    db.execute('update c set n = -1')
    open(sys.argv[1], 'w').close()
    time.sleep(120)
    """

  static let check = """
    import sqlite3
    db = sqlite3.connect('db.sqlite')
    print(db.execute('pragma integrity_check').fetchone()[0], db.execute('select n from c').fetchone()[0], db.execute('select count(*) from t').fetchone()[0])
    """

  @Test func aDatabaseSurvivesAKillInTheMiddleOfATransactionAndSyncs() throws {
    let dir = try TemporaryDirectory("zdc-db")
    defer { SyncMountTests.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    let script = dir.path("writer.py")
    let checker = dir.path("check.py")
    let ready = dir.path("ready")
    try Self.writer.write(to: script, atomically: true, encoding: .utf8)
    try Self.check.write(to: checker, atomically: true, encoding: .utf8)
    let pidFile = dir.path("writer.pid")
    let committed = dir.path("committed.sqlite")
    try a.sh(
      "python3 '\(script.path)' '\(ready.path)' '\(committed.path)' >/dev/null 2>&1 & "
        + "echo $! > '\(pidFile.path)'")
    let writer = pid_t(
      try String(contentsOf: pidFile, encoding: .utf8).trimmingCharacters(
        in: .whitespacesAndNewlines))
    defer {
      if let writer { kill(writer, SIGKILL) }
    }
    for _ in 0..<1200 where !FileManager.default.fileExists(atPath: ready.path) {
      usleep(50_000)
    }
    try #require(FileManager.default.fileExists(atPath: ready.path))
    // The daemon first (the transaction open), then the program that had the database open.
    let daemon = try #require(a.pid)
    kill(daemon, SIGKILL)
    for _ in 0..<200 where SyncDevice.isAlive(daemon) { usleep(50_000) }
    if let writer {
      kill(writer, SIGKILL)
      for _ in 0..<100 where SyncDevice.isAlive(writer) { usleep(50_000) }
    }
    try a.killServingProcess()
    try a.mount()
    // Exactly the database as its last transaction committed it: the pages the next one wrote
    // in place went with the uncommitted version (SQLite's journal is not needed to undo them).
    #expect(try Data(contentsOf: a.file("db.sqlite")) == Data(contentsOf: committed))
    let r = try a.sh("python3 '\(checker.path)'")
    #expect(
      r.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok \(Self.transactions) 2000")

    try a.sync()
    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync()
    let rb = try b.sh("python3 '\(checker.path)'")
    #expect(
      rb.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok \(Self.transactions) 2000")
    #expect(a.unmount()?.status == 0)
    #expect(b.unmount()?.status == 0)
  }
}
