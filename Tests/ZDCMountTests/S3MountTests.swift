import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// Two `zdc mount` processes on one bucket of a local moto_server, driven with ordinary tools.
@Suite(.serialized, .motoServer) struct S3MountTests {
  /// The store requests a device's daemon made so far (`zdc status --json`), by kind.
  static func requests(_ d: SyncDevice) throws -> [String: Int] {
    let json = try d.run(["status", "--json"]).stdout
    let obj = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
    return try #require(obj?["storeRequests"] as? [String: Int], "\(json)")
  }

  static func total(_ r: [String: Int]) -> Int { r.values.reduce(0, +) }

  /// A tree of a few thousand files copied into one mount arrives whole on a second device,
  /// and nothing in the bucket is plaintext.
  @Test func thousandsOfFilesCopiedInArriveOnASecondDevice() throws {
    let dir = try TemporaryDirectory("zdc-s3-mount")
    defer { SyncMountTests.expectNoFuseMounts(under: dir) }
    let store = try MountStore.s3()
    let tag = UUID().uuidString.prefix(8).lowercased()
    let marker = "zdc-plaintext-marker-\(UUID().uuidString)"

    // The source tree: 20 directories (some nested) of 100 files, 0 to 16 KiB, a few larger.
    let src = dir.path("src")
    let random = try #require(
      FileHandle(forReadingAtPath: "/dev/urandom")?.readData(ofLength: 1 << 20))
    var count = 0
    var names: [String] = []
    for d in 0..<20 {
      let sub = d % 5 == 4 ? "dir-\(tag)-\(d - 1)/nested-\(d)" : "dir-\(tag)-\(d)"
      let folder = src.appendingPathComponent(sub)
      try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
      for f in 0..<100 {
        let name = "report-\(tag)-\(d)-\(f).txt"
        let size = count % 97 == 0 ? 300_000 : (count * 7919) % 16_384
        let start = (count * 104_729) % (random.count - size)
        var content = Data("\(marker) \(name)\n".utf8)
        content.append(random.subdata(in: start..<start + size))
        try content.write(to: folder.appendingPathComponent(name))
        if f % 33 == 0 { names.append(name) }
        count += 1
      }
    }
    #expect(count == 2000)

    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh("cp -r '\(src.path)'/. .")
    try a.sync(timeout: 900)
    let upload = try Self.requests(a)
    print("S3 mount: \(count) files up in \(Self.total(upload)) requests: \(upload)")

    try b.sync(timeout: 900)
    let diff = try b.sh("diff -r '\(src.path)' .")
    #expect(diff.stdout.isEmpty, "\(diff.stdout.prefix(2000))")
    // Listing everything again, once synced, asks the store nothing.
    let before = try Self.requests(b)
    try b.sh("ls -lR . > /dev/null")
    #expect(try Self.requests(b) == before)
    print("S3 mount: \(count) files down in \(Self.total(before)) requests: \(before)")

    #expect(a.unmount()?.status == 0)
    #expect(b.unmount()?.status == 0)
    // Every key lives under the prefix, and no object holds a name or content in plaintext.
    let keys = try store.objectKeys()
    #expect(keys.count > count)
    #expect(keys.allSatisfy { $0.hasPrefix("\(store.prefix)/") })
    try SyncMountTests.expectNoPlaintext(
      [Data(marker.utf8), Data(tag.utf8)] + names.map { Data($0.utf8) }, store: store,
      devices: [a, b])
  }

  /// `zdc mount --transfers 12` runs twelve uploads at once, and the S3 store lets them all
  /// through (its transport allowed 8 requests at once, and the push 6 uploads, before).
  @Test func transfersSetHowManyUploadsRunAtOnce() throws {
    let dir = try TemporaryDirectory("zdc-s3-transfers")
    defer { SyncMountTests.expectNoFuseMounts(under: dir) }
    let server = try MotoServer.require()
    let store = try MountStore.s3()
    let proxy = try FaultProxy(upstreamPort: server.port)
    defer { proxy.stop() }
    let a = try SyncDevice(
      "devA", in: dir, store: store, join: false,
      mountArguments: ["--pull-interval", "3600", "--upload-delay", "0", "--transfers", "12"],
      endpoint: proxy.endpoint)
    defer { a.unmount(wait: false) }
    try a.sh("mkdir d && for i in $(seq 1 60); do echo \"file $i\" > d/f$i; done")
    try a.sync(timeout: 300)
    #expect(proxy.maxConcurrentRequests > 8, "at most \(proxy.maxConcurrentRequests) at once")
    #expect(proxy.maxConcurrentRequests <= 14, "at most \(proxy.maxConcurrentRequests) at once")
    #expect(try a.sh("cat d/f60").stdout == "file 60\n")
  }

  /// A 1 GiB file written through the mount goes up in parts; the daemon is killed (`kill -9`)
  /// in the middle; after a remount the upload resumes without sending a finished part again
  /// (counted by a proxy in front of moto); a second device reads the same bytes back.
  @Test func gigabyteFileResumesAfterKillAndRoundTrips() throws {
    let dir = try TemporaryDirectory("zdc-s3-big")
    defer { SyncMountTests.expectNoFuseMounts(under: dir) }
    let server = try MotoServer.require()
    let store = try MountStore.s3()
    let proxy = try FaultProxy(upstreamPort: server.port)
    defer { proxy.stop() }
    var clock = Date()
    func phase(_ name: String) {
      print("S3 mount, 1 GiB: \(name) took \(Int(-clock.timeIntervalSinceNow)) s")
      clock = Date()
    }
    let size = 1 << 30
    let source = dir.path("big.src")
    let made = try runProcess(
      URL(fileURLWithPath: "/bin/sh"),
      ["-c", "head -c \(size) /dev/urandom > '\(source.path)' && sha256sum '\(source.path)'"])
    try #require(made.status == 0, "\(made.stderr)")
    let sha = String(made.stdout.prefix(64))
    let needle = try #require(FileHandle(forReadingAtPath: source.path)).readData(ofLength: 64)

    let a = try SyncDevice("devA", in: dir, store: store, join: false, endpoint: proxy.endpoint)
    defer { a.unmount(wait: false) }
    phase("making the file")
    try a.sh("cp '\(source.path)' huge-movie.bin")
    phase("copying it in")

    // Wait for a good part of the upload, then kill the daemon.
    var finished: [FaultProxy.PartUpload] = []
    for _ in 0..<6000 {
      finished = proxy.partUploads.filter { $0.status == 200 }
      if finished.count >= 24 { break }
      usleep(50_000)
    }
    try #require(finished.count >= 24, "the upload did not get going: \(proxy.requestCounts)")
    phase("uploading 24 parts")
    try a.killServingProcess()
    // Parts that reached moto, whether or not the killed daemon heard back.
    let sentBefore = proxy.partUploads
    let done = Set(sentBefore.filter { $0.status == 200 }.map { "\($0.uploadID) \($0.partNumber)" })
    let uploadIDs = Set(sentBefore.map(\.uploadID))
    #expect(uploadIDs.count == 1)
    #expect(proxy.requestCount(.completeMultipartUpload) == 0)
    let createsBefore = proxy.requestCount(.createMultipartUpload)
    let listPartsBefore = proxy.requestCount(.listParts)

    try a.mount()
    try a.sync(timeout: 1800)
    phase("remounting and uploading the rest")
    let sentAfter = Array(proxy.partUploads.dropFirst(sentBefore.count))
    let resent = sentAfter.filter { done.contains("\($0.uploadID) \($0.partNumber)") }
    #expect(resent.isEmpty, "finished parts sent again: \(resent.map(\.partNumber))")
    #expect(Set(sentAfter.map(\.uploadID)).isSubset(of: uploadIDs), "a new upload was started")
    #expect(proxy.requestCount(.createMultipartUpload) == createsBefore)
    #expect(proxy.requestCount(.listParts) > listPartsBefore)
    #expect(proxy.requestCount(.completeMultipartUpload) == 1)
    // Every part number from 1 to the last went up exactly once in all (retries aside).
    let numbers = Set(sentBefore.filter { $0.status == 200 }.map(\.partNumber))
      .union(sentAfter.filter { $0.status == 200 }.map(\.partNumber))
    let parts = (size + (1 << 20)) / (8 << 20) + 1
    #expect(numbers == Set(1...numbers.count) && (parts - 1...parts).contains(numbers.count))
    print(
      "S3 mount: 1 GiB in \(numbers.count) parts; killed after \(done.count), "
        + "\(sentAfter.count) sent after the remount")

    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync(timeout: 600)
    let read = try b.sh("sha256sum huge-movie.bin")
    #expect(read.stdout.prefix(64) == sha)
    phase("reading it on a second device")
    #expect(a.unmount()?.status == 0)
    #expect(b.unmount()?.status == 0)
    try SyncMountTests.expectNoPlaintext(
      [needle, Data("huge-movie".utf8)], store: store, devices: [a, b])
    phase("looking for plaintext")
  }
}
