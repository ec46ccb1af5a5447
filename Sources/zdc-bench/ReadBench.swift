import Foundation
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCDisk
import ZDCFileSystem
import ZDCLocalStore
import ZDCSync

#if canImport(Glibc)
  import Glibc
#endif

/// The read path of the filesystem engine without the kernel: per-file costs of lookup and
/// open+read+release of small files (staged, then cached after a simulated upload), and
/// sequential and random reads of a big file, cached and not yet downloaded.
enum ReadBench {
  static func run(files: Int, bigMiB: Int) throws {
    print("zdc-bench read (\(files) files of 16 KiB, a \(bigMiB) MiB file; one thread)")
    let dir = try scratchDirectory("zdc-readbench")
    defer { try? FileManager.default.removeItem(at: dir) }
    let (catalog, user) = try benchCatalog(in: dir, fieldKey: nil)
    let store = try LocalFolderStore(root: dir.appendingPathComponent("store"))
    let disk = try DiskManager(
      directory: dir.appendingPathComponent("state"), key: SecureRandom.bytes(32),
      capBytes: 1 << 40)
    let downloads = DownloadManager(store: store, disk: disk, catalog: catalog, userID: user)
    let fs = try FileSystem(catalog: catalog, userID: user, disk: disk, downloads: downloads)

    let content = SecureRandom.bytes(16 << 10)
    var names: [String] = []
    for i in 0..<files {
      let name = "f\(i).h"
      let (_, opened) = try fs.create(parent: 1, name: name, mode: 0o644, flags: O_WRONLY)
      _ = try content.withUnsafeBytes { try fs.write(opened.handle, offset: 0, bytes: $0) }
      try fs.flush(opened.handle)
      try fs.release(opened.handle)
      names.append(name)
    }
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
    defer { buffer.deallocate() }

    func perFile(_ what: String) throws {
      var inodes: [Inode] = []
      let tl = try time {
        for n in names { inodes.append(try fs.lookup(parent: 1, name: n).inode) }
      }
      line("\(what): lookup", perOp: tl / Double(files))
      let t = try time {
        for ino in inodes {
          let opened = try fs.open(ino, flags: O_RDONLY)
          let n = try fs.read(
            opened.handle, offset: 0,
            into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<(128 << 10)]))
          precondition(n == content.count)
          try fs.release(opened.handle)
        }
      }
      line("\(what): open + read 16 KiB + release", perOp: t / Double(files))
    }
    try perFile("staged")
    // What the push side does after each upload: the eTag recorded, the staged version
    // becomes the cached copy.
    for name in names {
      try catalog.write(user) { tx in
        guard let n = try tx.child(of: fs.homeID, named: name) else { return }
        let eTag = "etag-\(n.id)"
        try tx.setCloudState(
          nodeID: n.id, eTagRcrd: "rcrd-\(n.id)", lastModifiedRcrd: Date(), eTagData: eTag,
          lastModifiedData: Date(),
          cloudDataInfo: CloudDataInfo(
            metadataSize: 0, thumbnailSize: 0, dataSize: UInt64(content.count), eTag: eTag))
        try disk.markUploaded(nodeID: n.id, cloudID: n.cloudID, eTag: eTag)
      }
    }
    try perFile("cached")

    // A big file, cached (written locally, then "uploaded" as above).
    let big = bigMiB << 20
    let (attrs, w) = try fs.create(parent: 1, name: "big", mode: 0o644, flags: O_WRONLY)
    let block = SecureRandom.bytes(1 << 20)
    for i in 0..<bigMiB {
      _ = try block.withUnsafeBytes { try fs.write(w.handle, offset: UInt64(i << 20), bytes: $0) }
    }
    try fs.release(w.handle)
    try catalog.write(user) { tx in
      guard let n = try tx.node(id: NodeID(attrs.inode)) else { return }
      try tx.setCloudState(
        nodeID: n.id, eTagRcrd: "rcrd-big", lastModifiedRcrd: Date(), eTagData: "etag-big",
        lastModifiedData: Date())
      try disk.markUploaded(nodeID: n.id, cloudID: n.cloudID, eTag: "etag-big")
    }
    try bigReads("cached", fs, attrs.inode, size: big, buffer)

    // The same size in the store only (as after a pull): ranged downloads.
    let remote = try catalog.write(user) { tx -> Node in
      var node = try tx.createNode(path: TreesystemPath(["remote"]))
      let location = try tx.objectLocation(of: node.id)!
      let tmp = dir.appendingPathComponent("object")
      _ = FileManager.default.createFile(atPath: tmp.path, contents: nil)
      let out = try FileHandle(forWritingTo: tmp)
      var produced = 0
      try CloudFileEncoder(key: node.encryptionKey).encode(
        data: .reader(size: UInt64(big)) { buf in
          let n = min(buf.count, big - produced, block.count - produced % block.count)
          block.withUnsafeBytes { b in
            let at = produced % block.count
            buf.copyMemory(from: UnsafeRawBufferPointer(rebasing: b[at..<(at + n)]))
          }
          produced += n
          return n
        }
      ) { out.write($0) }
      try out.close()
      let eTag = try store.put(
        key: location.dataKey, body: .file(tmp, range: nil), condition: .none)
      node.dataSize = UInt64(big)
      node = try tx.updateNode(node)
      try tx.setCloudState(
        nodeID: node.id, eTagRcrd: "rcrd-remote", lastModifiedRcrd: nil, eTagData: eTag,
        lastModifiedData: nil)
      for op in try tx.pendingOperations(forNodeID: node.id) { try tx.completeOperation(id: op.id) }
      return try tx.existingNode(id: node.id)
    }
    let remoteIno = try fs.lookup(parent: 1, name: "remote").inode
    precondition(remoteIno == Inode(remote.id))
    let seq = try time { try readAll(fs, remoteIno, size: big, buffer) }
    report("not cached: sequential 1 MiB reads (download)", bytes: big, seconds: seq)
  }

  static func readAll(
    _ fs: FileSystem, _ ino: Inode, size: Int, _ buffer: UnsafeMutableRawBufferPointer
  ) throws {
    let h = try fs.open(ino, flags: O_RDONLY).handle
    defer { try? fs.release(h) }
    var offset = 0
    while offset < size {
      let n = try fs.read(h, offset: UInt64(offset), into: buffer)
      precondition(n > 0)
      offset += n
    }
  }

  static func bigReads(
    _ what: String, _ fs: FileSystem, _ ino: Inode, size: Int,
    _ buffer: UnsafeMutableRawBufferPointer
  ) throws {
    let seq = try time { try readAll(fs, ino, size: size, buffer) }
    report("\(what): sequential 1 MiB reads", bytes: size, seconds: seq)
    // Two threads reading alternate 1 MiB windows (the kernel's parallel read-ahead).
    let h = try fs.open(ino, flags: O_RDONLY).handle
    let par = time {
      DispatchQueue.concurrentPerform(iterations: 2) { t in
        let b = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { b.deallocate() }
        var offset = t << 20
        while offset < size {
          _ = try? fs.read(h, offset: UInt64(offset), into: b)
          offset += 2 << 20
        }
      }
    }
    report("\(what): 1 MiB reads on two threads", bytes: size, seconds: par)
    var rng = SystemRandomNumberGenerator()
    let count = 4096
    let small = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<4096])
    let rnd = try time {
      for _ in 0..<count {
        let page = Int.random(in: 0..<(size / 4096), using: &rng)
        _ = try fs.read(h, offset: UInt64(page * 4096), into: small)
      }
    }
    line("\(what): random 4 KiB read", perOp: rnd / Double(count))
    try fs.release(h)
  }
}
