import Foundation
import Testing
import ZDCCore

@testable import ZDCCrypto

/// Known-answer vectors frozen in `Tests/Fixtures/v1` (see its README). Run with
/// `ZDC_REGENERATE_FIXTURES=1` to rewrite them; normal runs compare.
@Suite(.serialized) struct FixtureTests {
  func url(_ name: String) -> URL { fixturesDirectory.appendingPathComponent(name) }

  /// Writes `data` when regenerating; otherwise returns the frozen bytes.
  func frozen(_ name: String, _ data: @autoclosure () throws -> Data) throws -> Data {
    if regenerateFixtures {
      try FileManager.default.createDirectory(
        at: fixturesDirectory, withIntermediateDirectories: true)
      let d = try data()
      try d.write(to: url(name))
      return d
    }
    return try Data(contentsOf: url(name))
  }

  // MARK: cloudName

  static let salt = Data((0..<20).map { UInt8($0) })
  static let names: [String] = [
    "hello.txt", "Hello.TXT", "HELLO.TXT", "caf\u{E9}", "cafe\u{301}", "CAF\u{C9}",
    "📁 Photos 🎉", "日本語のファイル名.txt", String(repeating: "a", count: 255), "a/b",
    "a/b/c", ".", "..", ".data", "name.with.dots.", "ß", "SS",
  ]

  struct NameVector: Codable, Equatable {
    var name: String
    var utf8Hex: String
    var cloudName: String
  }
  struct NameVectors: Codable, Equatable {
    var saltHex: String
    var vectors: [NameVector]
    var mustCollide: [[Int]]
  }

  @Test func cloudNameVectors() throws {
    let computed = NameVectors(
      saltHex: Hex.encode(Self.salt),
      vectors: try Self.names.map {
        NameVector(
          name: $0, utf8Hex: Hex.encode(Data($0.utf8)),
          cloudName: try CloudName.compute(name: $0, parentDirSalt: Self.salt))
      },
      mustCollide: [[0, 1, 2], [3, 4, 5]])
    let e = JSONEncoder()
    e.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    let blob = try frozen("cloudname.json", try e.encode(computed))
    let stored = try JSONDecoder().decode(NameVectors.self, from: blob)
    #expect(stored.vectors.count == Self.names.count)
    for v in stored.vectors {
      let name = String(decoding: try #require(Hex.decode(v.utf8Hex)), as: UTF8.self)
      #expect(
        try CloudName.compute(name: name, parentDirSalt: Self.salt) == v.cloudName, "\(v.name)")
    }
    for group in stored.mustCollide {
      #expect(Set(group.map { stored.vectors[$0].cloudName }).count == 1)
    }
    #expect(Set(stored.vectors.map(\.cloudName)).count == stored.vectors.count - 4)
    // NFC and NFD are different bytes but the same cloudName.
    #expect(stored.vectors[3].utf8Hex != stored.vectors[4].utf8Hex)
    #expect(stored.vectors[8].utf8Hex.count == 510)
  }

  // MARK: RCRD

  static let rcrdSeed = Data((1...32).map { UInt8($0) })
  static let rcrdUser = "fixtureuserybndrfg8ejkmcpqxot1uw"

  static func rcrdNode() -> Node {
    var node = sampleNode(owner: rcrdUser, name: "Fixture Ünïcode name.txt")
    node.shareList.set(ShareItem(permissions: [.write]), for: .user("writeronlyuser"))
    return node
  }

  @Test func rcrdVector() throws {
    let kp = try UserKeyPair.fromSeed(Self.rcrdSeed)
    let node = Self.rcrdNode()
    let blob = try frozen(
      "rcrd.json", try Rcrd.encode(node: node, publicKeys: [Self.rcrdUser: kp.boxPublicKey]))
    let d = try Rcrd.decode(blob, userID: Self.rcrdUser, keyPair: kp)
    #expect(d.cloudID == "00112233445566778899aabbccddeeff")
    #expect(d.dirPrefix == "0123456789ABCDEF0123456789ABCDEF")
    #expect(Hex.encode(d.nodeKey) == Hex.encode(Data((0..<32).map { UInt8(0x80 + $0) })))
    #expect(d.meta.name == "Fixture Ünïcode name.txt")
    #expect(d.meta.dirSalt == Data((0..<20).map { UInt8(0x40 + $0) }))
    #expect(d.meta.kind == .file)
    #expect(d.meta.mode == 0o644)
    #expect(d.meta.mtime == FileTime(seconds: 1_700_000_000, nanoseconds: 123_456_789))
    #expect(
      d.meta.xattrs == [
        "user.comment": Data("hello xattr".utf8), "user.bin": Data([0, 1, 2, 255]),
      ])
    #expect(d.meta.symlinkTarget == nil)
    #expect(d.meta.dataSize == 42)
    #expect(d.burnDate == Date(timeIntervalSince1970: 1_900_000_000))
    #expect(d.shareList[.user(Self.rcrdUser)]?.permissions == [.read, .write, .share])
    #expect(d.shareList[.user("writeronlyuser")] == ShareItem(permissions: [.write]))
    #expect(!contains(blob, "Fixture"))
  }

  // MARK: CloudFile

  static let cloudKey = Data((0..<32).map { UInt8(0xA0 &+ $0) })
  static let cloudPrefix = Data((0..<16).map { UInt8(0x10 + $0) })
  static let cloudMetadata = Data(#"{"fixture":"metadata"}"#.utf8)
  static let cloudThumbnail = pattern(300, mul: 7, add: 0)
  static let cloudData = pattern(140_000, mul: 31, add: 7)

  @Test func cloudFileVector() throws {
    var encoded = Data()
    try CloudFileEncoder(key: Self.cloudKey, noncePrefix: Self.cloudPrefix).encode(
      metadata: Self.cloudMetadata, thumbnail: Self.cloudThumbnail, data: .data(Self.cloudData)
    ) { encoded.append($0) }
    let blob = try frozen("cloudfile.bin", encoded)
    #expect(blob == encoded, "encoding differs from the frozen bytes")
    #expect(blob.count == 32 + 64 + 22 + 300 + 140_000 + 3 * 16)
    let (m, t, d) = try decodeAll(key: Self.cloudKey, object: blob)
    #expect(m == Self.cloudMetadata)
    #expect(t == Self.cloudThumbnail)
    #expect(d == Self.cloudData)
  }

  // MARK: CryptoFile

  static let cryptoKey = Data(repeating: 0x5A, count: 32)
  /// The fixture's chunks: 64 KiB, the only size before files recorded their own.
  static let cryptoChunkShift: UInt8 = 16
  static let cryptoChunkSize = 1 << 16
  static func cryptoPlaintext() -> Data {
    var d = Data("CryptoFile fixture v1\n".utf8)
    d.append(Data(count: 2 * cryptoChunkSize + 100 - d.count))
    d.append(Data("tail".utf8))
    return d
  }

  @Test func cryptoFileVector() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let work = dir.appendingPathComponent("c")
    let blob = try frozen(
      "cryptofile.bin",
      try {
        let f = try CryptoFile.create(
          at: work, key: Self.cryptoKey, chunkShift: Self.cryptoChunkShift)
        try f.write(Data("CryptoFile fixture v1\n".utf8), at: 0)
        try f.write(Data("tail".utf8), at: UInt64(2 * Self.cryptoChunkSize + 100))
        try f.close()
        return try Data(contentsOf: work)
      }())
    try blob.write(to: work)
    #expect(blob[9] == Self.cryptoChunkShift)
    let f = try CryptoFile.open(at: work, key: Self.cryptoKey)
    #expect(f.chunkShift == Self.cryptoChunkShift)
    #expect(f.size == UInt64(2 * Self.cryptoChunkSize + 104))
    #expect(try f.read(offset: 0, count: Int(f.size)) == Self.cryptoPlaintext())
    try f.close()
  }

  /// The frozen file (64 KiB chunks, as every file was before chunk sizes varied) stays
  /// writable in its own layout: written, truncated, grown and reopened, it keeps its chunk
  /// size and reads back as a plain model of the same operations.
  @Test func cryptoFileVectorStaysWritable() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let work = dir.appendingPathComponent("c")
    try FileManager.default.copyItem(at: url("cryptofile.bin"), to: work)
    var model = Self.cryptoPlaintext()
    var rng = SplitMix64(seed: 16)
    let f = try CryptoFile.open(at: work, key: Self.cryptoKey)
    let patch = randomBytes(3 * Self.cryptoChunkSize, &rng)
    try f.write(patch, at: 1000)
    model.append(Data(count: 1000 + patch.count - model.count))
    model.replaceSubrange(1000..<(1000 + patch.count), with: patch)
    try f.write(Data("end".utf8), at: 400_000)
    model.append(Data(count: 400_000 - model.count))
    model.append(Data("end".utf8))
    try f.close()
    #expect(
      try Data(contentsOf: work).count
        == Int(CryptoFile.physicalSize(plaintextSize: 400_003, chunkShift: Self.cryptoChunkShift)))
    let g = try CryptoFile.open(at: work, key: Self.cryptoKey)
    #expect(g.chunkShift == Self.cryptoChunkShift)
    #expect(try g.read(offset: 0, count: model.count + 1) == model)
    try g.truncate(to: 70_000)
    model = model.prefix(70_000)
    try g.truncate(to: 140_000)
    model.append(Data(count: 70_000))
    try g.close()
    #expect(try CryptoFile.layout(ofFileAt: work) == (Self.cryptoChunkShift, 140_000))
    let h = try CryptoFile.open(at: work, key: Self.cryptoKey)
    #expect(h.chunkShift == Self.cryptoChunkShift)
    #expect(try h.read(offset: 0, count: model.count + 1) == model)
    try h.close()
  }
}
