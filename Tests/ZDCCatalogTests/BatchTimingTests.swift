import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

/// When a batch of `.soon` writes commits: a window after it opened while writes pause, later
/// while they keep coming (a burst's commits would stop every write behind them), but never
/// later than ``Catalog/batchBusyWindows`` windows.
@Suite struct BatchTimingTests {
  let user = "alice"

  func open(_ dir: URL, window: Double) throws -> Catalog {
    let catalog = try Catalog(
      path: dir.appendingPathComponent("catalog.sqlite").path,
      options: Catalog.Options(durability: .normal, batchWindow: window))
    try catalog.createLocalUser(makeUser(user))
    return catalog
  }

  /// `.soon` creates, one every 10 ms, for `seconds`; returns how many.
  func burst(_ catalog: Catalog, seconds: Double, tag: String) throws -> Int {
    let end = Date().addingTimeInterval(seconds)
    var n = 0
    while Date() < end {
      try catalog.write(user, commit: .soon) { tx in _ = try tx.createNode(path: p("\(tag)-\(n)")) }
      n += 1
      Thread.sleep(forTimeInterval: 0.01)
    }
    return n
  }

  /// Waits up to `seconds` for `condition`.
  func eventually(_ seconds: Double, _ condition: () -> Bool) -> Bool {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
      if condition() { return true }
      Thread.sleep(forTimeInterval: 0.01)
    }
    return condition()
  }

  @Test func aBurstKeepsItsBatchOpenPastTheWindowAndItCommitsOnceTheWritesPause() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    // A window of 0.1 s: ten windows pass during the burst, which commits at most at 1 s.
    let catalog = try open(dir, window: 0.1)
    let before = catalog.committedBatches
    let n = try burst(catalog, seconds: 0.8, tag: "a")
    // Committing each window would have made about eight commits. (One pause of the test's
    // thread longer than the 0.1 s of quiet, on a loaded machine, may end the batch early.)
    #expect(catalog.committedBatches - before <= 1, "\(n) writes")
    #expect(eventually(3) { !catalog.hasOpenBatch })
    #expect(catalog.committedBatches - before >= 1)
    // Committed: a fresh connection of another process would see every write.
    let reopened = try Catalog(
      path: dir.appendingPathComponent("catalog.sqlite").path,
      options: Catalog.Options(durability: .normal, batchWindow: 3600))
    let count = try reopened.read(user) { tx in
      try tx.children(of: try #require(try tx.trunkNode(.home)).id).count
    }
    #expect(count == n)
    #expect(reopened.replayedJournalEntries == 0)
  }

  @Test func batchesCommittedBeforeTheirWindowLeaveOneTimer() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    // A database's transactions in the mount: each `.soon` write (a commit) is followed by an
    // `fsync`, which commits the batch; the next write opens another.
    let catalog = try open(dir, window: 0.05)
    let before = catalog.committedBatches
    let end = Date().addingTimeInterval(1)
    var n = 0
    while Date() < end {
      try catalog.write(user, commit: .soon) { tx in _ = try tx.createNode(path: p("c-\(n)")) }
      try catalog.commitPending()
      n += 1
      Thread.sleep(forTimeInterval: 0.002)
    }
    #expect(catalog.committedBatches - before >= n)
    #expect(eventually(3) { !catalog.hasOpenBatch })
    Thread.sleep(forTimeInterval: 0.3)
    // One timer, checking about once per window (and once per pause of the writes' quiet)
    // for a second of writes: about 20 firings. A timer per batch, each checking until the
    // writes paused, fired thousands of times.
    #expect(n > 100)
    #expect(catalog.batchTimerFirings < 100, "\(catalog.batchTimerFirings) firings, \(n) batches")
  }

  @Test func aBurstLongerThanTheBusyWindowsCommitsMeanwhile() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    // A window of 0.05 s: a batch that waits for a pause commits after 0.5 s at the latest.
    let catalog = try open(dir, window: 0.05)
    let before = catalog.committedBatches
    _ = try burst(catalog, seconds: 2.2, tag: "b")
    #expect(catalog.committedBatches - before >= 2)
  }

  @Test func writesThatPauseCommitAWindowAfterTheBatchOpened() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let catalog = try open(dir, window: 0.2)
    let before = catalog.committedBatches
    try catalog.write(user, commit: .soon) { tx in _ = try tx.createNode(path: p("one")) }
    #expect(catalog.committedBatches == before)
    #expect(eventually(2) { catalog.committedBatches == before + 1 })
  }
}
