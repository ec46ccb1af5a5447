import Foundation
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCSync

/// The user every helper device and the sync tests share (keys from a fixed seed).
enum HelperUser {
  static let keys = try! UserKeyPair.fromSeed(Data(repeating: 7, count: 32))
  static let userID = "user7xxxxxxxxxxxxxxxxxxxxxxxxxxx"
  static let treeID = "com.zdc.test"
}

/// Serves node content from cleartext files in the state directory (`content/{uuid}`).
final class FileDelegate: SyncDelegate {
  let contentDir: URL
  init(contentDir: URL) { self.contentDir = contentDir }

  func url(for node: Node) -> URL { contentDir.appendingPathComponent(node.uuid) }

  func data(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> NodeData? {
    let u = url(for: node)
    return FileManager.default.fileExists(atPath: u.path) ? .cleartextFile(u) : nil
  }
  func didDiscoverConflict(
    _ kind: ConflictKind, node: Node, other: Node?, at path: TreesystemPath,
    transaction: CloudTransaction
  ) {
    // A single writer never conflicts; report it so the test sees it.
    FileHandle.standardOutput.write(Data("CONFLICT \(kind.rawValue) \(path)\n".utf8))
  }
}

/// A small deterministic generator.
struct Mix64 {
  var state: UInt64
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
  mutating func below(_ n: Int) -> Int { Int(next() % UInt64(max(n, 1))) }
}

/// Runs one device from a state directory: applies scripted changes (seeded, resumable after
/// a crash), pushing as it goes, and prints `ACK <step> <change>` once each change is
/// committed; `SYNC` once every change is made and it waits for the uploads; `DONE` once
/// everything is pushed.
func runDevice(
  stateDir: URL, store: any CloudStore, seed: UInt64, steps: Int, bigStep: Int
) throws {
  let fm = FileManager.default
  try fm.createDirectory(at: stateDir, withIntermediateDirectories: true)
  let contentDir = stateDir.appendingPathComponent("content")
  try fm.createDirectory(at: contentDir, withIntermediateDirectories: true)
  let catalog = try Catalog(path: stateDir.appendingPathComponent("catalog.sqlite").path)
  let userID = HelperUser.userID
  if try catalog.localUser(id: userID) == nil {
    try catalog.createLocalUser(
      LocalUser(
        id: userID, treeID: HelperUser.treeID, boxPublicKey: HelperUser.keys.boxPublicKey,
        signPublicKey: HelperUser.keys.signPublicKey))
  }
  let delegate = FileDelegate(contentDir: contentDir)
  let engine = try SyncEngine(
    catalog: catalog, store: store,
    account: SyncAccount(
      userID: userID, keys: HelperUser.keys, deviceID: "helper", deviceName: "helper"),
    delegate: delegate,
    push: PushConfiguration(
      workDirectory: stateDir.appendingPathComponent("work"), retryBase: 0.05, retryCap: 0.5,
      pollInterval: 0.02, logBatchWindow: 0.05),
    pull: PullConfiguration(pullInterval: 3600))
  try engine.start()
  let out = FileHandle.standardOutput
  var step = Int(try catalog.read(userID) { try $0.syncValue(forKey: "helper.step") } ?? "0") ?? 0
  while step < steps {
    var rng = Mix64(state: seed &* 1_000_003 &+ UInt64(step))
    let description = try catalog.write(userID) { tx -> String in
      let d = try applyStep(tx)
      // The step counter commits with the change: a change is made exactly once.
      try tx.setSyncValue("\(step + 1)", forKey: "helper.step")
      return d
    }
    func applyStep(_ tx: CloudTransaction) throws -> String {
      let home = try tx.trunkNode(.home)!
      var all: [Node] = []
      var queue = [home.id]
      while let id = queue.popLast() {
        for c in try tx.children(of: id) {
          all.append(c)
          queue.append(c.id)
        }
      }
      all.sort { $0.id < $1.id }
      let files = all.filter { $0.kind == .file }
      let dirs = [home] + all.filter { $0.kind == .directory }
      func writeContent(_ node: Node, size: Int) throws {
        var bytes = [UInt8](repeating: 0, count: size)
        for i in 0..<size { bytes[i] = UInt8(truncatingIfNeeded: rng.next() % 26 + 97) }
        try Data(bytes).write(to: delegate.url(for: node))
      }
      let roll = (step == bigStep || step == bigStep * 5) ? -1 : rng.below(100)
      if roll == -1 {
        let parent = dirs[0]
        let n = try tx.createNode(
          Node(
            uuid: "", localUserID: userID, parentID: parent.id, name: "big-\(step).bin",
            kind: .file, shareList: .owner(userID), encryptionKey: Data(), dirSalt: Data(),
            dirPrefix: "", cloudID: "", mode: 0o644, mtime: FileTime(seconds: 1_700_000_000)))
        try writeContent(n, size: 12 << 20)
        try tx.queueDataUpload(nodeID: n.id)
        return "create big-\(step).bin"
      } else if roll < 40 || files.isEmpty {
        let parent = dirs[rng.below(dirs.count)]
        let n = try tx.createNode(
          Node(
            uuid: "", localUserID: userID, parentID: parent.id, name: "f\(step).txt",
            kind: .file, shareList: .owner(userID), encryptionKey: Data(), dirSalt: Data(),
            dirPrefix: "", cloudID: "", mode: 0o644, mtime: FileTime(seconds: 1_700_000_000)))
        try writeContent(n, size: 10 + rng.below(3000))
        try tx.queueDataUpload(nodeID: n.id)
        return "create f\(step).txt"
      } else if roll < 55 {
        let parent = dirs[rng.below(dirs.count)]
        _ = try tx.createNode(
          Node(
            uuid: "", localUserID: userID, parentID: parent.id, name: "d\(step)",
            kind: .directory, shareList: .owner(userID), encryptionKey: Data(), dirSalt: Data(),
            dirPrefix: "", cloudID: "", mode: 0o755, mtime: FileTime(seconds: 1_700_000_000)))
        return "mkdir d\(step)"
      } else if roll < 80 {
        let f = files[rng.below(files.count)]
        if f.name.contains("big-") { return "skip" }
        try writeContent(f, size: 10 + rng.below(3000))
        try tx.queueDataUpload(nodeID: f.id)
        return "modify \(f.name)"
      } else if roll < 92 {
        let f = files[rng.below(files.count)]
        let parent = dirs[rng.below(dirs.count)]
        try tx.moveNode(f.id, toParent: parent.id, name: "m\(step)-\(f.name)")
        return "move \(f.name)"
      } else {
        let victims = all.filter { !$0.name.contains("big-") }
        guard !victims.isEmpty else { return "skip" }
        let v = victims[rng.below(victims.count)]
        try tx.deleteNode(v.id)
        return "delete \(v.name)"
      }
    }
    out.write(Data("ACK \(step) \(description)\n".utf8))
    step += 1
    Thread.sleep(forTimeInterval: 0.015)
  }
  // From here on no ACK comes: the line tells a watcher that the device is uploading.
  out.write(Data("SYNC\n".utf8))
  guard try engine.syncNow(timeout: 300) else { throw SyncError.dataUnavailable("sync timed out") }
  engine.stop()
  out.write(Data("DONE\n".utf8))
}
