import Foundation
import Synchronization
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCFileSystem
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The engine's read path without the kernel: when the kernel may keep its page cache across
/// opens, and reads that run without the content lock while writes and commits go on.
@Suite struct ReadPathEngineTests {
  typealias World = LazyDownloadTests.World

  static func read(_ fs: FileSystem, _ h: FileHandleID, count: Int) throws -> Data {
    try LazyDownloadTests.read(fs, h, at: 0, count: count)
  }

  /// Replaces the DATA object of a node in the store and records its new eTag, as a pull
  /// does when another device changed the file.
  static func remoteChange(_ w: World, _ node: Node, to data: Data) throws {
    try w.catalog.write(w.userID) { tx in
      let location = try tx.objectLocation(of: node.id)!
      var object = Data()
      try CloudFileEncoder(key: node.encryptionKey).encode(data: .data(data)) {
        object.append($0)
      }
      let eTag = try w.store.put(key: location.dataKey, body: .data(object), condition: .none)
      var n = try tx.existingNode(id: node.id)
      n.dataSize = UInt64(data.count)
      _ = try tx.updateNode(n)
      try tx.setCloudState(
        nodeID: n.id, eTagRcrd: "rcrd-2", lastModifiedRcrd: nil, eTagData: eTag,
        lastModifiedData: nil)
      for op in try tx.pendingOperations(forNodeID: n.id) { try tx.completeOperation(id: op.id) }
    }
  }

  @Test func pageCacheIsKeptOnlyForTheBytesTheKernelSaw() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let node = try w.remoteFile("doc.txt", data: Data("version one".utf8))
    let fs = try w.fileSystem(online: true)
    let ino = try fs.lookup(parent: 1, name: "doc.txt").inode
    func openRead() throws -> (Bool, Data) {
      let o = try fs.open(ino, flags: O_RDONLY)
      defer { try? fs.release(o.handle) }
      return (o.keepCache, try Self.read(fs, o.handle, count: 100))
    }
    #expect(try openRead() == (false, Data("version one".utf8)))  // nothing cached before
    #expect(try openRead() == (true, Data("version one".utf8)))

    // A local write: the next read-only open starts afresh, then keeps again.
    let wr = try fs.open(ino, flags: O_WRONLY)
    #expect(!wr.keepCache)
    _ = try Data("VERSION TWO".utf8).withUnsafeBytes {
      try fs.write(wr.handle, offset: 0, bytes: $0)
    }
    try fs.flush(wr.handle)
    try fs.release(wr.handle)
    #expect(try openRead() == (false, Data("VERSION TWO".utf8)))
    #expect(try openRead() == (true, Data("VERSION TWO".utf8)))

    // A pull changes another file (same size): its next open drops the kernel's pages.
    let other = try w.remoteFile("other.txt", data: Data("aaaa".utf8))
    let otherIno = try fs.lookup(parent: 1, name: "other.txt").inode
    for expected in [false, true] {
      let o = try fs.open(otherIno, flags: O_RDONLY)
      #expect(o.keepCache == expected)
      #expect(try Self.read(fs, o.handle, count: 10) == Data("aaaa".utf8))
      try fs.release(o.handle)
    }
    try Self.remoteChange(w, other, to: Data("bbbb".utf8))
    let o = try fs.open(otherIno, flags: O_RDONLY)
    #expect(!o.keepCache)
    #expect(try Self.read(fs, o.handle, count: 10) == Data("bbbb".utf8))
    try fs.release(o.handle)
    _ = node
  }

  /// Reads (without the content lock) racing writes, commits and reopenings: every read
  /// returns one whole version, never an error from a reader closed under it.
  @Test func readsRacingWritesAndCommitsSeeWholeVersions() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let size = 300_000
    _ = try w.remoteFile("race.bin", data: Data(repeating: 1, count: size))
    let fs = try w.fileSystem(online: true)
    let ino = try fs.lookup(parent: 1, name: "race.bin").inode
    let failures = Mutex<[String]>([])
    let done = Mutex(false)
    DispatchQueue.concurrentPerform(iterations: 4) { worker in
      if worker == 0 {
        for v in UInt8(2)...UInt8(30) {
          do {
            let h = try fs.open(ino, flags: O_WRONLY).handle
            _ = try Data(repeating: v, count: size).withUnsafeBytes {
              try fs.write(h, offset: 0, bytes: $0)
            }
            try fs.flush(h)
            try fs.release(h)
          } catch { failures.withLock { $0.append("write \(v): \(error)") } }
        }
        done.withLock { $0 = true }
        return
      }
      var rounds = 0
      while rounds < 50 || !done.withLock({ $0 }) {
        rounds += 1
        do {
          let h = try fs.open(ino, flags: O_RDONLY).handle
          for _ in 0..<3 {
            let got = try Self.read(fs, h, count: size)
            if got.count != size || Set(got).count != 1 {
              failures.withLock { $0.append("mixed or short read: \(got.count) bytes") }
            }
          }
          try fs.release(h)
        } catch { failures.withLock { $0.append("read: \(error)") } }
      }
    }
    #expect(failures.withLock { $0 } == [])
    let h = try fs.open(ino, flags: O_RDONLY).handle
    #expect(try Self.read(fs, h, count: size) == Data(repeating: 30, count: size))
    try fs.release(h)
  }

  /// A file not in the cache: random reads download only the chunks they need; a sequential
  /// reader gets every byte right while read-ahead downloads run in the background.
  @Test func rangedReadsFetchWhatTheReaderNeeds() throws {
    let w = try World()
    // Kept to the end: its directory goes with it, and the file system works inside.
    defer { withExtendedLifetime(w) {} }
    let size = 12 << 20
    var content = Data(count: size)
    content.withUnsafeMutableBytes { b in
      for i in stride(from: 0, to: size, by: 8) {
        b.storeBytes(of: UInt64(i), toByteOffset: i, as: UInt64.self)
      }
    }
    let node = try w.remoteFile("big.bin", data: content)
    let fs = try w.fileSystem(online: true)
    let ino = try fs.lookup(parent: 1, name: "big.bin").inode
    let h = try fs.open(ino, flags: O_RDONLY).handle
    let offsets = [9 << 20 + 5000, 3 << 20 + 104, 11 << 20 + 70000, 6 << 20]
    for o in offsets {
      #expect(
        try LazyDownloadTests.read(fs, h, at: UInt64(o), count: 4096) == content[o..<(o + 4096)])
    }
    let partial = try #require(w.disk.cachedFile(cloudID: node.cloudID, eTag: node.eTagData!))
    // One 64 KiB chunk per read, nothing ahead of readers that jump around.
    let present = (0..<UInt64(size >> 16)).filter {
      partial.contains(ByteRange($0 << 16, ($0 + 1) << 16))
    }
    #expect(present.count == offsets.count)
    partial.close()
    // Sequential 1 MiB reads, as the kernel's read-ahead sends them.
    var offset = 0
    while offset < size {
      let got = try LazyDownloadTests.read(fs, h, at: UInt64(offset), count: 1 << 20)
      #expect(got == content[offset..<min(size, offset + (1 << 20))], "at \(offset)")
      offset += 1 << 20
    }
    try fs.release(h)
  }
}
