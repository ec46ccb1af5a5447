import Foundation
import Testing
import ZDCCore
import ZDCLocalStore

#if canImport(Glibc)
  import Glibc
#endif

/// Listing speed on large folders; run with `ZDC_STORE_BENCH=1` (they take a while to set up).
@Suite(
  "LocalFolderStore listing benchmark",
  .enabled(if: ProcessInfo.processInfo.environment["ZDC_STORE_BENCH"] != nil))
struct ListingBenchmarkTests {
  /// Writes object files directly (valid header, no fsync) to set up quickly.
  static func populate(_ root: URL, directories: Int, perDirectory: Int, prefix: String) throws
    -> [String]
  {
    var keys: [String] = []
    let header = Data("ZDCLOBJ1\(String(repeating: "0", count: 32))".utf8)
    for d in 0..<directories {
      let dir = String(format: "%032X", d &* 2_654_435_761)
      let url = root.appendingPathComponent(prefix).appendingPathComponent(dir)
      try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
      for i in 0..<perDirectory {
        let name = String(format: "%032x.rcrd", i &* 40_503 &+ d)
        let path = url.appendingPathComponent(name).path
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { throw StoreError.io("create \(path)", errno: errno) }
        _ = header.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        keys.append("\(prefix)/\(dir)/\(name)")
      }
    }
    return keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
  }

  static func timeListing(_ store: LocalFolderStore, prefix: String) throws -> ([String], Double) {
    let start = Date()
    let keys = try store.listAll(prefix: prefix, pageSize: 1000).map(\.key)
    return (keys, Date().timeIntervalSince(start))
  }

  @Test func hundredThousandKeysInAThousandDirectories() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let expected = try Self.populate(dir, directories: 1000, perDirectory: 100, prefix: "u/t")
    let store = try LocalFolderStore(root: dir)
    let (keys, seconds) = try Self.timeListing(store, prefix: "u/t/")
    print("listing 100,000 keys in 1,000 directories: \(seconds) s")
    #expect(keys == expected)
  }

  @Test func tenThousandKeysInOneDirectory() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let expected = try Self.populate(dir, directories: 1, perDirectory: 10_000, prefix: "u/t")
    let store = try LocalFolderStore(root: dir)
    let (keys, seconds) = try Self.timeListing(store, prefix: "u/t/")
    print("listing 10,000 keys in one directory: \(seconds) s")
    #expect(keys == expected)
    let start = Date()
    let tail = try store.list(
      prefix: "u/t/", startAfter: expected[9_990], continuationToken: nil, maxKeys: 100)
    print("listing the last 9 of 10,000 keys: \(Date().timeIntervalSince(start)) s")
    #expect(tail.objects.map(\.key) == Array(expected[9_991...]))
  }
}
