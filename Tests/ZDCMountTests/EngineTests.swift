import Foundation
import Synchronization
import Testing
import ZDCCatalog
import ZDCCore
import ZDCFileSystem
import ZDCSync

#if canImport(Glibc)
  import Glibc
#endif

/// Engine behaviour that is easier to pin down without the kernel in between.
@Suite struct EngineTests {
  func names(_ fs: FileSystem, _ ino: Inode, from offset: UInt64, max: Int) throws -> (
    [String], UInt64
  ) {
    var out: [String] = []
    var next = offset
    try fs.readdir(ino, offset: offset, plus: false) { e in
      guard out.count < max else { return false }
      out.append(e.name)
      next = e.nextOffset
      return true
    }
    return (out, next)
  }

  @Test func readdirOffsetsStayValidWhileTheDirectoryChanges() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let dir = try fs.mkdir(parent: 1, name: "d", mode: 0o755)
    for i in 0..<100 {
      let (_, f) = try fs.create(parent: dir.inode, name: "f\(i)", mode: 0o644, flags: O_WRONLY)
      try fs.release(f.handle)
    }
    let (first, cursor) = try names(fs, dir.inode, from: 0, max: 40)
    #expect(first.prefix(2) == [".", ".."])
    // Meanwhile: remove listed and unlisted entries, add new ones.
    for i in [0, 5, 50, 51, 99] { try fs.unlink(parent: dir.inode, name: "f\(i)") }
    for i in 100..<110 {
      let (_, f) = try fs.create(parent: dir.inode, name: "f\(i)", mode: 0o644, flags: O_WRONLY)
      try fs.release(f.handle)
    }
    let (rest, _) = try names(fs, dir.inode, from: cursor, max: 1000)
    let all = first + rest
    #expect(Set(all).count == all.count, "an entry was listed twice")
    for i in 0..<100 where ![0, 5, 50, 51, 99].contains(i) {
      #expect(all.contains("f\(i)"), "f\(i) was skipped")
    }
    #expect(rest.contains("f105"))
    #expect(!rest.contains("f50"))
  }

  /// A listing with attributes notes each child for the requests by name that follow it with
  /// no lookup (`rm -r`); a note is a hint, checked against the node: a child moved, replaced
  /// or deleted since (by a pull) is not taken for the listed one.
  @Test func childrenNotedByAListingAreCheckedWhenUsed() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let dir = try fs.mkdir(parent: 1, name: "d", mode: 0o755)
    // Made behind the engine (as a pull makes them): only the listing notes them.
    try w.catalog.write(w.userID) { tx in
      for name in ["a", "b", "c", "keep"] {
        _ = try tx.createNode(path: TreesystemPath(["d", name]))
      }
    }
    var listed: [String] = []
    try fs.readdir(dir.inode, offset: 0, plus: true) { e in
      listed.append(e.name)
      return true
    }
    #expect(Set(listed).isSuperset(of: ["a", "b", "c", "keep"]))
    // Another device's changes, as a pull makes them: `a` moved to `a2`, `b` deleted and a new
    // `b` made, `c` deleted.
    let newB = try w.catalog.write(w.userID) { tx -> NodeID in
      let d = try #require(try tx.node(path: TreesystemPath(["d"])))
      let a = try #require(try tx.child(of: d.id, named: "a"))
      try tx.moveNode(a.id, toParent: d.id, name: "a2")
      try tx.deleteNode(try #require(try tx.child(of: d.id, named: "b")).id)
      try tx.deleteNode(try #require(try tx.child(of: d.id, named: "c")).id)
      return try tx.createNode(path: TreesystemPath(["d", "b"])).id
    }
    #expect(throws: FileSystemError.notFound) { try fs.unlink(parent: dir.inode, name: "a") }
    #expect(throws: FileSystemError.notFound) { try fs.unlink(parent: dir.inode, name: "c") }
    try fs.unlink(parent: dir.inode, name: "b")
    try fs.unlink(parent: dir.inode, name: "a2")
    try fs.unlink(parent: dir.inode, name: "keep")
    try w.catalog.read(w.userID) { tx in
      let d = try #require(try tx.node(path: TreesystemPath(["d"])))
      #expect(try tx.children(of: d.id).isEmpty)
      #expect(try tx.node(id: newB) == nil)
    }
  }

  @Test func accessChecksFollowOwnerGroupAndOtherBits() throws {
    let w = try LazyDownloadTests.World()
    var options = FileSystemOptions()
    options.uid = 1000
    options.gid = 100
    let fs = try FileSystem(
      catalog: w.catalog, userID: w.userID, disk: w.disk, downloads: nil, options: options)
    let (f, h) = try fs.create(parent: 1, name: "f", mode: 0o640, flags: O_WRONLY)
    try fs.release(h.handle)
    let owner = Caller(uid: 1000, gid: 5)
    let member = Caller(uid: 1001, gid: 100)
    let other = Caller(uid: 1001, gid: 5)
    for (caller, allowed) in [(owner, [AccessMask.read, .write]), (member, [.read]), (other, [])] {
      for mask in [AccessMask.read, .write, .execute] {
        if allowed.contains(mask) {
          try fs.checkAccess(f.inode, mask, caller: caller)
        } else {
          #expect(throws: FileSystemError.accessDenied) {
            try fs.checkAccess(f.inode, mask, caller: caller)
          }
        }
      }
    }
    // The superuser may read and write anything, but not execute a file no one may execute.
    try fs.access(f.inode, mask: R_OK | W_OK, caller: .superuser)
    #expect(throws: FileSystemError.accessDenied) {
      try fs.access(f.inode, mask: X_OK, caller: .superuser)
    }
    try fs.access(f.inode, mask: F_OK, caller: other)
    #expect(throws: FileSystemError.notFound) { try fs.access(99_999, mask: F_OK, caller: owner) }
  }

  @Test func unprivilegedWritesClearSetUserAndGroupIDs() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let user = Caller(uid: 1000, gid: 1000)
    func file(_ name: String, _ mode: UInt32) throws -> Inode {
      let (a, h) = try fs.create(parent: 1, name: name, mode: 0o644, flags: O_WRONLY)
      try fs.release(h.handle)
      var c = AttributeChanges()
      c.mode = mode
      _ = try fs.setattr(a.inode, c)
      return a.inode
    }
    func write(_ ino: Inode, as caller: Caller, flags: Int32 = O_WRONLY) throws {
      let h = try fs.open(ino, flags: flags, caller: caller)
      _ = try Data("x".utf8).withUnsafeBytes { try fs.write(h.handle, offset: 0, bytes: $0) }
      try fs.release(h.handle)
    }
    let a = try file("a", 0o4755)
    let openedOnly = try fs.open(a, flags: O_WRONLY, caller: user)
    try fs.release(openedOnly.handle)
    #expect(try fs.getattr(a).mode == 0o4755, "opening for writing changes nothing")
    try write(a, as: user)
    #expect(try fs.getattr(a).mode == 0o755)
    let b = try file("b", 0o6775)
    try write(b, as: .superuser)
    #expect(try fs.getattr(b).mode == 0o6775, "the superuser's writes keep the bits")
    try write(b, as: user)
    #expect(try fs.getattr(b).mode == 0o775)
    let c = try file("c", 0o2745)
    try write(c, as: user)
    #expect(try fs.getattr(c).mode == 0o2745, "set-group-ID stays when the group may not execute")
    let d = try file("d", 0o4755)
    try write(d, as: user, flags: O_WRONLY | O_TRUNC)
    #expect(try fs.getattr(d).mode == 0o755)
    let e = try file("e", 0o4755)
    var truncate = AttributeChanges()
    truncate.size = 0
    _ = try fs.setattr(e, truncate, caller: user)
    #expect(try fs.getattr(e).mode == 0o755)
    let dir = try fs.mkdir(parent: 1, name: "dir", mode: 0o2775)
    #expect(try fs.getattr(dir.inode).mode == 0o2775)
  }

  /// The children the engine met lately are hints, checked against the catalog: a child that
  /// is renamed, deleted or replaced behind the engine (as a pull does) is not found under its
  /// old name, and a new one under that name is.
  @Test func childrenMetLatelyFollowChangesMadeBehindTheEngine() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let d = try fs.mkdir(parent: 1, name: "d", mode: 0o755)
    let (a, h) = try fs.create(parent: d.inode, name: "a", mode: 0o644, flags: O_WRONLY)
    try fs.release(h.handle)
    #expect(try fs.lookup(parent: d.inode, name: "a").inode == a.inode)
    let aID = NodeID(a.inode)
    let dID = NodeID(d.inode)
    try fs.catalog.write(fs.userID) { tx in try tx.moveNode(aID, toParent: dID, name: "b") }
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: d.inode, name: "a") }
    #expect(throws: FileSystemError.notFound) { try fs.unlink(parent: d.inode, name: "a") }
    #expect(try fs.lookup(parent: d.inode, name: "b").inode == a.inode)
    let other = try fs.catalog.write(fs.userID) { tx in
      try tx.createNode(
        Node(
          uuid: "", localUserID: fs.userID, parentID: dID, name: "a", kind: .file,
          shareList: .owner(fs.userID), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
          cloudID: "", mode: 0o644, mtime: FileTime(Date())))
    }
    #expect(try fs.lookup(parent: d.inode, name: "a").inode == Inode(other.id))
    // Renamed through the engine, then deleted behind it.
    try fs.rename(parent: d.inode, name: "b", newParent: 1, newName: "c", flags: [])
    try fs.catalog.write(fs.userID) { tx in try tx.deleteNode(aID) }
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: 1, name: "c") }
    #expect(throws: FileSystemError.notFound) {
      try fs.rename(parent: 1, name: "c", newParent: 1, newName: "e", flags: [])
    }
    try fs.unlink(parent: d.inode, name: "a")
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: d.inode, name: "a") }
  }

  /// Two devices each kept their spelling of a name and the other spelling went: a name and the
  /// case variant of that same name are siblings. No two entries may show alike: the variant
  /// is shown escaped while the plain name is there, reachable by that name, and shown as its
  /// name again once the plain one is gone (found by tools/fsx-sync).
  @Test func aCaseVariantBesideItsOwnNameIsShownEscaped() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let d = try fs.mkdir(parent: 1, name: "d", mode: 0o755)
    let dID = NodeID(d.inode)
    func make(_ name: String) throws -> Node {
      try fs.catalog.write(fs.userID) { tx in
        try tx.createNode(
          Node(
            uuid: "", localUserID: fs.userID, parentID: dID, name: name, kind: .file,
            shareList: .owner(fs.userID), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
            cloudID: "", mode: 0o644, mtime: FileTime(Date())))
      }
    }
    func esc(_ name: String) -> String {
      "%%" + name.replacingOccurrences(of: "\u{0}", with: "%00")
    }
    func entries() throws -> [String] {
      try names(fs, d.inode, from: 0, max: 10).0.filter { $0 != "." && $0 != ".." }
    }
    let variant = try make(CaseVariant.name(for: "A"))
    #expect(try entries() == ["A"])
    #expect(try fs.lookup(parent: d.inode, name: "A").inode == Inode(variant.id))
    let escaped = esc(CaseVariant.name(for: "A"))
    // Not shadowed: the escaped form is no name of it.
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: d.inode, name: escaped) }
    let plain = try make("A")
    #expect(Set(try entries()) == ["A", escaped])
    #expect(try fs.lookup(parent: d.inode, name: "A").inode == Inode(plain.id))
    #expect(try fs.lookup(parent: d.inode, name: escaped).inode == Inode(variant.id))
    // A variant is never typed as a new name.
    #expect(throws: FileSystemError.invalidArgument) {
      try fs.mkdir(
        parent: d.inode,
        name: esc(CaseVariant.name(for: "B")),
        mode: 0o755)
    }
    // Renamed by its escaped name, it is an ordinary file; the plain one stays.
    try fs.rename(parent: d.inode, name: escaped, newParent: d.inode, newName: "A 2", flags: [])
    #expect(Set(try entries()) == ["A", "A 2"])
    #expect(try fs.lookup(parent: d.inode, name: "A 2").inode == Inode(variant.id))
    // Shadowed again, then the plain one goes: the variant shows as its name again.
    try fs.catalog.write(fs.userID) { tx in
      try tx.moveNode(variant.id, toParent: dID, name: CaseVariant.name(for: "A"))
    }
    try fs.unlink(parent: d.inode, name: "A")
    #expect(try entries() == ["A"])
    #expect(try fs.lookup(parent: d.inode, name: "A").inode == Inode(variant.id))
  }

  /// A name shown in hashed form, or as a case variant's escape, is no new name; but a rename
  /// over the entry it names replaces that entry, as over any name a directory shows, and the
  /// source takes the entry's stored name (tools/fsx-sync seeds 163 and 165 renamed over such
  /// entries and met `EINVAL`, where a local directory renames).
  @Test func aRenameOverAnEntryShownEscapedReplacesIt() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let d = try fs.mkdir(parent: 1, name: "d", mode: 0o755)
    let dID = NodeID(d.inode)
    func make(_ name: String, _ kind: NodeKind) throws -> Node {
      try fs.catalog.write(fs.userID) { tx in
        try tx.createNode(
          Node(
            uuid: "", localUserID: fs.userID, parentID: dID, name: name, kind: kind,
            shareList: .owner(fs.userID), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
            cloudID: "", mode: 0o644, mtime: FileTime(Date())))
      }
    }
    func entries() throws -> Set<String> {
      Set(try names(fs, d.inode, from: 0, max: 10).0.filter { $0 != "." && $0 != ".." })
    }
    func newFile(_ name: String, bytes: Int) throws -> Inode {
      let (a, h) = try fs.create(parent: d.inode, name: name, mode: 0o644, flags: O_WRONLY)
      _ = try Data(repeating: 0x61, count: bytes).withUnsafeBytes {
        try fs.write(h.handle, offset: 0, bytes: $0)
      }
      try fs.release(h.handle)
      return a.inode
    }
    let long = String(repeating: "x", count: 300)
    let shown = NameEscape.shown(long)
    let target = try make(long, .file)
    #expect(try entries() == [shown])
    // A file over a file: the target keeps its identity (the editors' rule) and its long name.
    _ = try newFile("new", bytes: 3)
    try fs.rename(parent: d.inode, name: "new", newParent: d.inode, newName: shown, flags: [])
    #expect(try entries() == [shown])
    let replaced = try fs.lookup(parent: d.inode, name: shown)
    #expect(replaced.inode == Inode(target.id) && replaced.size == 3)
    // Onto itself by that name: nothing changes.
    try fs.rename(parent: d.inode, name: shown, newParent: d.inode, newName: shown, flags: [])
    #expect(try fs.lookup(parent: d.inode, name: shown).inode == Inode(target.id))
    // A directory over an empty directory shown hashed takes its long name.
    let longDir = String(repeating: "y", count: 300)
    _ = try make(longDir, .directory)
    let sub = try fs.mkdir(parent: d.inode, name: "sub", mode: 0o755)
    try fs.rename(
      parent: d.inode, name: "sub", newParent: d.inode, newName: NameEscape.shown(longDir),
      flags: [])
    #expect(try entries() == [shown, NameEscape.shown(longDir)])
    #expect(try fs.lookup(parent: d.inode, name: NameEscape.shown(longDir)).inode == sub.inode)
    // Exchanged with an entry shown hashed, each takes the other's name.
    let other = try newFile("other", bytes: 5)
    try fs.rename(
      parent: d.inode, name: "other", newParent: d.inode, newName: shown, flags: .exchange)
    #expect(try fs.lookup(parent: d.inode, name: shown).inode == other)
    #expect(try fs.lookup(parent: d.inode, name: "other").inode == Inode(target.id))
    // Naming no entry, a hashed form is still refused as a new name.
    let absent = NameEscape.shown(String(repeating: "z", count: 300))
    #expect(throws: FileSystemError.invalidArgument) {
      try fs.rename(parent: d.inode, name: "other", newParent: d.inode, newName: absent, flags: [])
    }
    // A case variant shown escaped (beside its plain name) is replaced the same way.
    let variant = try make(CaseVariant.name(for: "A"), .file)
    _ = try make("A", .file)
    let escaped = "%%" + CaseVariant.name(for: "A").replacingOccurrences(of: "\u{0}", with: "%00")
    #expect(try entries().isSuperset(of: ["A", escaped]))
    _ = try newFile("v", bytes: 7)
    try fs.rename(parent: d.inode, name: "v", newParent: d.inode, newName: escaped, flags: [])
    let variantNow = try fs.lookup(parent: d.inode, name: escaped)
    #expect(variantNow.inode == Inode(variant.id) && variantNow.size == 7)
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: d.inode, name: "v") }
  }

  /// A data conflict settled while a close waits for the catalog (its content committed on
  /// disk, the catalog write not made yet) gives that content to the conflicted copy, with its
  /// size; the close then leaves the node, which stands for the remote version now, alone.
  @Test func aCloseWaitingWhileAConflictTakesItsContentLeavesTheNodeToTheRemoteVersion() throws {
    let w = try LazyDownloadTests.World()
    defer { withExtendedLifetime(w) {} }
    let fs = try w.fileSystem(online: false)
    let bridge = FileSystemSyncDelegate(fileSystem: fs)
    func put(_ h: FileHandleID, _ text: String) throws {
      _ = try Data(text.utf8).withUnsafeBytes { try fs.write(h, offset: 0, bytes: $0) }
    }
    let (attrs, first) = try fs.create(parent: 1, name: "doc", mode: 0o644, flags: O_WRONLY)
    try put(first.handle, "v1")
    try fs.release(first.handle)
    let id = try #require(
      try w.catalog.read(w.userID) { try $0.node(path: TreesystemPath(["doc"])) }
    ).id
    let second = try fs.open(attrs.inode, flags: O_WRONLY | O_TRUNC)
    let v2 = "the second version, longer than the first"
    try put(second.handle, v2)
    // The push meets a newer DATA in the store (a 412) and settles the conflict in one
    // transaction, begun before the close and still running when the close commits on disk.
    let entered = DispatchSemaphore(value: 0)
    let done = DispatchSemaphore(value: 0)
    let remoteSize: UInt64 = 7
    let failure = Mutex<(any Error)?>(nil)
    let disk = w.disk
    let (catalog, userID) = (w.catalog, w.userID)
    Thread.detachNewThread {
      defer { done.signal() }
      do {
        try catalog.write(userID) { tx in
          entered.signal()
          // Until the close has committed its content on disk (it then waits for this).
          for _ in 0..<500 {
            if let s = try disk.openStaged(forNode: id) {
              defer { s.close() }
              if s.size == UInt64(v2.utf8.count) { break }
            }
            usleep(10_000)
          }
          var cur = try tx.existingNode(id: id)
          let copy = try tx.createNode(path: TreesystemPath(["doc (conflicted copy)"]))
          _ = try tx.queueDataUpload(nodeID: copy.id)
          let path = try TreesystemPath(["doc"])
          bridge.didDiscoverConflict(.data, node: cur, other: copy, at: path, transaction: tx)
          for op in try tx.pendingOperations(forNodeID: id) where op.kind == .putData {
            try tx.completeOperation(id: op.id)
          }
          cur.dataSize = remoteSize
          _ = try tx.updateNode(cur)
        }
      } catch {
        failure.withLock { $0 = error }
      }
    }
    entered.wait()
    try fs.release(second.handle)
    done.wait()
    if let error = failure.withLock({ $0 }) { throw error }
    let (node, copy, ops) = try w.catalog.read(w.userID) { tx in
      (
        try tx.existingNode(id: id),
        try #require(try tx.node(path: TreesystemPath(["doc (conflicted copy)"]))),
        try tx.pendingOperations(forNodeID: id)
      )
    }
    // The node stands for the remote version: the close wrote nothing of its own there.
    #expect(node.dataSize == remoteSize)
    #expect(!ops.contains { $0.kind == .putData })
    // The copy holds the closed content, with its size.
    #expect(copy.dataSize == UInt64(v2.utf8.count))
    let c = try fs.lookup(parent: 1, name: "doc (conflicted copy)")
    #expect(c.size == UInt64(v2.utf8.count))
    let h = try fs.open(c.inode, flags: O_RDONLY)
    defer { try? fs.release(h.handle) }
    let read = try LazyDownloadTests.read(fs, h.handle, at: 0, count: 4096)
    #expect(String(decoding: read, as: UTF8.self) == v2)
  }

  @Test func typedErrorsForPOSIXCases() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let d = try fs.mkdir(parent: 1, name: "d", mode: 0o755)
    let (f, h) = try fs.create(parent: d.inode, name: "f", mode: 0o644, flags: O_WRONLY)
    try fs.release(h.handle)
    // A name that differs only in case is another entry, as on a local file system.
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: 1, name: "D") }
    let upper = try fs.mkdir(parent: 1, name: "D", mode: 0o755)
    #expect(upper.inode != d.inode)
    #expect(try fs.lookup(parent: 1, name: "D").inode == upper.inode)
    #expect(try fs.lookup(parent: 1, name: "d").inode == d.inode)
    #expect(throws: FileSystemError.exists) { try fs.mkdir(parent: 1, name: "D", mode: 0o755) }
    #expect(throws: FileSystemError.exists) { try fs.mkdir(parent: 1, name: "d", mode: 0o755) }
    #expect(throws: FileSystemError.notEmpty) { try fs.rmdir(parent: 1, name: "d") }
    #expect(throws: FileSystemError.notADirectory) {
      try fs.mkdir(parent: f.inode, name: "x", mode: 0o755)
    }
    #expect(throws: FileSystemError.isADirectory) { try fs.unlink(parent: 1, name: "d") }
    #expect(throws: FileSystemError.notPermitted) {
      try fs.link(f.inode, newParent: 1, newName: "hard")
    }
    #expect(throws: FileSystemError.invalidArgument) {
      try fs.rename(
        parent: d.inode, name: "f", newParent: 1, newName: "g", flags: [.exchange, .noReplace])
    }
    #expect(throws: FileSystemError.invalidArgument) {
      try fs.rename(parent: 1, name: "d", newParent: d.inode, newName: "inside", flags: [])
    }
    #expect(throws: FileSystemError.notPermitted) {
      try fs.setattr(f.inode, AttributeChanges(uid: 4242))
    }
    #expect(throws: FileSystemError.noAttribute) { try fs.getxattr(f.inode, name: "user.none") }
    // Namespaces other than `user.` are unsupported (so `ls -l` stops asking for labels and
    // ACLs after the first file), not merely absent.
    for name in ["security.selinux", "system.posix_acl_access", "trusted.x"] {
      #expect(throws: FileSystemError.notSupported) { try fs.getxattr(f.inode, name: name) }
      #expect(throws: FileSystemError.notSupported) { try fs.removexattr(f.inode, name: name) }
    }
    #expect(throws: FileSystemError.notSupported) {
      try fs.setxattr(f.inode, name: "trusted.x", value: Data(), mode: .any)
    }
    #expect(throws: FileSystemError.tooBig) {
      try fs.setxattr(f.inode, name: "user.big", value: Data(count: 70_000), mode: .any)
    }
    try fs.setxattr(f.inode, name: "user.k", value: Data("v".utf8), mode: .create)
    #expect(throws: FileSystemError.exists) {
      try fs.setxattr(f.inode, name: "user.k", value: Data(), mode: .create)
    }
    #expect(throws: FileSystemError.noAttribute) {
      try fs.setxattr(f.inode, name: "user.absent", value: Data(), mode: .replace)
    }
    #expect(fs.statfs().nameMax == 255)
    #expect(throws: FileSystemError.notPermitted) {
      try fs.create(parent: 1, name: ".data", mode: 0o644, flags: O_WRONLY)
    }
  }

  /// A close commits the content at once; the staging version it sealed is closed after the
  /// request (by the release, or by the next commit of a descriptor kept open), never left open.
  @Test func aSealedStagingVersionIsClosedByTheReleaseOrTheNextCommit() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let (attrs, h) = try fs.create(parent: 1, name: "f", mode: 0o644, flags: O_RDWR)
    func write(_ text: String) throws {
      _ = try Data(text.utf8).withUnsafeBytes { try fs.write(h.handle, offset: 0, bytes: $0) }
    }
    func readBack() throws -> Data {
      let o = try fs.open(attrs.inode, flags: O_RDONLY)
      defer { try? fs.release(o.handle) }
      return try LazyDownloadTests.read(fs, o.handle, at: 0, count: 100)
    }
    try write("one")
    try fs.flush(h.handle)
    #expect(try readBack() == Data("one".utf8))
    #expect(w.disk.usage.pinnedEntries == 1)  // the sealed version, until the release
    for text in ["two", "six", "ten"] {
      try write(text)
      try fs.flush(h.handle)
      #expect(try readBack() == Data(text.utf8))
      // Each commit closes the version the one before sealed.
      #expect(w.disk.usage.pinnedEntries == 1)
    }
    try fs.release(h.handle)
    #expect(w.disk.usage.pinnedEntries == 0)
    #expect(try readBack() == Data("ten".utf8))
    #expect(w.disk.usage.pinnedEntries == 0)
  }

  @Test func fallocateExtendsZeroesAndRefusesWhatItCannotDo() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let (attrs, h) = try fs.create(parent: 1, name: "f", mode: 0o644, flags: O_RDWR)
    _ = try Data("abcdefghij".utf8).withUnsafeBytes { try fs.write(h.handle, offset: 0, bytes: $0) }
    typealias Mode = FileSystem.AllocationMode
    func content() throws -> Data {
      try LazyDownloadTests.read(fs, h.handle, at: 0, count: 1 << 20)
    }
    // Keeping the size changes nothing, within the file or past its end.
    try fs.fallocate(h.handle, mode: .keepSize, offset: 4, length: 100)
    #expect(try content() == Data("abcdefghij".utf8))
    // A hole punched reads as zeros; the size stays.
    try fs.fallocate(h.handle, mode: [.punchHole, .keepSize], offset: 2, length: 3)
    #expect(try content() == Data("ab\0\0\0fghij".utf8))
    // A zeroed range past the end extends the file unless the size is kept.
    try fs.fallocate(h.handle, mode: [.zeroRange, .keepSize], offset: 8, length: 10)
    #expect(try content() == Data("ab\0\0\0fgh\0\0".utf8))
    try fs.fallocate(h.handle, mode: .zeroRange, offset: 9, length: 3)
    #expect(try content() == Data("ab\0\0\0fgh\0\0\0\0".utf8))
    // Mode 0 extends with zeros, across chunks; it never shrinks.
    try fs.fallocate(h.handle, mode: [], offset: 0, length: 100_000)
    try fs.fallocate(h.handle, mode: [], offset: 0, length: 5)
    let extended = try content()
    #expect(extended.count == 100_000)
    #expect(extended.prefix(12) == Data("ab\0\0\0fgh\0\0\0\0".utf8))
    #expect(extended.dropFirst(12).allSatisfy { $0 == 0 })
    #expect(try fs.getattr(attrs.inode).size == 100_000)
    // What it cannot do is refused with EOPNOTSUPP (`notSupported`), never ENOSYS.
    for mode: Int32 in [0x08 /* collapse */, 0x20 /* insert */, 0x02 /* punch alone */, 0x40] {
      #expect(throws: FileSystemError.notSupported) {
        try fs.fallocate(h.handle, mode: Mode(rawValue: mode), offset: 0, length: 4096)
      }
    }
    #expect(throws: FileSystemError.invalidArgument) {
      try fs.fallocate(h.handle, mode: [], offset: 1, length: 0)
    }
    // Committed at close like a write: the content survives a reopen.
    try fs.flush(h.handle)
    try fs.release(h.handle)
    let o = try fs.open(attrs.inode, flags: O_RDONLY)
    defer { try? fs.release(o.handle) }
    #expect(try LazyDownloadTests.read(fs, o.handle, at: 0, count: 1 << 20) == extended)
    #expect(throws: FileSystemError.badHandle) {
      try fs.fallocate(o.handle, mode: [], offset: 0, length: 1)
    }
  }

  @Test func mknodMakesFilesFifosAndSocketsAndRefusesDevices() throws {
    let w = try LazyDownloadTests.World()
    let fs = try w.fileSystem(online: false)
    let a = try fs.mknod(parent: 1, name: "plain", mode: UInt32(S_IFREG) | 0o640)
    #expect(a.type == .regular && a.size == 0 && a.mode == 0o640)
    #expect(try fs.lookup(parent: 1, name: "plain").inode == a.inode)
    // No type bits means a regular file too; a name taken is EEXIST.
    _ = try fs.mknod(parent: 1, name: "untyped", mode: 0o600)
    #expect(throws: FileSystemError.exists) {
      try fs.mknod(parent: 1, name: "plain", mode: UInt32(S_IFREG) | 0o600)
    }
    // A FIFO and a socket keep their type through a chmod; they have no size.
    let fifo = try fs.mknod(parent: 1, name: "fifo", mode: UInt32(S_IFIFO) | 0o640)
    #expect(fifo.type == .fifo && fifo.mode == 0o640 && fifo.size == 0)
    var chmod = AttributeChanges()
    chmod.mode = 0o600
    #expect(try fs.setattr(fifo.inode, chmod).type == .fifo)
    #expect(try fs.getattr(fifo.inode).mode == 0o600)
    let sock = try fs.mknod(parent: 1, name: "sock", mode: UInt32(S_IFSOCK) | 0o755)
    #expect(sock.type == .socket && sock.mode == 0o755)
    #expect(try fs.lookup(parent: 1, name: "sock").type == .socket)
    for type in [S_IFCHR, S_IFBLK] {
      #expect(throws: FileSystemError.notPermitted) {
        try fs.mknod(parent: 1, name: "special", mode: UInt32(type) | 0o600)
      }
    }
    #expect(throws: FileSystemError.notFound) { try fs.lookup(parent: 1, name: "special") }
  }
}
