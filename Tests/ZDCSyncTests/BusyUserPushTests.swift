import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCSync
import ZDCTestSupport

/// The push while the user is busy: it looks for operations that waited too long, but not so
/// often that its searches (catalog writes, which commit the batch of the user's changes)
/// break up the user's burst; a large upload under way waits between its parts.
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

  /// A started device whose DATA uploads go in parts of 64 KiB, each taking 50 ms in the
  /// store, and whose push sees the user's activity through `activity`.
  func slowPartsDevice(
    _ name: String, _ user: TestUser, _ activity: ActivityMonitor, maxDeferral: TimeInterval
  ) throws -> (Device, FaultInjectingStore, TestStore) {
    let backing = try StoreKind.local.make("zdc-pace-\(name)")
    let store = FaultInjectingStore(backing.store)
    store.inject([.delay(0.05)], into: [.uploadPart], rate: 1)
    let device = try Device(name, user: user, store: store) { push, _ in
      push.activity = activity
      push.quietPeriod = 0.3
      push.maxDeferral = maxDeferral
      push.multipartThreshold = 64 << 10
      push.partSize = 64 << 10
    }
    try device.start()
    return (device, store, backing)
  }

  /// 2 MiB of content (33 parts): unpaced, its parts take about 1.7 s.
  static let largeContent = Data((0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })

  /// A device of `slowPartsDevice` that created `big.bin` while the user was quiet, once its
  /// upload has stored two parts.
  func startedLargeUpload(_ name: String, maxDeferral: TimeInterval) throws -> (
    Device, ActivityMonitor, FaultInjectingStore, TestStore
  ) {
    let user = try TestUser()
    let activity = ActivityMonitor()
    let (device, store, backing) = try slowPartsDevice(
      name, user, activity, maxDeferral: maxDeferral)
    try device.create("big.bin")
    try device.write("big.bin", Self.largeContent)
    let deadline = Date().addingTimeInterval(20)
    while store.counts[.uploadPart, default: 0] < 2 {
      try #require(Date() < deadline, "the upload did not start")
      Thread.sleep(forTimeInterval: 0.005)
    }
    return (device, activity, store, backing)
  }

  /// Keeps the user busy (a request every 20 ms) for `seconds`.
  func stayBusy(_ activity: ActivityMonitor, for seconds: TimeInterval) {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
      activity.touch()
      Thread.sleep(forTimeInterval: 0.02)
    }
  }

  @Test func aLargeUploadWaitsWhileTheUserIsBusyAndGoesOnWhenTheyPause() throws {
    let (device, activity, store, backing) = try startedLargeUpload("wait", maxDeferral: 300)
    defer { withExtendedLifetime(backing) {} }
    activity.touch()
    let before = store.counts[.uploadPart, default: 0]
    stayBusy(activity, for: 1.5)
    // The part being stored when the user came back ends; no other starts. Unpaced, about 30
    // more would have been stored meanwhile.
    let during = store.counts[.uploadPart, default: 0] - before
    #expect(during <= 2)
    // Once the user pauses, the upload goes on by itself (no sync asks for it).
    let deadline = Date().addingTimeInterval(30)
    while try device.operationCount() > 0 {
      try #require(Date() < deadline, "the upload did not go on after the user paused")
      Thread.sleep(forTimeInterval: 0.02)
    }
    #expect(try device.cloudContent("big.bin") == Self.largeContent)
  }

  @Test func aSyncDoesNotWaitForTheUserToPause() throws {
    let (device, activity, _, backing) = try startedLargeUpload("sync", maxDeferral: 300)
    defer { withExtendedLifetime(backing) {} }
    let busy = Thread { self.stayBusy(activity, for: 20) }
    activity.touch()
    busy.start()
    let start = Date()
    try device.sync(15)
    #expect(Date().timeIntervalSince(start) < 10)
    #expect(try device.cloudContent("big.bin") == Self.largeContent)
  }

  @Test func aLargeUploadWaitsNoLongerThanTheLongestDeferral() throws {
    let (device, activity, _, backing) = try startedLargeUpload("bound", maxDeferral: 0.5)
    defer { withExtendedLifetime(backing) {} }
    let start = Date()
    var doneAfter: TimeInterval?
    while Date().timeIntervalSince(start) < 15 {
      activity.touch()
      if try device.operationCount() == 0 {
        doneAfter = Date().timeIntervalSince(start)
        break
      }
      Thread.sleep(forTimeInterval: 0.02)
    }
    // 0.5 s of waiting and about 1.6 s of parts, while the user never pauses.
    let after = try #require(doneAfter, "still uploading after 15 s of a busy user")
    #expect(after >= 0.4)
    #expect(try device.cloudContent("big.bin") == Self.largeContent)
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
