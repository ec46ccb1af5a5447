import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCDisk
import ZDCFileSystem
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The engine without the kernel: content that exists only in the store is downloaded on open
/// (by ranges for big files), and cached content is read without the network.
@Suite struct LazyDownloadTests {
  struct World {
    let dir: TemporaryDirectory
    let catalog: Catalog
    let store: FaultInjectingStore
    let disk: DiskManager
    let userID = "lazy-user"

    init() throws {
      dir = try TemporaryDirectory("zdc-lazy")
      catalog = try Catalog(path: dir.path("catalog.sqlite").path)
      _ = try catalog.createLocalUser(
        LocalUser(
          id: userID, treeID: "zdcfs", boxPublicKey: SecureRandom.bytes(32),
          signPublicKey: SecureRandom.bytes(32)))
      store = FaultInjectingStore(try LocalFolderStore(root: dir.path("store")))
      disk = try DiskManager(directory: dir.path("state"), key: SecureRandom.bytes(32))
    }

    /// A node whose DATA (with a metadata section) exists only in the store, as after a pull.
    func remoteFile(_ name: String, data: Data, metadata: Data = Data()) throws -> Node {
      try catalog.write(userID) { tx in
        var node = try tx.createNode(path: TreesystemPath([name]))
        let location = try tx.objectLocation(of: node.id)!
        var object = Data()
        try CloudFileEncoder(key: node.encryptionKey).encode(
          metadata: metadata, data: .data(data)
        ) { object.append($0) }
        let eTag = try store.put(key: location.dataKey, body: .data(object), condition: .none)
        node.dataSize = UInt64(data.count)
        node = try tx.updateNode(node)
        try tx.setCloudState(
          nodeID: node.id, eTagRcrd: "rcrd-1", lastModifiedRcrd: nil, eTagData: eTag,
          lastModifiedData: nil)
        for op in try tx.pendingOperations(forNodeID: node.id) {
          try tx.completeOperation(id: op.id)
        }
        return try tx.existingNode(id: node.id)
      }
    }

    func fileSystem(online: Bool) throws -> FileSystem {
      let downloads =
        online
        ? DownloadManager(store: store, disk: disk, catalog: catalog, userID: userID) : nil
      return try FileSystem(catalog: catalog, userID: userID, disk: disk, downloads: downloads)
    }
  }

  static func read(_ fs: FileSystem, _ h: FileHandleID, at offset: UInt64, count: Int) throws
    -> Data
  {
    var out = Data(count: count)
    let n = try out.withUnsafeMutableBytes { try fs.read(h, offset: offset, into: $0) }
    return out.prefix(n)
  }

  @Test func smallFileIsDownloadedWholeOnOpenThenReadOffline() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let content = SecureRandom.bytes(300_000)
    let node = try w.remoteFile("small.bin", data: content, metadata: Data("meta!".utf8))
    let fs = try w.fileSystem(online: true)
    let attrs = try fs.lookup(parent: 1, name: "small.bin")
    #expect(attrs.size == 300_000)
    #expect(w.store.counts[.get, default: 0] == 0)  // lookup never touches the store
    let opened = try fs.open(attrs.inode, flags: O_RDONLY)
    let gets = w.store.counts[.get, default: 0]
    #expect(gets >= 1)
    #expect(try Self.read(fs, opened.handle, at: 0, count: 300_000) == content)
    #expect(w.store.counts[.get, default: 0] == gets)  // reads after open are local
    try fs.release(opened.handle)
    #expect(w.disk.hasCompleteFile(cloudID: node.cloudID, eTag: node.eTagData!))
    #expect(try fs.getxattr(attrs.inode, name: "user.zdc.meta") == Data("meta!".utf8))
    #expect(try fs.getxattr(attrs.inode, name: "user.zdc.state") == Data("synced".utf8))

    // Offline (no download manager): the cached copy still reads.
    let offline = try w.fileSystem(online: false)
    let again = try offline.open(attrs.inode, flags: O_RDONLY)
    #expect(try Self.read(offline, again.handle, at: 1000, count: 10) == content[1000..<1010])
    try offline.release(again.handle)
  }

  @Test func bigFileIsReadByRanges() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let content = SecureRandom.bytes(12 << 20)
    let node = try w.remoteFile("big.bin", data: content)
    let fs = try w.fileSystem(online: true)
    let attrs = try fs.lookup(parent: 1, name: "big.bin")
    let opened = try fs.open(attrs.inode, flags: O_RDONLY)
    #expect(try Self.read(fs, opened.handle, at: 0, count: 4096) == content.prefix(4096))
    let partial = try #require(w.disk.cachedFile(cloudID: node.cloudID, eTag: node.eTagData!))
    #expect(!partial.isComplete)  // only the start (plus read-ahead) was fetched
    partial.close()
    let tail = UInt64(content.count - 100)
    #expect(try Self.read(fs, opened.handle, at: tail, count: 100) == content.suffix(100))
    try fs.release(opened.handle)
  }

  @Test func writingARemoteFileStartsFromItsContent() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let content = Data(repeating: 0x41, count: 200_000)
    let node = try w.remoteFile("edit.bin", data: content)
    let fs = try w.fileSystem(online: true)
    let attrs = try fs.lookup(parent: 1, name: "edit.bin")
    let opened = try fs.open(attrs.inode, flags: O_RDWR)
    _ = try Data("XYZ".utf8).withUnsafeBytes { try fs.write(opened.handle, offset: 10, bytes: $0) }
    try fs.release(opened.handle)
    #expect(try fs.getattr(attrs.inode).size == 200_000)
    #expect(try fs.getxattr(attrs.inode, name: "user.zdc.state") == Data("pending-upload".utf8))
    let staged = try #require(w.disk.stagedData(forNode: node.id))
    let file = try CryptoFile.open(at: staged.url, key: staged.key)
    var expected = content
    expected.replaceSubrange(10..<13, with: Data("XYZ".utf8))
    #expect(try file.read(offset: 0, count: 200_000) == expected)
    try file.close()
    let ops = try w.catalog.read(w.userID) { try $0.pendingOperations(forNodeID: node.id) }
    #expect(ops.contains { $0.kind == .putData })
  }

  @Test func sectionChangeStagesTheDataSoTheUploadKeepsIt() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let content = SecureRandom.bytes(100_000)
    let node = try w.remoteFile("keep.bin", data: content)
    let fs = try w.fileSystem(online: true)
    let ino = try fs.lookup(parent: 1, name: "keep.bin").inode
    try fs.setxattr(ino, name: "user.zdc.meta", value: Data("{}".utf8), mode: .any)
    let delegate = FileSystemSyncDelegate(fileSystem: fs)
    let (data, meta) = try w.catalog.read(w.userID) { tx in
      let n = try tx.existingNode(id: node.id)
      let path = try tx.path(of: node.id)
      return (
        delegate.data(for: n, at: path, transaction: tx),
        delegate.metadata(for: n, at: path, transaction: tx)
      )
    }
    try Self.expectStaged(data, content, "no staged data for the upload")
    guard case .data(let m)? = meta else {
      Issue.record("no metadata section")
      return
    }
    #expect(m == Data("{}".utf8))
  }

  /// Content cached by cloudID stays a node's when the sync engine gives it a new cloudID: the
  /// delegate stages it when told (`willAssignNewCloudID`), and the upload under the new
  /// identity carries it. Untold, the node's content is found nowhere.
  @Test(arguments: [true, false])
  func aNewCloudIDKeepsTheCachedContent(told: Bool) throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let content = SecureRandom.bytes(100_000)
    let node = try w.remoteFile("kept.bin", data: content)
    let fs = try w.fileSystem(online: true)
    let opened = try fs.open(try fs.lookup(parent: 1, name: "kept.bin").inode, flags: O_RDONLY)
    #expect(try Self.read(fs, opened.handle, at: 0, count: content.count + 1) == content)
    try fs.release(opened.handle)
    #expect(w.disk.stagedData(forNode: node.id) == nil)  // only cached
    let delegate = FileSystemSyncDelegate(fileSystem: fs)
    let data = try w.catalog.write(w.userID) { tx -> NodeData? in
      let n = try tx.existingNode(id: node.id)
      let path = try tx.path(of: node.id)
      if told { delegate.willAssignNewCloudID(to: n, at: path, transaction: tx) }
      let renewed = try tx.assignNewCloudID(to: node.id)
      #expect(renewed.cloudID != node.cloudID)
      return delegate.data(for: renewed, at: path, transaction: tx)
    }
    guard told else {
      #expect(data == nil)
      return
    }
    try Self.expectStaged(data, content, "no staged data for the upload under the new cloudID")
  }

  /// Checks that an upload's data is a staged CryptoFile holding `content`.
  static func expectStaged(_ data: NodeData?, _ content: Data, _ missing: String) throws {
    guard case .cryptoFile(let url, let key)? = data else {
      Issue.record(Comment(rawValue: missing))
      return
    }
    let file = try CryptoFile.open(at: url, key: key)
    #expect(try file.read(offset: 0, count: content.count + 1) == content)
    try file.close()
  }

  /// An upload finishing moves the staged content into the cache (after the catalog records
  /// the new eTag) while other threads open, read and re-stage the file: every read sees the
  /// content, none fails, and re-staging never starts from an empty file.
  @Test func opensRacingAFinishingUploadSeeTheContent() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let fs = try w.fileSystem(online: true)
    let delegate = FileSystemSyncDelegate(fileSystem: fs)
    let (attrs, created) = try fs.create(parent: 1, name: "race.bin", mode: 0o644, flags: O_WRONLY)
    try fs.release(created.handle)
    let id = try w.catalog.read(w.userID) { tx in
      try #require(try tx.node(path: TreesystemPath(["race.bin"]))).id
    }
    let failures = Locked<[String]>([])
    for round in 0..<400 {
      let content = Data(repeating: UInt8(round % 250 + 1), count: 70_000 + round)
      let h = try fs.open(attrs.inode, flags: O_WRONLY | O_TRUNC)
      _ = try content.withUnsafeBytes { try fs.write(h.handle, offset: 0, bytes: $0) }
      try fs.release(h.handle)
      let done = Locked(false)
      let group = DispatchGroup()
      for worker in 0..<3 {
        DispatchQueue.global().async(group: group) {
          while !done.value {
            do {
              if worker == 2 {
                // Re-stages the current content (a section change does), then reads it.
                try fs.setxattr(
                  attrs.inode, name: "user.zdc.meta", value: Data("m".utf8), mode: .any)
              }
              let r = try fs.open(attrs.inode, flags: O_RDONLY)
              defer { try? fs.release(r.handle) }
              let got = try Self.read(fs, r.handle, at: 0, count: content.count + 1)
              if got != content {
                failures.mutate {
                  $0.append("round \(round): read \(got.count) bytes, not the content")
                }
              }
            } catch {
              failures.mutate { $0.append("round \(round): \(error)") }
            }
          }
        }
      }
      // What the push side does when a DATA upload of the node completes.
      _ = try w.catalog.read(w.userID) { tx in
        delegate.data(for: try tx.existingNode(id: id), at: try tx.path(of: id), transaction: tx)
      }
      usleep(UInt32.random(in: 0...400))
      try w.catalog.write(w.userID) { tx in
        try tx.setCloudState(
          nodeID: id, eTagRcrd: "r\(round)", lastModifiedRcrd: nil, eTagData: "d\(round)",
          lastModifiedData: nil)
        let n = try tx.existingNode(id: id)
        delegate.didPushNodeData(n, at: try tx.path(of: id), transaction: tx)
      }
      usleep(UInt32.random(in: 0...400))
      done.value = true
      group.wait()
      if !failures.value.isEmpty { break }
    }
    #expect(failures.value.isEmpty, "\(failures.value.prefix(5))")
  }

  final class Recorder: KernelNotifier, @unchecked Sendable {
    // @unchecked: `calls` is guarded by `lock`.
    let lock = NSLock()
    var calls: [String] = []
    func invalidateInode(_ inode: Inode) { lock.withLock { calls.append("inode \(inode)") } }
    func invalidateEntry(parent: Inode, name: String) {
      lock.withLock { calls.append("entry \(parent) \(name)") }
    }
    func deleteEntry(parent: Inode, child: Inode, name: String) {
      lock.withLock { calls.append("delete \(parent) \(child) \(name)") }
    }
    func invalidateAttributes(_ inode: Inode) {
      lock.withLock { calls.append("attributes \(inode)") }
    }
    func wait(for count: Int) -> [String] {
      for _ in 0..<200 where lock.withLock({ calls.count }) < count { usleep(10_000) }
      return lock.withLock { calls }
    }
  }

  @Test func pullDiscoveriesBecomeKernelInvalidations() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let node = try w.remoteFile(".data", data: Data("x".utf8))
    let fs = try w.fileSystem(online: true)
    let recorder = Recorder()
    fs.notifier = recorder
    let delegate = FileSystemSyncDelegate(fileSystem: fs)
    let ino = try fs.lookup(parent: 1, name: "%%.data").inode
    try w.catalog.write(w.userID) { tx in
      let path = try tx.path(of: node.id)
      delegate.didDiscoverNewNode(node, at: path, transaction: tx)
      delegate.didDiscoverModifiedNode(node, change: .data, at: path, transaction: tx)
      delegate.didDiscoverDeletedNode(node, at: path, timestamp: nil, transaction: tx)
    }
    let calls = recorder.wait(for: 4)
    // Names are sent as shown through the mount (escaped).
    #expect(calls.contains("entry 1 %%.data"))
    #expect(calls.contains("inode \(ino)"))
    #expect(calls.contains("delete 1 \(ino) %%.data"))
  }
}
