import Foundation
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCDisk
import ZDCFileSystem

#if canImport(Glibc)
  import Glibc
#endif

/// The metadata path of the filesystem engine without the kernel: the calls one iteration of
/// `tools/bench`'s create/stat/rename/unlink loop makes (the lookups the kernel sends before a
/// create and a rename included), on a sealed catalog in a state directory like the mount's.
/// Prints µs per call of each kind.
enum MetaBench {
  static func run(count: Int) throws {
    print(
      "zdc-bench meta (\(count) iterations of create/write/close/stat/rename/unlink; one thread)")
    let (fs, dir) = try scratchFileSystem("zdc-metabench")
    defer { try? FileManager.default.removeItem(at: dir) }
    let parent = try fs.mkdir(parent: 1, name: "meta", mode: 0o755).inode

    let kinds = [
      "lookup (absent name)", "create", "write 1 byte", "flush", "release", "getattr",
      "rename", "unlink",
    ]
    var spent = [Double](repeating: 0, count: kinds.count)
    let byte: [UInt8] = [0x78]
    func timed(_ k: Int, _ body: () throws -> Void) rethrows { spent[k] += try time(body) }
    let t0 = now()
    for i in 0..<count {
      let name = "f\(i)"
      try timed(0) { try lookUpAbsent(fs, parent, name) }
      let attrs = try writeNewFile(fs, parent, name, byte, timing: timed, from: 1)
      try timed(5) {
        let size = try fs.getattr(attrs.inode).size
        precondition(size == 1)
      }
      try timed(0) { try lookUpAbsent(fs, parent, name + ".r") }
      try timed(6) {
        try fs.rename(
          parent: parent, name: name, newParent: parent, newName: name + ".r", flags: [])
      }
      try timed(7) { try fs.unlink(parent: parent, name: name + ".r") }
      fs.forget(attrs.inode, count: 1)
    }
    let total = now() - t0
    for (k, what) in kinds.enumerated() {
      let calls = k == 0 ? 2 * count : count
      line(what, perOp: spent[k] / Double(calls))
    }
    line("one iteration (all of the above)", perOp: total / Double(count))
  }

  /// The calls a copy-in (`cp -r`) makes per file, without the kernel: a lookup of the absent
  /// name, create, one write of `bytes`, flush, release — files left in place, `perDirectory`
  /// to a directory (each directory made as `cp` makes it: a lookup, then mkdir). Prints µs per
  /// call of each kind.
  static func copy(count: Int, bytes: Int = 16 << 10, perDirectory: Int = 10) throws {
    print(
      "zdc-bench copy (\(count) files of \(bytes) bytes, \(perDirectory) per directory; one thread)"
    )
    let (fs, dir) = try scratchFileSystem("zdc-copybench")
    defer { try? FileManager.default.removeItem(at: dir) }
    let top = try fs.mkdir(parent: 1, name: "tree", mode: 0o755).inode
    let kinds = ["lookup (absent name)", "mkdir", "create", "write", "flush", "release"]
    var spent = [Double](repeating: 0, count: kinds.count)
    var calls = [Int](repeating: 0, count: kinds.count)
    func timed(_ k: Int, _ body: () throws -> Void) rethrows {
      spent[k] += try time(body)
      calls[k] += 1
    }
    func absent(_ parent: UInt64, _ name: String) throws {
      try timed(0) { try lookUpAbsent(fs, parent, name) }
    }
    let content = SecureRandom.bytes(bytes)
    var parent = top
    let t0 = now()
    for i in 0..<count {
      if i % perDirectory == 0 {
        let name = "d\(i / perDirectory)"
        try absent(top, name)
        try timed(1) { parent = try fs.mkdir(parent: top, name: name, mode: 0o755).inode }
      }
      let name = "file-\(i).h"
      try absent(parent, name)
      let attrs = try writeNewFile(fs, parent, name, content, timing: timed, from: 2)
      fs.forget(attrs.inode, count: 1)
    }
    let total = now() - t0
    for (k, what) in kinds.enumerated() where calls[k] > 0 {
      line(what, perOp: spent[k] / Double(calls[k]))
    }
    line("one file (all of the above)", perOp: total / Double(count))
  }

  /// The filesystem engine on a sealed catalog and a disk cache in a fresh scratch directory
  /// laid out like the mount's state directory; the caller removes the directory.
  private static func scratchFileSystem(_ prefix: String) throws -> (FileSystem, URL) {
    let dir = try scratchDirectory(prefix)
    let (catalog, user) = try benchCatalog(in: dir, fieldKey: SecureRandom.bytes(32))
    let disk = try DiskManager(
      directory: dir.appendingPathComponent("state"), key: SecureRandom.bytes(32),
      capBytes: 1 << 40)
    return (try FileSystem(catalog: catalog, userID: user, disk: disk, downloads: nil), dir)
  }

  /// Looks up a name the benchmark has not made (the lookup the kernel sends before a create).
  private static func lookUpAbsent(_ fs: FileSystem, _ parent: UInt64, _ name: String) throws {
    do {
      _ = try fs.lookup(parent: parent, name: name)
      preconditionFailure("\(name) exists")
    } catch FileSystemError.notFound {}
  }

  /// Creates `name` in `parent` and writes `bytes` to it as a program does (create, one write,
  /// close: flush and release), timing the four calls as kinds `first` to `first + 3`.
  private static func writeNewFile(
    _ fs: FileSystem, _ parent: UInt64, _ name: String, _ bytes: some ContiguousBytes,
    timing timed: (Int, () throws -> Void) throws -> Void, from first: Int
  ) throws -> Attributes {
    var created: (Attributes, OpenedFile)?
    try timed(first) {
      created = try fs.create(parent: parent, name: name, mode: 0o644, flags: O_WRONLY)
    }
    let (attrs, opened) = created!
    try timed(first + 1) {
      _ = try bytes.withUnsafeBytes { try fs.write(opened.handle, offset: 0, bytes: $0) }
    }
    try timed(first + 2) { try fs.flush(opened.handle) }
    try timed(first + 3) { try fs.release(opened.handle) }
    return attrs
  }
}
