import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

@Suite(.serialized, .motoServer) struct ConflictTests {
  struct Pair {
    let backing: TestStore
    let a: Device
    let b: Device
  }

  func pair(_ label: String, _ kind: StoreKind) throws -> Pair {
    let backing = try kind.make("zdc-sync-\(label)")
    let (a, b) = try startedPair(on: backing.store)
    return Pair(backing: backing, a: a, b: b)
  }

  /// The same with multipart uploads (the 412 comes from completing the upload).
  @Test(arguments: StoreKind.all)
  func identicalLargeEditsNeedNoCopy(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-same-mp")
    let user = try TestUser()
    let multipart: (inout PushConfiguration, inout PullConfiguration) -> Void = { push, _ in
      push.multipartThreshold = 6 << 20
      push.partSize = 5 << 20
    }
    let a = try Device("alpha", user: user, store: backing.store, configure: multipart)
    let b = try Device("beta", user: user, store: backing.store, configure: multipart)
    try a.start()
    try b.start()
    try a.create("big.bin", "small at first")
    try a.sync()
    try b.sync()
    a.engine.push.stop()
    b.engine.push.stop()
    let content = SecureRandom.bytes(7 << 20)
    try a.write("big.bin", content)
    try b.write("big.bin", content)
    try a.engine.push.start()
    try a.sync()
    try b.engine.push.start()
    try b.sync()
    try a.sync()
    for d in [a, b] {
      #expect(try d.tree(withContent: false).keys.sorted() == ["/big.bin"])
      #expect(d.delegate.conflicts.isEmpty)
    }
    #expect(try b.cloudContent("big.bin") == content)
    a.engine.stop()
    b.engine.stop()
  }

  @Test func conflictedCopyNamesCarryTheUTCTimeAndDevice() {
    // 2025-11-26 03:04:05.9 UTC
    let date = Date(timeIntervalSince1970: 1_764_126_245.9)
    #expect(
      ConflictNames.conflictedCopy(of: "report.final.txt", date: date, deviceName: "laptop")
        == "report.final (conflicted copy 2025-11-26 030405 laptop).txt")
    #expect(
      ConflictNames.conflictedCopy(of: "Makefile", date: date, deviceName: "pc")
        == "Makefile (conflicted copy 2025-11-26 030405 pc)")
    #expect(ConflictNames.numbered("a.tar", 2) == "a 2.tar")
  }

  @Test(arguments: StoreKind.all)
  func dataConflictKeepsBothVersions(_ kind: StoreKind) throws {
    let p = try pair("data", kind)
    try p.a.create("doc.txt", "original")
    try p.a.sync()
    try p.b.sync()
    // Both edit before hearing of the other.
    p.a.engine.push.stop()
    p.b.engine.push.stop()
    try p.a.write("doc.txt", "alpha's edit")
    try p.b.write("doc.txt", "beta's edit")
    try p.a.engine.push.start()
    try p.a.sync()
    try p.b.engine.push.start()
    try p.b.sync()
    try p.a.sync()
    try p.b.sync()

    for d in [p.a, p.b] {
      let tree = try d.tree()
      #expect(tree.count == 2)
      #expect(tree["/doc.txt"] == "file:alpha's edit")
      let copy = tree.keys.first { $0.hasPrefix("/doc (conflicted copy ") }
      #expect(copy != nil)
      #expect(copy?.hasSuffix(" beta).txt") == true)
      if let copy { #expect(tree[copy] == "file:beta's edit") }
    }
    #expect(p.b.delegate.conflicts.contains { $0.0 == .data && $0.1 == "doc.txt" })
    #expect(p.b.delegate.events.contains { $0.hasPrefix("modified /home/doc.txt") })
    #expect(p.a.delegate.conflicts.isEmpty)
  }

  /// A data conflict on a node the other device renamed in place (a change of case only, so
  /// the same key) while this device also changed its attributes: the node stands for the
  /// remote version, name included (found by tools/fsx-sync, seed 115: the loser kept its old
  /// spelling for good while the store and the other device had the new one).
  @Test(arguments: StoreKind.all)
  func dataConflictTakesTheRemoteNameOfACaseOnlyRename(_ kind: StoreKind) throws {
    let p = try pair("data-case", kind)
    try p.a.create("doc.txt", "original")
    try p.a.sync()
    try p.b.sync()
    p.a.engine.push.stop()
    p.b.engine.push.stop()
    p.b.engine.pull.stop()
    try p.a.move("doc.txt", to: "DOC.txt")
    try p.a.write("DOC.txt", "alpha's edit")
    try p.b.write("doc.txt", "beta's edit")
    try p.b.catalog.write(p.b.user.userID) { tx in
      guard var n = try tx.node(path: TreesystemPath(["doc.txt"])) else { return }
      n.mode = 0o600
      try tx.updateNode(n)
    }
    try p.b.engine.pull.start()
    try p.a.engine.push.start()
    try p.a.sync()
    try p.b.engine.push.start()
    for _ in 0..<2 {
      try p.b.sync()
      try p.a.sync()
    }
    for d in [p.a, p.b] {
      let tree = try d.tree()
      #expect(tree["/DOC.txt"] == "file:alpha's edit", "\(d.name): \(tree)")
      #expect(tree["/doc.txt"] == nil, "\(d.name): \(tree)")
      #expect(tree.count == 2, "\(d.name): \(tree)")
      #expect(tree.values.contains("file:beta's edit"), "\(d.name): \(tree)")
    }
    #expect(p.b.delegate.conflicts.contains { $0.0 == .data })
  }

  /// Two devices that make the same edit have nothing to keep apart: the later upload finds its
  /// content in the store and takes that version, with no conflicted copy (this is also how an
  /// own upload whose answer was lost is recognised once its header is no longer remembered).
  @Test(arguments: StoreKind.all)
  func identicalEditsNeedNoCopy(_ kind: StoreKind) throws {
    let p = try pair("same-edit", kind)
    try p.a.create("doc.txt", "original")
    try p.a.sync()
    try p.b.sync()
    p.a.engine.push.stop()
    p.b.engine.push.stop()
    try p.a.write("doc.txt", "the same edit")
    try p.b.write("doc.txt", "the same edit")
    try p.a.engine.push.start()
    try p.a.sync()
    try p.b.engine.push.start()
    try p.b.sync()
    try p.a.sync()
    for d in [p.a, p.b] {
      #expect(try d.tree() == ["/doc.txt": "file:the same edit"])
      #expect(d.delegate.conflicts.isEmpty)
    }
    let eTags = try [p.a, p.b].map { d in
      try d.catalog.read(d.user.userID) { tx in
        try tx.node(path: TreesystemPath(["doc.txt"]))?.eTagData
      }
    }
    #expect(eTags[0] != nil && eTags[0] == eTags[1])
    #expect(try p.a.cloudContent("doc.txt") == Data("the same edit".utf8))
  }

  @Test(arguments: StoreKind.all)
  func pathConflictRenamesTheLaterNode(_ kind: StoreKind) throws {
    let p = try pair("path", kind)
    p.b.engine.push.stop()
    try p.a.create("same.txt", "from alpha")
    try p.b.create("same.txt", "from beta")
    try p.b.create("Other", kind: .directory)
    try p.a.create("other", kind: .directory)
    try p.a.sync()
    try p.b.engine.push.start()
    try p.b.sync()
    try p.a.sync()
    try p.b.sync()
    for d in [p.a, p.b] {
      let tree = try d.tree()
      #expect(tree["/same.txt"] == "file:from alpha")
      #expect(tree["/same 2.txt"] == "file:from beta")
      #expect(tree["/other"] == "dir")
      // A name that differs only in case is no conflict: kept as its case variant.
      #expect(tree["/" + CaseVariant.name(for: "Other")] == "dir")
      #expect(tree.count == 4)
    }
    #expect(p.b.delegate.conflicts.contains { $0.0 == .path && $0.1 == "same 2.txt" })
    #expect(!p.b.delegate.conflicts.contains { $0.1.hasPrefix("Other") })
    // The delegate hears of both renames with the old names (a mount makes the kernel forget
    // them: found by tools/fsx-sync, where a renamed symlink stayed reachable by its old name).
    #expect(p.b.delegate.events.contains("renamed same.txt -> same 2.txt"))
    #expect(p.b.delegate.events.contains("renamed Other -> \(CaseVariant.name(for: "Other"))"))
  }

  /// Two devices can end with a name and the case variant of that same name side by side:
  /// one kept its spelling as a variant of the other's, which the other device meanwhile
  /// renamed to exactly that spelling. The variant is then renamed to a numbered name, as in a
  /// path conflict, on whichever device meets the two first, so that no name changes later
  /// when one of them goes (found by tools/fsx-sync).
  @Test(arguments: StoreKind.all, [false, true])
  func aNameBesideItsOwnCaseVariantIsSettledAsAPathConflict(
    _ kind: StoreKind, variantUploadedFirst: Bool
  ) throws {
    let p = try pair("case-clash", kind)
    p.b.engine.push.stop()
    // B pulls only when told to (a pull of its own could bring A's spelling first).
    p.b.engine.pull.stop()
    try p.a.create("Makefile", "A")
    try p.a.sync()
    try p.b.create("makefile", "B")
    // B learns of A's spelling before its upload: it keeps its own as the case variant.
    _ = try p.b.engine.pull.pull()
    try p.b.engine.pull.start()
    let variant = CaseVariant.name(for: "makefile")
    #expect(try p.b.tree(withContent: false) == ["/Makefile": "file", "/" + variant: "file"])
    if variantUploadedFirst {
      try p.b.engine.push.start()
      try p.b.sync()
      try p.a.move("Makefile", to: "makefile")
      try p.a.sync()
    } else {
      try p.a.move("Makefile", to: "makefile")
      try p.a.sync()
      try p.b.engine.push.start()
      try p.b.sync()
    }
    for _ in 0..<2 {
      try p.a.sync()
      try p.b.sync()
    }
    let c = try Device("gamma", user: p.a.user, store: p.backing.store)
    try c.start()
    try c.sync()
    for d in [p.a, p.b, c] {
      #expect(try d.tree() == ["/makefile": "file:A", "/makefile 2": "file:B"], "\(d.name)")
    }
    #expect(
      [p.a, p.b].contains { d in
        d.delegate.conflicts.contains { $0.0 == .path && $0.1 == "makefile 2" }
      })
  }

  @Test(arguments: StoreKind.all)
  func deletedRemotelyWhileDirtyIsKept(_ kind: StoreKind) throws {
    let p = try pair("deldirty", kind)
    try p.a.create("d", kind: .directory)
    try p.a.create("d/f.txt", "v1")
    try p.a.create("d/clean.txt", "clean")
    try p.a.sync()
    try p.b.sync()
    p.b.engine.push.stop()
    try p.a.delete("d")
    try p.a.sync()
    try p.b.write("d/f.txt", "edited on beta")
    try p.b.engine.push.start()
    try p.b.sync()
    try p.a.sync()
    try p.b.sync()
    for d in [p.a, p.b] {
      let tree = try d.tree()
      #expect(tree["/d"] == "dir")
      #expect(tree["/d/f.txt"] == "file:edited on beta")
      #expect(tree["/d/clean.txt"] == nil)  // clean: its deletion applies
    }
    #expect(p.b.delegate.conflicts.contains { $0.0 == .deletedWhileDirty })
    #expect(p.b.delegate.events.contains("deletedDirty d"))
  }

  @Test(arguments: StoreKind.all, [false, true])
  func childPushedIntoRemotelyDeletedDirectoryIsKept(_ kind: StoreKind, fullScan: Bool) throws {
    let p = try pair("delpushed", kind)
    try p.a.create("d", kind: .directory)
    try p.a.create("d/old.txt", "old")
    try p.a.sync()
    try p.b.sync()
    try p.a.delete("d")
    try p.a.sync()
    // B adds a file to d and pushes it before hearing of the delete.
    try p.b.create("d/new.txt", "new from beta")
    #expect(p.b.engine.push.waitUntilIdle(timeout: 30))
    try p.b.engine.pull.pull(fullScan: fullScan)
    try p.b.sync()
    try p.a.sync()
    for d in [p.a, p.b] {
      #expect(try d.tree() == ["/d": "dir", "/d/new.txt": "file:new from beta"])
      // Each knows the DATA version in the store: its content is found by it (beta's file
      // was clean, its upload done, when the delete arrived: it used to lose its eTag, and the
      // mount read it as missing).
      let n = try #require(try d.node("d/new.txt"))
      let key = try #require(try d.catalog.read(d.user.userID) { try $0.objectLocation(of: n.id) })
        .dataKey
      let stored = try d.store.head(key: key).eTag
      #expect(n.eTagData == stored, "\(d.name)")
    }
    #expect(p.b.delegate.conflicts.contains { $0.0 == .deletedWhileDirty })
  }

  @Test(arguments: StoreKind.all)
  func movedRemotelyWhileEditedLocally(_ kind: StoreKind) throws {
    let p = try pair("movededit", kind)
    try p.a.create("m.txt", "v1")
    try p.a.create("sub", kind: .directory)
    try p.a.sync()
    try p.b.sync()
    p.b.engine.push.stop()
    try p.a.move("m.txt", to: "sub/m2.txt")
    try p.a.sync()
    try p.b.write("m.txt", "edited while moved")
    try p.b.engine.push.start()
    try p.b.sync()
    try p.a.sync()
    try p.b.sync()
    for d in [p.a, p.b] {
      let tree = try d.tree()
      #expect(tree == ["/sub": "dir", "/sub/m2.txt": "file:edited while moved"])
    }
    #expect(p.b.delegate.conflicts.contains { $0.0 == .movedWhileEdited })
    #expect(!p.b.delegate.conflicts.contains { $0.0 == .data })
  }

  @Test(arguments: StoreKind.all)
  func noPlaintextAfterConflicts(_ kind: StoreKind) throws {
    let p = try pair("plain", kind)
    try p.a.create("confidential-name.txt", "confidential content 12345")
    try p.a.sync()
    try p.b.sync()
    p.b.engine.push.stop()
    try p.a.write("confidential-name.txt", "confidential content alpha")
    try p.a.sync()
    try p.b.write("confidential-name.txt", "confidential content beta")
    try p.b.engine.push.start()
    try p.b.sync()
    let hits = try p.backing.plaintext([Data("confidential".utf8), Data("conflicted copy".utf8)])
    #expect(hits.isEmpty)
  }
}
