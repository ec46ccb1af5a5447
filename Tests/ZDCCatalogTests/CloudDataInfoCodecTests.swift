import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

@testable import ZDCCatalog

@Suite struct CloudDataInfoCodecTests {
  /// Whatever the catalog writes, the fast reader gives what `JSONDecoder` gives.
  @Test func fastDecodeMatchesJSONDecoder() throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = .sortedKeys
    var rng = SplitMix64(seed: 7)
    let eTags = [
      "\"d41d8cd98f00b204e9800998ecf8427e\"", "\"abc-12\"", "plain", "", "back\\slash",
      "sl/ash", "tab\tnew\nline", "ünï©ødé ✓", "\"q\"\"",
    ]
    var fast = 0
    for n in 0..<2000 {
      let big = Int.random(in: 0..<4, using: &rng) == 0
      let info = CloudDataInfo(
        metadataSize: big ? UInt64.max - UInt64(n) : UInt64(n),
        thumbnailSize: UInt64.random(in: 0...100_000, using: &rng),
        dataSize: big ? UInt64.random(in: 0...UInt64.max, using: &rng) : UInt64(n * 7),
        eTag: eTags[n % eTags.count] + (n % 3 == 0 ? "" : String(n)),
        lastModified: n % 4 == 0
          ? nil
          : Date(timeIntervalSinceReferenceDate: Double.random(in: -1e9...1e9, using: &rng)))
      let json = String(decoding: try encoder.encode(info), as: UTF8.self)
      let expected = try JSONDecoder().decode(CloudDataInfo.self, from: Data(json.utf8))
      #expect(try CloudDataInfoCodec.decode(json, JSONDecoder()) == expected, "\(json)")
      if let f = CloudDataInfoCodec.fastDecode(json) {
        #expect(f == expected, "\(json)")
        fast += 1
      }
    }
    // Only escapes it leaves to JSONDecoder take the slow path.
    #expect(fast == 2000)
  }

  @Test func unexpectedShapesFallBackOrFail() throws {
    let odd = #"{"dataSize":1,"eTag":"\u0041","metadataSize":2,"thumbnailSize":3}"#
    #expect(CloudDataInfoCodec.fastDecode(odd) == nil)
    #expect(try CloudDataInfoCodec.decode(odd, JSONDecoder()).eTag == "A")
    let spaced = #"{ "dataSize": 1, "eTag": "x", "metadataSize": 2, "thumbnailSize": 3 }"#
    #expect(CloudDataInfoCodec.fastDecode(spaced) == nil)
    #expect(try CloudDataInfoCodec.decode(spaced, JSONDecoder()).dataSize == 1)
    for bad in [
      "", "{", "{}", #"{"dataSize":-1,"eTag":"x","metadataSize":2,"thumbnailSize":3}"#,
      #"{"dataSize":1,"eTag":"x","metadataSize":2}"#,
      #"{"dataSize":1,"eTag":"x","metadataSize":2,"thumbnailSize":3,"extra":1}"#,
      #"{"dataSize":99999999999999999999,"eTag":"x","metadataSize":2,"thumbnailSize":3}"#,
      #"{"dataSize":01,"eTag":"x","metadataSize":2,"thumbnailSize":3}"#,
    ] {
      #expect(CloudDataInfoCodec.fastDecode(bad) == nil, "\(bad)")
    }
    #expect(throws: (any Error).self) { try CloudDataInfoCodec.decode("{", JSONDecoder()) }
  }
}
