import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

@testable import ZDCCatalog

@Suite struct PushPayloadJSONTests {
  /// The catalog's payload encoder writes exactly what `JSONEncoder` (sorted keys) writes.
  @Test func matchesJSONEncoder() throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = .sortedKeys
    var rng = SplitMix64(seed: 11)
    let strings = [
      "", "abc", "u1/t/00000000000000000000000000000000/x.rcrd", "\"q\"", "back\\slash",
      "tab\tnew\nline\r", "\u{01}\u{1F}\u{7F}", "\u{08}\u{0C}", "ünï©ødé ✓ 日本", "a/b/c",
    ]
    func s() -> String { strings[Int.random(in: 0..<strings.count, using: &rng)] }
    func ref() -> CloudObjectRef {
      CloudObjectRef(
        nodeID: Int64.random(in: -5...Int64.max, using: &rng), cloudID: s(), dirPrefix: s(),
        cloudName: s(), rcrdKey: s(), dataKey: s(),
        eTagRcrd: Bool.random(using: &rng) ? s() : nil,
        eTagData: Bool.random(using: &rng) ? s() : nil)
    }
    func refs() -> [CloudObjectRef]? {
      Bool.random(using: &rng) ? (0..<Int.random(in: 0..<4, using: &rng)).map { _ in ref() } : nil
    }
    for _ in 0..<2000 {
      let p = PushPayload(
        origin: Bool.random(using: &rng) ? ref() : nil, objects: refs(),
        dirPrefixes: Bool.random(using: &rng)
          ? (0..<Int.random(in: 0..<4, using: &rng)).map { _ in s() } : nil,
        written: refs())
      let expected = String(decoding: try encoder.encode(p), as: UTF8.self)
      let fast = PushPayloadJSON.encode(p)
      #expect(fast == expected)
      #expect(try JSONDecoder().decode(PushPayload.self, from: Data(fast.utf8)) == p)
    }
    #expect(PushPayloadJSON.encode(PushPayload()) == "{}")
  }
}
