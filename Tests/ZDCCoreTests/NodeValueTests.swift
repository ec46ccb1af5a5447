import Foundation
import Testing
import ZDCCore

/// `Node` shares its fields between copies until one changes: it must still behave as a plain
/// value (the catalog's node cache hands out copies of the nodes it keeps).
@Suite struct NodeValueTests {
  func sample() -> Node {
    Node(
      id: 7, uuid: "u", localUserID: "alice", parentID: 3, name: "report.txt", kind: .file,
      shareList: .owner("alice"), encryptionKey: Data(repeating: 1, count: 32),
      dirSalt: Data(repeating: 2, count: 20), dirPrefix: "00FF", cloudID: "cid", eTagRcrd: "e1",
      mode: 0o644, mtime: FileTime(seconds: 1_700_000_000, nanoseconds: 5),
      xattrs: ["user.a": Data("1".utf8)], dataSize: 42)
  }

  @Test func aChangedCopyLeavesTheOthersAlone() {
    let original = sample()
    var a = original
    let b = a
    a.name = "renamed"
    a.mode = 0o600
    a.xattrs["user.b"] = Data("2".utf8)
    a.xattrs["user.a"] = nil
    a.parentID = nil
    a.encryptionKey[0] = 9
    #expect(b == original)
    #expect(b.name == "report.txt" && b.mode == 0o644 && b.parentID == 3)
    #expect(b.xattrs == ["user.a": Data("1".utf8)])
    #expect(b.encryptionKey == Data(repeating: 1, count: 32))
    #expect(a.name == "renamed" && a.mode == 0o600 && a.parentID == nil)
    #expect(a.xattrs == ["user.b": Data("2".utf8)])
    #expect(a.encryptionKey.first == 9)
    #expect(a != b)
    // A copy changed back to the same fields equals the original again, and hashes alike.
    var c = a
    c.name = "report.txt"
    c.mode = 0o644
    c.xattrs = ["user.a": Data("1".utf8)]
    c.parentID = 3
    c.encryptionKey[0] = 1
    #expect(c == original)
    #expect(c.hashValue == original.hashValue)
    #expect(a.name == "renamed")
  }

  @Test func copiesChangedOnOtherThreadsStayApart() async {
    let shared = sample()
    let sizes = await withTaskGroup(of: UInt64.self) { group in
      for i in 0..<8 {
        group.addTask {
          var mine = shared
          for j in 0..<1000 { mine.dataSize = UInt64(i * 1000 + j) }
          return mine.dataSize
        }
      }
      return await group.reduce(into: []) { $0.append($1) }
    }
    #expect(Set(sizes) == Set((0..<8).map { UInt64($0 * 1000 + 999) }))
    #expect(shared.dataSize == 42)
  }

  @Test func codableKeepsItsFieldNames() throws {
    let node = sample()
    let encoder = JSONEncoder()
    encoder.outputFormatting = .sortedKeys
    let json = try JSONSerialization.jsonObject(with: try encoder.encode(node)) as? [String: Any]
    let keys = Set(try #require(json).keys)
    // Optional fields that are nil are left out, as a synthesized encoding does.
    #expect(
      keys == [
        "id", "uuid", "localUserID", "parentID", "name", "kind", "shareList", "encryptionKey",
        "dirSalt", "dirPrefix", "cloudID", "eTagRcrd", "mode", "mtime", "xattrs", "dataSize",
      ])
    #expect(try JSONDecoder().decode(Node.self, from: try encoder.encode(node)) == node)
  }
}
