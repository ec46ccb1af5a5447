import Foundation
import Testing
import ZDCCore

@testable import ZDCCrypto

@Suite struct AEADTests {
  @Test func roundTripWithAssociatedData() throws {
    let key = SecureRandom.bytes(32)
    let nonce = SecureRandom.bytes(24)
    for size in [0, 1, 100, 65536] {
      let plain = SecureRandom.bytes(size)
      let sealed = try AEAD.seal(plain, nonce: nonce, associatedData: Data("ad".utf8), key: key)
      #expect(sealed.count == size + 16)
      #expect(
        try AEAD.open(sealed, nonce: nonce, associatedData: Data("ad".utf8), key: key) == plain)
      #expect(throws: CryptoError.self) {
        try AEAD.open(sealed, nonce: nonce, associatedData: Data("AD".utf8), key: key)
      }
      var flipped = sealed
      flipped[flipped.count - 1] ^= 1
      #expect(throws: CryptoError.self) {
        try AEAD.open(flipped, nonce: nonce, associatedData: Data("ad".utf8), key: key)
      }
    }
  }

  /// A prefixed-nonce sealer writes what ``AEAD`` writes for the whole nonce, for one prefix
  /// and many suffixes (it derives the prefix's subkey once).
  @Test func sealingWithANoncePrefixMatchesTheWholeNonce() throws {
    let key = SecureRandom.bytes(32)
    let prefix = SecureRandom.bytes(16)
    let sealer = try AEADPrefixedNonces(key: key, prefix: prefix)
    for size in [0, 1, 63, 64, 100, 5000] {
      let plain = SecureRandom.bytes(size)
      let suffix = SecureRandom.bytes(8)
      let ad = SecureRandom.bytes(size % 7)
      let expected = try AEAD.seal(plain, nonce: prefix + suffix, associatedData: ad, key: key)
      var out = Data(count: size + 16)
      let n = try out.withUnsafeMutableBytes { o in
        try plain.withUnsafeBytes { p in
          try suffix.withUnsafeBytes { s in
            try ad.withUnsafeBytes { a in
              try sealer.seal(p, into: o, nonceSuffix: s, associatedData: a)
            }
          }
        }
      }
      #expect(n == size + 16)
      #expect(out == expected)
    }
    #expect(throws: CryptoError.self) { try AEADPrefixedNonces(key: key, prefix: Data(count: 24)) }
  }

  @Test func rejectsBadSizes() {
    #expect(throws: CryptoError.self) {
      try AEAD.seal(Data(), nonce: Data(count: 24), key: Data(count: 31))
    }
    #expect(throws: CryptoError.self) {
      try AEAD.seal(Data(), nonce: Data(count: 12), key: Data(count: 32))
    }
    #expect(throws: CryptoError.self) {
      try AEAD.open(Data(count: 15), nonce: Data(count: 24), key: Data(count: 32))
    }
  }
}

@Suite struct ZBase32Tests {
  @Test func knownVectors() {
    // Vectors from the zbase32 specification (bit-length multiples of 8).
    #expect(ZBase32.encode(Data()) == "")
    #expect(ZBase32.encode(Data([0x00])) == "yy")
    #expect(ZBase32.encode(Data([0xF0, 0xBF, 0xC7])) == "6n9hq")
    #expect(ZBase32.encode(Data([0xD4, 0x7A, 0x04])) == "4t7ye")
    #expect(ZBase32.encode(Data(repeating: 0, count: 20)) == String(repeating: "y", count: 32))
    #expect(ZBase32.encode(Data(repeating: 0xFF, count: 5)) == "99999999")
  }

  @Test func roundTrips() {
    var rng = SplitMix64(seed: 7)
    for n in 0..<64 {
      let d = randomBytes(n, &rng)
      let s = ZBase32.encode(d)
      #expect(s.utf8.count == (n * 8 + 4) / 5)
      #expect(ZBase32.decode(s) == d)
    }
  }

  @Test func rejectsBadInput() {
    #expect(ZBase32.decode("l") == nil)  // not in the alphabet
    #expect(ZBase32.decode("yY") == nil)
    #expect(ZBase32.decode("yb") == nil)  // non-zero padding bits
  }
}

@Suite struct CloudNameTests {
  let salt = Data((0..<20).map { UInt8($0) })

  @Test func collisionsAndDistinctions() throws {
    func name(_ s: String) throws -> String { try CloudName.compute(name: s, parentDirSalt: salt) }
    #expect(try name("hello.txt") == name("HELLO.TXT"))
    #expect(try name("caf\u{E9}") == name("cafe\u{301}"))
    #expect(try name("CAF\u{C9}") == name("cafe\u{301}"))
    #expect(try name("hello.txt") != name("hello.txt "))
    #expect(try name("a/b") != name("a_b"))
    let n = try name("日本語")
    #expect(n.count == 32)
    #expect(ZBase32.decode(n)?.count == 20)
    let otherSalt = Data(repeating: 9, count: 20)
    #expect(try CloudName.compute(name: "x", parentDirSalt: otherSalt) != name("x"))
  }

  @Test func rejectsBadSalt() {
    #expect(throws: CryptoError.self) {
      try CloudName.compute(name: "x", parentDirSalt: Data(count: 15))
    }
    #expect(throws: CryptoError.self) {
      try CloudName.compute(name: "x", parentDirSalt: Data(count: 65))
    }
  }
}

@Suite struct SecureRandomTests {
  @Test func uuidsAreVersion4AndUnique() throws {
    var seen = Set<String>()
    for _ in 0..<2000 {
      let u = SecureRandom.uuid()
      let parts = u.split(separator: "-").map(String.init)
      #expect(parts.map(\.count) == [8, 4, 4, 4, 12], "\(u)")
      #expect(u == u.lowercased())
      #expect(parts[2].first == "4", "version nibble of \(u)")
      #expect("89ab".contains(parts[3].first!), "variant of \(u)")
      #expect(UUID(uuidString: u) != nil)
      seen.insert(u)
    }
    #expect(seen.count == 2000)
  }

  /// cloudIDs are 32 lower-case hex digits, dirPrefixes 32 upper-case ones (the store's key
  /// layout), all different.
  @Test func cloudIDsAndDirPrefixesAre128BitsOfHex() throws {
    var seen = Set<String>()
    for _ in 0..<1000 {
      let id = SecureRandom.cloudID()
      let prefix = SecureRandom.dirPrefix()
      #expect(id.utf8.count == 32 && id.allSatisfy { "0123456789abcdef".contains($0) }, "\(id)")
      #expect(
        prefix.utf8.count == 32 && prefix.allSatisfy { "0123456789ABCDEF".contains($0) },
        "\(prefix)")
      #expect(Hex.decode(id)?.count == 16)
      seen.insert(id)
      seen.insert(prefix.lowercased())
    }
    #expect(seen.count == 2000)
  }

  // The bytes themselves: `RandomBytesTests` (ZDCCore), where the pool lives.
}

@Suite struct HexTests {
  /// Every byte value, in both cases, against Foundation's formatting, and back.
  @Test func everyByteEncodesAsTwoDigitsAndDecodesBack() throws {
    let all = Data((0...255).map { UInt8($0) })
    let lower = Hex.encode(all)
    #expect(lower == all.map { String(format: "%02x", $0) }.joined())
    #expect(Hex.encode(all, uppercase: true) == all.map { String(format: "%02X", $0) }.joined())
    #expect(Hex.decode(lower) == all)
    #expect(Hex.decode(Hex.encode(all, uppercase: true)) == all)
    #expect(Hex.encode(Data()) == "")
    // In place, the same digits.
    all.withUnsafeBytes { raw in
      #expect(Hex.encode(raw) == lower)
      #expect(Hex.encode(raw, uppercase: true) == lower.uppercased())
    }
  }
}

@Suite struct KeyedDigestTests {
  /// The first keyed vector of the BLAKE2 reference KAT (`blake2b-kat.txt`): empty message,
  /// key 00…3f, 64-byte digest.
  @Test func referenceVector() throws {
    let digester = try KeyedDigest(key: Data((0..<64).map { UInt8($0) }), length: 64)
    #expect(
      Hex.encode(digester.digest(""))
        == "10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786"
        + "b5e996e8f0f4eb981fc214b005f42d2ff4233499391653df7aefcbc13fc51568")
  }

  /// The key absorbed once serves every digest: the same as a one-shot keyed hash (a cloudName
  /// is one) each time, in any order.
  @Test func reusesTheKeyedStateWithoutCarryingAnythingOver() throws {
    let salt = SecureRandom.dirSalt()
    let digester = try KeyedDigest(key: salt, length: 20)
    for name in ["a", "Report.pdf", String(repeating: "x", count: 300), "a"] {
      #expect(
        ZBase32.encode(digester.digest(NameKey(name).value))
          == (try CloudName.compute(name: name, parentDirSalt: salt)))
    }
    #expect(digester.digest("a") != digester.digest("b"))
    #expect(try KeyedDigest(key: SecureRandom.bytes(32)).digest("a") != digester.digest("a"))
    #expect(throws: CryptoError.self) { try KeyedDigest(key: Data(count: 8)) }
  }
}
