import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

/// A catalog opened with a field key keeps node keys, extended attributes, data tags (a
/// directory's `.meta` and `.thumb`) and its redo journal's records out of its files in the
/// clear; one from before it had a key is sealed when first opened with one.
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
    var nodeKey: Data
    var xattr: Data
    var section: Data
    var needles: [Data] { [nodeKey, xattr, section] }
  }

  /// A file node `f` with an extended attribute and a data tag, in a `.soon` write (journaled).
  func writeSensitive(_ catalog: Catalog) throws -> Written {
    let xattr = Data("xattr-marker-\(UUID().uuidString)".utf8)
    let section = Data("section-marker-\(UUID().uuidString)".utf8)
    let nodeKey = try catalog.write(user, commit: .soon) { tx -> Data in
      var n = try tx.createNode(path: p("f"))
      n.xattrs = ["user.k": xattr]
      try tx.updateNode(n)
      try tx.setTag(.data(section), forNodeID: n.id, identifier: "zdcfs.meta")
      return n.encryptionKey
    }
    return Written(nodeKey: nodeKey, xattr: xattr, section: section)
  }

  func expectReadBack(_ catalog: Catalog, _ w: Written) throws {
    try catalog.read(user) { tx in
      let n = try #require(try tx.node(path: p("f")))
      #expect(n.encryptionKey == w.nodeKey)
      #expect(n.xattrs == ["user.k": w.xattr])
      #expect(try tx.tag(forNodeID: n.id, identifier: "zdcfs.meta") == .data(w.section))
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

  @Test func withoutItsKeyASealedCatalogRefusesSealedFields() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    do {
      let catalog = try open(dir, key: SecureRandom.bytes(32))
      try catalog.createLocalUser(makeUser(user))
      _ = try writeSensitive(catalog)
      try catalog.commitPending()
    }
    // No key: what needs none still reads (`zdc status` counts pending uploads).
    let locked = try open(dir, key: nil)
    #expect(try locked.read(user) { try $0.operationCount() } > 0)
    #expect(throws: CatalogError.locked) {
      try locked.read(user) { tx in _ = try tx.node(path: p("f")) }
    }
    #expect(throws: CatalogError.locked) {
      try locked.write(user) { tx in _ = try tx.createNode(path: p("g")) }
    }
    // Another key: the fields fail authentication.
    let wrong = try open(dir, key: SecureRandom.bytes(32))
    #expect(throws: CatalogError.self) {
      try wrong.read(user) { tx in _ = try tx.node(path: p("f")) }
    }
  }

  @Test func aCatalogFromBeforeSealingIsSealedWhenOpenedWithAKey() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    var w: Written
    do {
      let plain = try open(dir, key: nil)
      try plain.createLocalUser(makeUser(user))
      w = try writeSensitive(plain)
      try plain.commitPending()
    }
    // The check sees plaintext where there is some.
    #expect(try found([w.xattr, w.section], in: dir).count == 2)
    let key = SecureRandom.bytes(32)
    do {
      let sealed = try open(dir, key: key)
      try expectReadBack(sealed, w)
      #expect(try found(w.needles, in: dir) == [])
    }
    try expectReadBack(try open(dir, key: key), w)
  }
}
