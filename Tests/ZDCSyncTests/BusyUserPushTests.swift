import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCSync
import ZDCTestSupport

/// The push while the user is busy: it looks for operations that waited too long, but not so
/// often that its searches (catalog writes, which commit the batch of the user's changes)
/// break up the user's burst.
@Suite struct BusyUserPushTests {
  /// A started device whose push sees the user's activity through `activity`.
  func busyDevice(
    _ name: String, _ user: TestUser, _ activity: ActivityMonitor, quietPeriod: TimeInterval,
    maxDeferral: TimeInterval = 300
  ) throws -> (Device, TestStore) {
    let store = try StoreKind.local.make("zdc-busy-\(name)")
    let device = try Device(name, user: user, store: store.store) { push, _ in
      push.activity = activity
      push.quietPeriod = quietPeriod
      push.maxDeferral = maxDeferral
    }
    try device.start()
    return (device, store)
  }

  @Test func searchesWhileTheUserIsBusyDoNotCommitTheirBatchEachPoll() throws {
    let user = try TestUser()
    let activity = ActivityMonitor()
    let (device, store) = try busyDevice("push", user, activity, quietPeriod: 1)
    defer { withExtendedLifetime(store) {} }
    try device.create("seed", "settled before the burst")
    try device.sync()
    let before = device.catalog.committedBatches
    // A burst of 1.5 s: a `.soon` create every 10 ms, each a request of the user. The push
    // polls every 20 ms.
    let end = Date().addingTimeInterval(1.5)
    var n = 0
    while Date() < end {
      activity.touch()
      let path = try device.path("burst-\(n)")
      try device.catalog.write(user.userID, commit: .soon) { tx in
        _ = try tx.createNode(path: path)
      }
      n += 1
      Thread.sleep(forTimeInterval: 0.01)
    }
    // One search at the start of the burst may commit; one each poll would be about 75.
    #expect(device.catalog.committedBatches - before <= 2, "\(n) writes")
    // Once the user is quiet, the burst is uploaded.
    try device.sync()
    #expect(try device.catalog.read(user.userID) { try $0.allOperations() }.isEmpty)
  }

  @Test func operationsThatWaitedTheLongestDeferralGoWhileTheUserStaysBusy() throws {
    let user = try TestUser()
    let activity = ActivityMonitor()
    let (device, store) = try busyDevice(
      "deferral", user, activity, quietPeriod: 60, maxDeferral: 1)
    defer { withExtendedLifetime(store) {} }
    activity.touch()
    let start = Date()
    try device.create("waited", "uploaded although the user never paused")
    func pending() throws -> Int {
      try device.catalog.read(user.userID) { try $0.allOperations() }.count
    }
    var uploadedAfter: TimeInterval?
    while Date().timeIntervalSince(start) < 8 {
      activity.touch()
      if try pending() == 0 {
        uploadedAfter = Date().timeIntervalSince(start)
        break
      }
      Thread.sleep(forTimeInterval: 0.02)
    }
    let after = try #require(uploadedAfter, "still pending after 8 s of a busy user")
    #expect(after >= 0.9)
  }
}
