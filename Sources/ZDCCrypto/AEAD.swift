import CSodium
public import Foundation

/// XChaCha20-Poly1305-IETF authenticated encryption with a caller-chosen nonce and associated
/// data (key 32 bytes, nonce 24 bytes, tag 16 bytes).
public enum AEAD {
  /// Key size in bytes.
  public static let keySize = 32
  /// Nonce size in bytes.
  public static let nonceSize = 24
  /// Authentication tag size in bytes.
  public static let tagSize = 16

  // A valid address for zero-length buffers; never written (libsodium writes nothing there).
  nonisolated(unsafe) private static let empty: UnsafeMutablePointer<UInt8> = {
    let p = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)
    p.initialize(to: 0)
    return p
  }()

  /// An output buffer's address; a valid one (never written) when the buffer is empty.
  @inline(__always)
  static func mutableBytes(_ b: UnsafeMutableRawBufferPointer) -> UnsafeMutablePointer<UInt8> {
    b.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? empty
  }

  @inline(__always)
  static func bytes(_ b: UnsafeRawBufferPointer) -> UnsafePointer<UInt8> {
    guard let base = b.baseAddress else { return UnsafePointer(empty) }
    return base.assumingMemoryBound(to: UInt8.self)
  }

  /// Encrypts `plaintext` into the first `plaintext.count + tagSize` bytes of `output` and
  /// returns that count. `output` may start at the same address as `plaintext` (in place).
  @discardableResult
  public static func seal(
    _ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
    nonce: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer,
    key: UnsafeRawBufferPointer
  ) throws -> Int {
    Sodium.ensure()
    guard key.count == keySize else { throw CryptoError.invalidKey("AEAD key must be 32 bytes") }
    guard nonce.count == nonceSize else { throw CryptoError.failed("AEAD nonce must be 24 bytes") }
    guard let out = output.baseAddress, output.count >= plaintext.count + tagSize else {
      throw CryptoError.failed("AEAD output buffer too small")
    }
    var written: UInt64 = 0
    let rc = crypto_aead_xchacha20poly1305_ietf_encrypt(
      out.assumingMemoryBound(to: UInt8.self), &written, bytes(plaintext),
      UInt64(plaintext.count), bytes(associatedData), UInt64(associatedData.count), nil,
      bytes(nonce), bytes(key))
    guard rc == 0 else { throw CryptoError.failed("crypto_aead_xchacha20poly1305_ietf_encrypt") }
    return Int(written)
  }

  /// Decrypts and authenticates `ciphertext` (ciphertext ‖ tag) into the first
  /// `ciphertext.count - tagSize` bytes of `output` and returns that count; throws
  /// `CryptoError.authenticationFailed` if the key, nonce, data or tag do not match.
  @discardableResult
  public static func open(
    _ ciphertext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
    nonce: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer,
    key: UnsafeRawBufferPointer
  ) throws -> Int {
    Sodium.ensure()
    guard key.count == keySize else { throw CryptoError.invalidKey("AEAD key must be 32 bytes") }
    guard nonce.count == nonceSize else { throw CryptoError.failed("AEAD nonce must be 24 bytes") }
    guard ciphertext.count >= tagSize else {
      throw CryptoError.malformed("ciphertext shorter than its tag")
    }
    guard output.count >= ciphertext.count - tagSize else {
      throw CryptoError.failed("AEAD output buffer too small")
    }
    var written: UInt64 = 0
    let rc = crypto_aead_xchacha20poly1305_ietf_decrypt(
      mutableBytes(output), &written, nil, bytes(ciphertext), UInt64(ciphertext.count),
      bytes(associatedData),
      UInt64(associatedData.count), bytes(nonce), bytes(key))
    guard rc == 0 else { throw CryptoError.authenticationFailed("AEAD tag mismatch") }
    return Int(written)
  }

  /// Encrypts `plaintext`; returns ciphertext ‖ tag.
  public static func seal(
    _ plaintext: Data, nonce: Data, associatedData: Data = Data(), key: Data
  ) throws -> Data {
    var out = Data(count: plaintext.count + tagSize)
    _ = try out.withUnsafeMutableBytes { o in
      try plaintext.withUnsafeBytes { p in
        try nonce.withUnsafeBytes { n in
          try associatedData.withUnsafeBytes { a in
            try key.withUnsafeBytes { k in
              try seal(p, into: o, nonce: n, associatedData: a, key: k)
            }
          }
        }
      }
    }
    return out
  }

  /// Decrypts and authenticates ciphertext ‖ tag; returns the plaintext.
  public static func open(
    _ ciphertext: Data, nonce: Data, associatedData: Data = Data(), key: Data
  ) throws -> Data {
    guard ciphertext.count >= tagSize else {
      throw CryptoError.malformed("ciphertext shorter than its tag")
    }
    var out = Data(count: ciphertext.count - tagSize)
    _ = try out.withUnsafeMutableBytes { o in
      try ciphertext.withUnsafeBytes { c in
        try nonce.withUnsafeBytes { n in
          try associatedData.withUnsafeBytes { a in
            try key.withUnsafeBytes { k in
              try open(c, into: o, nonce: n, associatedData: a, key: k)
            }
          }
        }
      }
    }
    return out
  }
}

/// ``AEAD`` (XChaCha20-Poly1305-IETF) under one key for nonces that share their first 16 bytes:
/// the same output, with the key's HChaCha20 subkey for that prefix derived once instead of
/// on every call.
public struct AEADPrefixedNonces: Sendable {
  /// The nonces' shared first bytes.
  public static let prefixSize = 16
  /// The bytes that follow the prefix in each nonce.
  public static let suffixSize = AEAD.nonceSize - prefixSize
  private let subkey: [UInt8]

  /// Prepares sealing under `key` (``AEAD/keySize`` bytes) with nonces starting with `prefix`
  /// (``prefixSize`` bytes).
  public init(key: Data, prefix: Data) throws {
    Sodium.ensure()
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("AEAD key must be 32 bytes")
    }
    guard prefix.count == Self.prefixSize else {
      throw CryptoError.failed("a nonce prefix has 16 bytes")
    }
    var subkey = [UInt8](repeating: 0, count: AEAD.keySize)
    let rc = key.withUnsafeBytes { k in
      prefix.withUnsafeBytes { p in
        crypto_core_hchacha20(&subkey, AEAD.bytes(p), AEAD.bytes(k), nil)
      }
    }
    guard rc == 0 else { throw CryptoError.failed("crypto_core_hchacha20") }
    self.subkey = subkey
  }

  /// ``AEAD/seal(_:into:nonce:associatedData:key:)`` with the nonce `prefix ‖ suffix`
  /// (``suffixSize`` bytes).
  @discardableResult
  public func seal(
    _ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
    nonceSuffix suffix: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer
  ) throws -> Int {
    guard suffix.count == Self.suffixSize else {
      throw CryptoError.failed("a nonce suffix has 8 bytes")
    }
    guard let out = output.baseAddress, output.count >= plaintext.count + AEAD.tagSize else {
      throw CryptoError.failed("AEAD output buffer too small")
    }
    // XChaCha20-Poly1305-IETF is ChaCha20-Poly1305-IETF under the subkey, with the nonce's
    // last 8 bytes after 4 zero bytes.
    var written: UInt64 = 0
    let rc = withUnsafeTemporaryAllocation(byteCount: 12, alignment: 8) { n in
      n.initializeMemory(as: UInt8.self, repeating: 0)
      UnsafeMutableRawBufferPointer(rebasing: n[4...]).copyMemory(from: suffix)
      return crypto_aead_chacha20poly1305_ietf_encrypt(
        out.assumingMemoryBound(to: UInt8.self), &written, AEAD.bytes(plaintext),
        UInt64(plaintext.count), AEAD.bytes(associatedData), UInt64(associatedData.count), nil,
        AEAD.bytes(UnsafeRawBufferPointer(n)), subkey)
    }
    guard rc == 0 else { throw CryptoError.failed("crypto_aead_chacha20poly1305_ietf_encrypt") }
    return Int(written)
  }
}
