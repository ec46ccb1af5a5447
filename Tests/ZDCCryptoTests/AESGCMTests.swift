import CSodium
import Foundation
import Synchronization
import Testing

@testable import ZDCCrypto

/// AES-256-GCM with an expanded key (OpenSSL's libcrypto).
@Suite struct AESGCMTests {
  func seal(_ key: AESGCMKey, _ plain: [UInt8], nonce: [UInt8], ad: [UInt8]) throws -> [UInt8] {
    var out = [UInt8](repeating: 0, count: plain.count + AESGCMKey.tagSize)
    _ = try out.withUnsafeMutableBytes { o in
      try plain.withUnsafeBytes { p in
        try nonce.withUnsafeBytes { n in
          try ad.withUnsafeBytes { a in try key.seal(p, into: o, nonce: n, associatedData: a) }
        }
      }
    }
    return out
  }

  func open(_ key: AESGCMKey, _ sealed: [UInt8], nonce: [UInt8], ad: [UInt8]) throws -> [UInt8] {
    var out = [UInt8](repeating: 0, count: sealed.count - AESGCMKey.tagSize)
    _ = try out.withUnsafeMutableBytes { o in
      try sealed.withUnsafeBytes { c in
        try nonce.withUnsafeBytes { n in
          try ad.withUnsafeBytes { a in try key.open(c, into: o, nonce: n, associatedData: a) }
        }
      }
    }
    return out
  }

  func key(_ bytes: Data) throws -> AESGCMKey { try bytes.withUnsafeBytes { try AESGCMKey($0) } }

  @Test func roundTripsAndDetectsTampering() throws {
    let k = try key(SecureRandom.bytes(32))
    let nonce = [UInt8](SecureRandom.bytes(12))
    let plain = [UInt8]((0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
    let sealed = try seal(k, plain, nonce: nonce, ad: [1, 2, 3])
    #expect(sealed.count == plain.count + 16)
    #expect(Array(sealed.prefix(plain.count)) != plain)
    #expect(try open(k, sealed, nonce: nonce, ad: [1, 2, 3]) == plain)
    var flipped = sealed
    flipped[500] ^= 1
    #expect(throws: CryptoError.self) { try open(k, flipped, nonce: nonce, ad: [1, 2, 3]) }
    #expect(throws: CryptoError.self) { try open(k, sealed, nonce: nonce, ad: [1, 2, 4]) }
    var otherNonce = nonce
    otherNonce[0] ^= 1
    #expect(throws: CryptoError.self) { try open(k, sealed, nonce: otherNonce, ad: [1, 2, 3]) }
    let other = try key(SecureRandom.bytes(32))
    #expect(throws: CryptoError.self) { try open(other, sealed, nonce: nonce, ad: [1, 2, 3]) }
    // Empty plaintext: the tag alone.
    let empty = try seal(k, [], nonce: nonce, ad: [])
    #expect(empty.count == 16)
    #expect(try open(k, empty, nonce: nonce, ad: []) == [])
  }

  /// The GCM specification's test case 16 (AES-256, 96-bit IV, 60-byte plaintext, 20-byte AAD).
  @Test func knownAnswer() throws {
    func hex(_ s: String) -> [UInt8] {
      var out: [UInt8] = []
      var i = s.startIndex
      while i < s.endIndex {
        let j = s.index(i, offsetBy: 2)
        out.append(UInt8(s[i..<j], radix: 16)!)
        i = j
      }
      return out
    }
    let k = try key(
      Data(hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")))
    let plain = hex(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
        + "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39")
    let ad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
    let iv = hex("cafebabefacedbaddecaf888")
    let expected = hex(
      "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
        + "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
        + "76fc6ece0f4e1768cddf8853bb2d551b")
    #expect(try seal(k, plain, nonce: iv, ad: ad) == expected)
    #expect(try open(k, expected, nonce: iv, ad: ad) == plain)
  }

  @Test func derivedKeysDependOnKeyContextAndID() throws {
    let master = SecureRandom.bytes(32)
    let a = try AESGCMKey.derive(from: master, context: "c", id: [1, 2])
    #expect(a.count == 32)
    #expect(try AESGCMKey.derive(from: master, context: "c", id: [1, 2]) == a)
    #expect(try AESGCMKey.derive(from: master, context: "c", id: [1, 3]) != a)
    #expect(try AESGCMKey.derive(from: master, context: "d", id: [1, 2]) != a)
    #expect(try AESGCMKey.derive(from: SecureRandom.bytes(32), context: "c", id: [1, 2]) != a)
  }

  /// The same bytes as libsodium's AES-256-GCM both ways, which wrote the AES files of
  /// earlier versions (on processors where libsodium has it).
  @Test(.enabled(if: AESGCMKey.isHardwareAccelerated, "libsodium has no AES-256-GCM here"))
  func agreesWithLibsodium() throws {
    #expect(sodium_init() >= 0)
    var rng = SystemRandomNumberGenerator()
    // One key for every message: its contexts are reused from one message to the next.
    let keyBytes = SecureRandom.bytes(32)
    let k = try key(keyBytes)
    for size in [0, 1, 15, 16, 17, 4096, 65_536 + 17, 3, 4096] {
      for adSize in [0, 12, 40] {
        let plain = (0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let ad = (0..<adSize).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let nonce = [UInt8](SecureRandom.bytes(12))
        var theirs = [UInt8](repeating: 0, count: size + 16)
        var written: UInt64 = 0
        let rc = keyBytes.withUnsafeBytes { kb in
          crypto_aead_aes256gcm_encrypt(
            &theirs, &written, plain, UInt64(size), ad, UInt64(adSize), nil, nonce,
            kb.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        #expect(rc == 0 && written == UInt64(size + 16))
        #expect(try seal(k, plain, nonce: nonce, ad: ad) == theirs, "size \(size) ad \(adSize)")
        #expect(try open(k, theirs, nonce: nonce, ad: ad) == plain, "size \(size) ad \(adSize)")
      }
    }
  }

  /// In place both ways; a failed open leaves zeros, not unauthenticated plaintext.
  @Test func inPlaceAndNothingLeftOnFailure() throws {
    let k = try key(SecureRandom.bytes(32))
    let nonce = [UInt8](SecureRandom.bytes(12))
    let ad: [UInt8] = [9]
    let plain = [UInt8]((0..<5000).map { UInt8(truncatingIfNeeded: $0 &* 13) })
    let expected = try seal(k, plain, nonce: nonce, ad: ad)
    var buffer = plain + [UInt8](repeating: 0, count: 16)
    try nonce.withUnsafeBytes { n in
      try ad.withUnsafeBytes { a in
        try buffer.withUnsafeMutableBytes { b in
          let sealed = try k.seal(
            UnsafeRawBufferPointer(rebasing: b[0..<plain.count]), into: b, nonce: n,
            associatedData: a)
          #expect(sealed == plain.count + 16)
        }
        #expect(buffer == expected)
        try buffer.withUnsafeMutableBytes { b in
          let opened = try k.open(UnsafeRawBufferPointer(b), into: b, nonce: n, associatedData: a)
          #expect(opened == plain.count)
        }
        #expect(Array(buffer.prefix(plain.count)) == plain)
        var tampered = expected
        tampered[tampered.count - 1] ^= 0x80
        var out = [UInt8](repeating: 0xAA, count: plain.count)
        #expect(throws: CryptoError.self) {
          try out.withUnsafeMutableBytes { o in
            try tampered.withUnsafeBytes { c in try k.open(c, into: o, nonce: n, associatedData: a)
            }
          }
        }
        #expect(out.allSatisfy { $0 == 0 })
      }
    }
  }

  /// Many threads at once on one key (more than the contexts it keeps ready): every message
  /// round-trips, none is mixed up with another thread's.
  @Test func manyThreadsShareOneKey() throws {
    let k = try key(SecureRandom.bytes(32))
    let failures = Atomic<Int>(0)
    DispatchQueue.concurrentPerform(iterations: 24) { t in
      for i in 0..<300 {
        let plain = [UInt8](repeating: UInt8(truncatingIfNeeded: t &* 31 &+ i), count: 100 + i)
        var nonce = [UInt8](repeating: 0, count: 12)
        nonce[0] = UInt8(t)
        nonce[1] = UInt8(truncatingIfNeeded: i)
        nonce[2] = UInt8(truncatingIfNeeded: i >> 8)
        do {
          let sealed = try seal(k, plain, nonce: nonce, ad: [UInt8(t)])
          if try open(k, sealed, nonce: nonce, ad: [UInt8(t)]) != plain {
            failures.add(1, ordering: .relaxed)
          }
        } catch {
          failures.add(1, ordering: .relaxed)
        }
      }
    }
    #expect(failures.load(ordering: .relaxed) == 0)
  }

  @Test func rejectsBadSizes() throws {
    #expect(throws: CryptoError.self) { try key(SecureRandom.bytes(16)) }
    let k = try key(SecureRandom.bytes(32))
    #expect(throws: CryptoError.self) {
      try seal(k, [1], nonce: [UInt8](repeating: 0, count: 24), ad: [])
    }
  }
}
