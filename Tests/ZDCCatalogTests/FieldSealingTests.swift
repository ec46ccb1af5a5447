import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// A catalog opened with a field key keeps names, symlink targets, node keys, directory salts,
/// extended attributes, data tags (a directory's `.meta` and `.thumb`) and its redo journal's
/// records out of its files in the clear, and keys its name index; one from before it had a key
/// (or from before names were sealed) is sealed when first opened with one.
@Suite struct FieldSealingTests {
  let user = "alice"

  func open(_ dir: URL, key: Data?) throws -> Catalog {
    try Catalog(
      path: dir.appendingPathComponent("catalog.sqlite").path,
      options: Catalog.Options(durability: .normal, batchWindow: 3600, fieldKey: key))
  }

  /// Which of `needles` the catalog's files (database, write-ahead log, redo journal) hold.
  func found(_ needles: [Data], in dir: URL) throws -> [Data] {
    var bytes = Data()
    for name in ["catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite.redo"] {
      bytes += (try? Data(contentsOf: dir.appendingPathComponent(name))) ?? Data()
    }
    return needles.filter { bytes.range(of: $0) != nil }
  }

  struct Written {
    var dir: String
    var name: String
    var target: String
    var nodeKey: Data
    var dirSalt: Data
    var xattr: Data
    var section: Data
    /// What must not be found: the names also as the name index would hold them in the clear
    /// (lowercased).
    var needles: [Data] {
      [
        Data(dir.utf8), Data(name.utf8), Data(dir.lowercased().utf8),
        Data(name.lowercased().utf8), Data(target.utf8), nodeKey, dirSalt, xattr, section,
      ]
    }
  }

  /// A directory holding a file node with an extended attribute and a data tag, and a symlink,
  /// in a `.soon` write (journaled).
  func writeSensitive(_ catalog: Catalog) throws -> Written {
    let marker = UUID().uuidString
    var w = Written(
      dir: "dir-marker-\(marker)", name: "Name-Marker-\(marker)",
      target: "target-marker-\(marker)", nodeKey: Data(), dirSalt: Data(),
      xattr: Data("xattr-marker-\(marker)".utf8), section: Data("section-marker-\(marker)".utf8))
    try catalog.write(user, commit: .soon) { tx in
      let d = try tx.createNode(path: p(w.dir), kind: .directory)
      var n = try tx.createNode(path: p(w.dir, w.name))
      n.xattrs = ["user.k": w.xattr]
      try tx.updateNode(n)
      try tx.setTag(.data(w.section), forNodeID: n.id, identifier: "zdcfs.meta")
      try tx.createNode(path: p(w.dir, "link"), kind: .symlink, symlinkTarget: w.target)
      w.nodeKey = n.encryptionKey
      w.dirSalt = d.dirSalt
    }
    return w
  }

  /// Everything written reads back, found by path (the name index works), and a name that
  /// differs only in case is still taken.
  /// A catalog from before sealing: written without a key.
  func writePlainCatalog(_ dir: URL) throws -> Written {
    let plain = try open(dir, key: nil)
    try plain.createLocalUser(makeUser(user))
    let w = try writeSensitive(plain)
    try plain.commitPending()
    return w
  }

  func expectReadBack(_ catalog: Catalog, _ w: Written) throws {
    try catalog.read(user) { tx in
      let d = try #require(try tx.node(path: p(w.dir)))
      #expect(d.dirSalt == w.dirSalt)
      let n = try #require(try tx.node(path: p(w.dir, w.name)))
      #expect(n.name == w.name)
      #expect(n.encryptionKey == w.nodeKey)
      #expect(n.xattrs == ["user.k": w.xattr])
      #expect(try tx.tag(forNodeID: n.id, identifier: "zdcfs.meta") == .data(w.section))
      #expect(try tx.path(of: n.id) == p(w.dir, w.name))
      #expect(try tx.node(path: p(w.dir, "link"))?.symlinkTarget == w.target)
      #expect(try tx.children(of: d.id).map(\.name).sorted() == [w.name, "link"].sorted())
    }
    #expect(throws: CatalogError.self) {
      try catalog.write(user) { tx in _ = try tx.createNode(path: p(w.dir, w.name.uppercased())) }
    }
  }

  @Test func sealedFieldsNeverReachTheFilesInTheClear() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let key = SecureRandom.bytes(32)
    var w: Written
    do {
      let catalog = try open(dir, key: key)
      try catalog.createLocalUser(makeUser(user))
      w = try writeSensitive(catalog)
      // Journaled, not committed yet: only the journal holds the change.
      #expect(try found(w.needles, in: dir) == [])
      try catalog.commitPending()
      #expect(try found(w.needles, in: dir) == [])
    }
    let reopened = try open(dir, key: key)
    try expectReadBack(reopened, w)
  }

  @Test func aCrashLeftJournalIsReplayedFromSealedRecords() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let key = SecureRandom.bytes(32)
    let catalog = try open(dir, key: key)
    try catalog.createLocalUser(makeUser(user))
    let w = try writeSensitive(catalog)
    // What a kill -9 would leave: the batch is still open.
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    #expect(try found(w.needles, in: copy) == [])
    let recovered = try open(copy, key: key)
    #expect(recovered.replayedJournalEntries > 0)
    try expectReadBack(recovered, w)
  }

  /// The records of content commits, deletes and queued data uploads are written plain
  /// (ids, a size, a time), beside the sealed ones of the same units, and replay.
  @Test func plainRecordsOfASealedJournalReplay() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let key = SecureRandom.bytes(32)
    let catalog = try open(dir, key: key)
    try catalog.createLocalUser(makeUser(user))
    let name = "Kept-Marker-\(UUID().uuidString)"
    let mtime = FileTime(seconds: 1_700_000_000, nanoseconds: 5)
    let (kept, gone) = try catalog.write(user, commit: .soon) { tx in
      let kept = try tx.createNode(path: p(name))
      _ = try tx.commitData(nodeID: kept.id, size: 12_345, mtime: mtime)
      let gone = try tx.createNode(path: p("gone"))
      try tx.deleteNode(gone.id)
      return (kept.id, gone.id)
    }
    let copy = try crashCopy(dir)
    defer { try? FileManager.default.removeItem(at: copy) }
    #expect(try found([Data(name.utf8)], in: copy) == [])
    let recovered = try open(copy, key: key)
    #expect(recovered.replayedJournalEntries > 0)
    try recovered.read(user) { tx in
      let n = try #require(try tx.node(path: p(name)))
      #expect(n.id == kept && n.dataSize == 12_345 && n.mtime == mtime)
      #expect(try tx.node(id: gone) == nil)
    }
  }

  @Test func withoutItsKeyASealedCatalogRefusesSealedFields() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    var w: Written
    do {
      let catalog = try open(dir, key: SecureRandom.bytes(32))
      try catalog.createLocalUser(makeUser(user))
      w = try writeSensitive(catalog)
      try catalog.commitPending()
    }
    // No key: what needs none still reads (`zdc status` counts pending uploads).
    let locked = try open(dir, key: nil)
    #expect(try locked.read(user) { try $0.operationCount() } > 0)
    #expect(throws: CatalogError.locked) {
      try locked.read(user) { tx in _ = try tx.node(path: p(w.dir)) }
    }
    #expect(throws: CatalogError.locked) {
      try locked.write(user) { tx in _ = try tx.createNode(path: p("g")) }
    }
    // Another key: the fields fail authentication.
    let wrong = try open(dir, key: SecureRandom.bytes(32))
    #expect(throws: CatalogError.self) {
      try wrong.read(user) { tx in _ = try tx.node(path: p(w.dir)) }
    }
  }

  @Test func aCatalogFromBeforeSealingIsSealedWhenOpenedWithAKey() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let w = try writePlainCatalog(dir)
    // The check sees plaintext where there is some.
    #expect(
      try found([Data(w.name.utf8), Data(w.target.utf8), w.dirSalt, w.xattr, w.section], in: dir)
        .count == 5)
    let key = SecureRandom.bytes(32)
    do {
      let sealed = try open(dir, key: key)
      try expectReadBack(sealed, w)
      #expect(try found(w.needles, in: dir) == [])
    }
    try expectReadBack(try open(dir, key: key), w)
  }

  /// A catalog sealed before names were (level 1: keys, attributes, tags) has its names,
  /// symlink targets and directory salts sealed and its name index keyed at the next open.
  @Test func aCatalogSealedBeforeNamesWereHasThemSealedAtTheNextOpen() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let key = SecureRandom.bytes(32)
    let w = try writePlainCatalog(dir)
    var levelOne = Catalog.Options(durability: .normal, batchWindow: 3600, fieldKey: key)
    levelOne.sealingLevel = 1
    _ = try Catalog(path: dir.appendingPathComponent("catalog.sqlite").path, options: levelOne)
    // What an older build left: keys, attributes and tags sealed; names not yet.
    #expect(try found([w.nodeKey, w.xattr, w.section], in: dir) == [])
    #expect(try found([Data(w.name.utf8), Data(w.target.utf8), w.dirSalt], in: dir).count == 3)
    do {
      let sealed = try open(dir, key: key)
      try expectReadBack(sealed, w)
      #expect(try found(w.needles, in: dir) == [])
    }
    try expectReadBack(try open(dir, key: key), w)
  }

  /// The name index holds a name and its case variants in one range, plain or sealed.
  @Test(arguments: [false, true])
  func caseVariantsShareTheirNameRange(sealed: Bool) throws {
    let catalog = try Catalog.temporary(
      options: .init(fieldKey: sealed ? SecureRandom.bytes(32) : nil))
    try catalog.createLocalUser(makeUser(user))
    let names = ["Makefile", CaseVariant.name(for: "makefile"), CaseVariant.name(for: "MAKEFILE")]
    try catalog.write(user) { tx in
      for n in names + ["Makefile.am", "makefilf", "make"] { _ = try tx.createNode(path: p(n)) }
      #expect(throws: CatalogError.self) { _ = try tx.createNode(path: p("MakeFile")) }
      let home = try #require(try tx.trunkNode(.home))
      for asked in ["makefile", "MAKEFILE", "Makefile"] {
        #expect(try tx.children(of: home.id, sharingNameWith: asked).map(\.name) == names)
      }
      #expect(try tx.children(of: home.id, sharingNameWith: "make").map(\.name) == ["make"])
      #expect(try tx.children(of: home.id, sharingNameWith: "absent").isEmpty)
      // Names are read back whole (a NUL included), and so are paths.
      let v = try #require(try tx.node(path: p(names[1])))
      #expect(v.name == names[1])
      #expect(try tx.path(of: v.id) == p(names[1]))
      // A name of a variant's shape that is no variant of its prefix (a conflicted copy of a
      // variant: text went in before the suffix) is found by its own name (found by
      // tools/fsx-sync: it was listed, but a lookup missed it).
      let shaped =
        "B (conflicted copy).txt"
        + CaseVariant.name(for: "B.txt").utf8.suffix(17)
        .map { String(UnicodeScalar($0)) }.joined()
      #expect(CaseVariant.base(of: shaped) == nil && CaseVariant.splitKey(shaped) != nil)
      let made = try tx.createNode(path: p(shaped))
      #expect(try tx.children(of: home.id, sharingNameWith: shaped).map(\.id) == [made.id])
    }
  }
}
