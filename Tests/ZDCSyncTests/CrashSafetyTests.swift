import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

/// A running helper device whose output lines are collected as they come.
final class HelperRun: @unchecked Sendable {
  // Safe: `process` is set once; the output goes through a locked `LineBox`.
  let process: ChildProcess
  private let box: LineBox
  /// Signalled by the reader at the end of the output.
  private let drained: DispatchSemaphore

  init(_ args: [String], environment: [String: String] = [:]) throws {
    process = try ChildProcess(
      BuiltProducts.executable("zdc-testhelper").path, args,
      environment: ProcessInfo.processInfo.environment.merging(environment) { $1 },
      stdout: .pipe)
    let fd = process.stdoutFD
    let box = LineBox()
    let drained = DispatchSemaphore(value: 0)
    self.box = box
    self.drained = drained
    try Threads.start(name: "test.helper.out") {
      ChildProcess.forEachChunk(fd) { box.append($0) }
      drained.signal()
    }
  }

  var lines: [String] { box.lines }

  func kill() {
    process.stop()
  }

  func wait(timeout: TimeInterval) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
    if process.isRunning {
      kill()
      return false
    }
    // The whole output (a grandchild holding the pipe would keep it open: bounded).
    _ = drained.wait(timeout: .now() + 5)
    return true
  }

  deinit {
    process.stop()
    // The reader reads from the pipe the process object closes.
    _ = drained.wait(timeout: .now() + 5)
  }
}

final class LineBox: @unchecked Sendable {
  // Safe: only touched under `lock`.
  private let lock = NSLock()
  private var buffer = Data()
  private var _lines: [String] = []
  func append(_ d: Data) {
    lock.withLock {
      buffer.append(d)
      while let nl = buffer.firstIndex(of: 10) {
        _lines.append(String(decoding: buffer[buffer.startIndex..<nl], as: UTF8.self))
        buffer.removeSubrange(buffer.startIndex...nl)
      }
    }
  }
  var lines: [String] { lock.withLock { _lines } }
}

@Suite(.serialized, .motoServer) struct CrashSafetyTests {
  @Test(arguments: StoreKind.all)
  func killedDeviceStillPushesEveryAcknowledgedChangeExactlyOnce(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-crash-store")
    let stateDir = try makeStoreDirectory("zdc-crash-state")
    // On S3 the helper talks to moto through a counting proxy, which shows when a multipart
    // upload is under way; on the local folder, a big file's DATA goes up in one streamed put,
    // which shows as a growing unnamed file the helper has open in the store's `.zdc-tmp/`.
    let proxy = try backing.server.map { try FaultProxy(upstreamPort: $0.port) }
    defer { proxy?.stop() }
    var storeArgument = backing.dir?.url.path ?? ""
    var environment: [String: String] = [:]
    if let proxy, let server = backing.server, let bucket = backing.bucket {
      storeArgument = "s3://\(bucket)"
      environment = [
        "AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ENDPOINT_URL_S3": "", "AWS_REGION": "us-east-1",
        "AWS_PROFILE": "", "AWS_ACCESS_KEY_ID": server.credentials.accessKeyID,
        "AWS_SECRET_ACCESS_KEY": server.credentials.secretAccessKey, "AWS_SESSION_TOKEN": "",
      ]
    }
    let temporaries = backing.dir?.url.appendingPathComponent(".zdc-tmp").path ?? ""
    // How far the big files' uploads under way have got (nil when none is): on S3 the parts
    // stored while a multipart upload is open (an upload a killed run left open stays, so a
    // round looks for progress made since it began), on the local folder the bytes of the
    // temporary files the helper `pid` has open in `.zdc-tmp/` (unnamed, seen through
    // /proc/PID/fd; the only ones over 64 KiB: the other files are at most 3 KB).
    func largeUploadProgress(_ pid: Int32) -> Int? {
      if let proxy {
        guard !proxy.openUploads.isEmpty else { return nil }
        return proxy.partUploads.filter { (200..<300).contains($0.status) }.count
      }
      let fds = "/proc/\(pid)/fd"
      let entries = (try? FileManager.default.contentsOfDirectory(atPath: fds)) ?? []
      let sizes = entries.compactMap { entry -> Int? in
        guard
          let target = try? FileManager.default.destinationOfSymbolicLink(
            atPath: fds + "/" + entry),
          target.hasPrefix(temporaries + "/")
        else { return nil }
        var st = stat()
        guard stat(fds + "/" + entry, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
          return nil
        }
        return st.st_size > 64 << 10 ? Int(st.st_size) : nil
      }
      return sizes.isEmpty ? nil : sizes.reduce(0, +)
    }
    let args = [
      "device", stateDir.url.path, storeArgument, "11", "70", "4",
    ]
    var acked: [Int] = []
    var rng = SplitMix64(seed: 99)
    var killedDuringLargeUpload = 0
    let rounds = 24
    for round in 0..<rounds {
      let run = try HelperRun(args, environment: environment)
      // A big file's upload seen under way ends the round a moment later, whenever it is seen:
      // uploads run beside the changes, and after the last change they are all there is.
      var sawLargeUpload = false
      let pid = run.process.pid
      let progressBefore = largeUploadProgress(pid) ?? 0
      func largeUploadSeen() -> Bool {
        guard killedDuringLargeUpload < 4, let progress = largeUploadProgress(pid),
          progress > progressBefore
        else {
          return false
        }
        sawLargeUpload = true
        Thread.sleep(forTimeInterval: Double(rng.next() % 20) / 1000)
        return true
      }
      // Random time after the device got going (its first acknowledged change, or the start
      // of its uploads once every change is made), so every round makes progress however
      // slow the machine is.
      let started = Date().addingTimeInterval(20)
      while !run.lines.contains(where: { $0.hasPrefix("ACK") || $0 == "SYNC" || $0 == "DONE" })
        && run.process.isRunning && Date() < started
      {
        Thread.sleep(forTimeInterval: 0.002)
        if largeUploadSeen() { break }
      }
      // Later rounds that still caught no big upload wait for one however long it takes (on a
      // loaded machine the device may rarely get that far within the random delay).
      let patient = killedDuringLargeUpload == 0 && round >= rounds / 2
      let delay = patient ? 90 : 0.02 + Double(rng.next() % 500) / 1000
      let deadline = Date().addingTimeInterval(sawLargeUpload ? 0 : delay)
      // Kill at the random time, or as soon as a big upload is seen under way.
      while Date() < deadline && run.process.isRunning {
        Thread.sleep(forTimeInterval: 0.002)
        if largeUploadSeen() { break }
      }
      run.kill()
      if sawLargeUpload { killedDuringLargeUpload += 1 }
      Thread.sleep(forTimeInterval: 0.02)
      for l in run.lines where l.hasPrefix("ACK ") {
        acked.append(Int(l.split(separator: " ")[1])!)
      }
      #expect(!run.lines.contains { $0.hasPrefix("CONFLICT") })
    }
    // The last run goes to the end.
    let final = try HelperRun(args, environment: environment)
    #expect(final.wait(timeout: 150))
    for l in final.lines where l.hasPrefix("ACK ") {
      acked.append(Int(l.split(separator: " ")[1])!)
    }
    #expect(final.lines.last == "DONE")
    #expect(!final.lines.contains { $0.hasPrefix("CONFLICT") })
    #expect(killedDuringLargeUpload >= 1)
    if backing.dir != nil {
      // The streamed puts the kills interrupted left nothing in the store folder (nor did
      // anything else: a name given just before a rename goes at the next open).
      let left = (try? FileManager.default.contentsOfDirectory(atPath: temporaries)) ?? []
      #expect(left.filter { !$0.hasPrefix("upload-") } == [])
    }
    print(
      "crash test on \(kind.name): \(rounds) kills, \(killedDuringLargeUpload) during a big upload"
    )

    // No step was acknowledged twice (a kill between commit and print may leave one silent),
    // and every step was committed.
    #expect(Set(acked).count == acked.count)
    #expect(acked.allSatisfy { (0..<70).contains($0) })
    #expect(acked.count >= 60)

    // The device's own view: nothing left to push.
    let catalog = try Catalog(path: stateDir.url.appendingPathComponent("catalog.sqlite").path)
    let (ops, logs, expected) = try catalog.read(HelperUser.userID) {
      tx -> (Int, Int, [String: Data]) in
      var tree: [String: Data] = [:]
      var queue = [(try tx.trunkNode(.home)!.id, "")]
      while !queue.isEmpty {
        let (id, prefix) = queue.removeFirst()
        for c in try tx.children(of: id) {
          let p = prefix + "/" + c.name
          let file = stateDir.url.appendingPathComponent("content").appendingPathComponent(c.uuid)
          tree[p] =
            c.kind == .directory ? Data("dir".utf8) : (try? Data(contentsOf: file)) ?? Data()
          queue.append((c.id, p))
        }
      }
      return (try tx.operationCount(), try tx.pendingChangeCount(), tree)
    }
    #expect(ops == 0)
    #expect(
      try catalog.read(HelperUser.userID) { try $0.syncValue(forKey: "helper.step") } == "70")
    #expect(logs == 0)

    // The store: one RCRD per node, no conflicted copies, no leftovers.
    let store = backing.store
    let layout = CloudLayout(userID: HelperUser.userID, treeID: HelperUser.treeID)
    let objects = try store.listAll(prefix: layout.treePrefix).filter {
      !$0.key.hasPrefix(layout.changesPrefix)
    }
    #expect(objects.filter { $0.key.hasSuffix(".rcrd") }.count == expected.count)
    let files = expected.values.filter { $0 != Data("dir".utf8) }.count
    #expect(objects.filter { $0.key.hasSuffix(".data") }.count == files)

    // Another device converges to the same tree and bytes.
    let user = try TestUser(seed: 7)
    #expect(user.userID == HelperUser.userID)
    let other = try Device("other", user: user, store: store)
    try other.engine.pull.pull()
    let tree = try other.tree(withContent: false)
    #expect(Set(tree.keys) == Set(expected.keys))
    #expect(!tree.keys.contains { $0.contains("conflicted copy") })
    var mismatched = 0
    for (p, want) in expected where want != Data("dir".utf8) {
      let got = try other.cloudContent(String(p.dropFirst()))
      if got != want {
        mismatched += 1
        print("mismatch at \(p): \(got?.count ?? -1) bytes, want \(want.count)")
      }
    }
    #expect(mismatched == 0)
    var needles = [Data("big-4.bin".utf8), Data("f1.txt".utf8), Data("create".utf8)]
    for (_, content) in expected.prefix(20) where content.count >= 16 {
      needles.append(content.prefix(16))
    }
    let hits = try backing.plaintext(needles)
    #expect(hits.isEmpty)
  }
}

/// The helper's fixed user.
enum HelperUser {
  static let keys = try! UserKeyPair.fromSeed(Data(repeating: 7, count: 32))
  static let userID = "user7xxxxxxxxxxxxxxxxxxxxxxxxxxx"
  static let treeID = "com.zdc.test"
}
