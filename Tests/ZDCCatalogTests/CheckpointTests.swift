import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

@Suite struct CheckpointTests {
  /// Commits that take the write-ahead log past SQLite's checkpoint threshold leave the
  /// checkpoint to the catalog's background connection (the writer would otherwise flush the
  /// log and the database inside a commit), and every commit is there after the catalog is
  /// opened again.
  @Test func theLogIsCheckpointedBesideTheWriter() throws {
    let dir = try tempDir()
    defer { try? FileManager.default.removeItem(at: dir) }
    let path = dir.appendingPathComponent("catalog.sqlite").path
    var made = 0
    do {
      let catalog = try Catalog(path: path, options: .init(durability: .normal))
      try catalog.createLocalUser(makeUser("alice"))
      try catalog.write("alice") { _ = try $0.createNode(path: p("d"), kind: .directory) }
      let deadline = Date().addingTimeInterval(60)
      while catalog.backgroundCheckpoints == 0 && Date() < deadline {
        try catalog.write("alice") { tx in
          for _ in 0..<20 {
            _ = try tx.createNode(path: p("d", "file \(made)"), kind: .file)
            made += 1
          }
        }
        if made % 1_000 == 0 { Thread.sleep(forTimeInterval: 0.05) }
      }
      #expect(catalog.backgroundCheckpoints > 0)
    }
    let reopened = try Catalog(path: path, options: .init(durability: .normal))
    let count = try reopened.read("alice") { tx -> Int? in
      guard let d = try tx.node(path: p("d")) else { return nil }
      return try tx.childCount(of: d.id)
    }
    #expect(count == made)
  }
}
