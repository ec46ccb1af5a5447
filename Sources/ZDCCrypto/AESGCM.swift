import CAESGCM
import CSodium
import Foundation

/// AES-256-GCM authenticated encryption under one key whose expansion is computed once (key 32
/// bytes, nonce 12 bytes, tag 16 bytes), for the local cache. New files use it where
/// ``isHardwareAccelerated`` (the processor has AES and carry-less multiplication instructions); files
/// that already use it open on any processor.
///
/// A GCM nonce must never repeat under one key: callers use a key of their own (see
/// ``derive(from:context:id:)``) and random nonces, for few enough messages that a collision is
/// negligible.
final class AESGCMKey: @unchecked Sendable {
  // @unchecked: `gcm` is set once, in `init`; the C side serves concurrent calls itself.

  /// Nonce size in bytes.
  static let nonceSize = 12
  /// Authentication tag size in bytes.
  static let tagSize = 16

  /// True when this processor has AES-NI and PCLMUL, so that AES-256-GCM outruns
  /// XChaCha20-Poly1305 (libsodium's probe of the processor).
  static let isHardwareAccelerated: Bool = {
    Sodium.ensure()
    return crypto_aead_aes256gcm_is_available() == 1
  }()

  private let gcm: OpaquePointer

  /// Expands `key` (32 bytes).
  init(_ key: UnsafeRawBufferPointer) throws {
    guard key.count == AEAD.keySize, let base = key.baseAddress else {
      throw CryptoError.invalidKey("AES-256-GCM key must be 32 bytes")
    }
    guard let gcm = zdc_gcm_new(base.assumingMemoryBound(to: UInt8.self)) else {
      throw CryptoError.failed("libcrypto could not set up an AES-256-GCM key")
    }
    self.gcm = gcm
  }

  deinit { zdc_gcm_free(gcm) }

  /// A 32-byte key for one use of `key`: keyed BLAKE2b of `context` ‖ `id`.
  static func derive(from key: Data, context: String, id: [UInt8]) throws -> Data {
    try KeyDerivation.blake2b256(key: [UInt8](key), message: Array(context.utf8) + id)
  }

  /// Encrypts `plaintext` into the first `plaintext.count + tagSize` bytes of `output` (which
  /// may start at `plaintext`'s address) and returns that count.
  @discardableResult
  func seal(
    _ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
    nonce: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer
  ) throws -> Int {
    guard nonce.count == Self.nonceSize else {
      throw CryptoError.failed("AES-256-GCM nonce must be 12 bytes")
    }
    guard let out = output.baseAddress, output.count >= plaintext.count + Self.tagSize else {
      throw CryptoError.failed("AES-256-GCM output buffer too small")
    }
    let rc = zdc_gcm_seal(
      gcm, out.assumingMemoryBound(to: UInt8.self), AEAD.bytes(plaintext), plaintext.count,
      AEAD.bytes(associatedData), associatedData.count, AEAD.bytes(nonce))
    guard rc == 0 else { throw CryptoError.failed("AES-256-GCM encryption failed") }
    return plaintext.count + Self.tagSize
  }

  /// Decrypts and authenticates ciphertext ‖ tag into `output` and returns the plaintext
  /// count; throws `CryptoError.authenticationFailed` if anything does not match.
  @discardableResult
  func open(
    _ ciphertext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer,
    nonce: UnsafeRawBufferPointer, associatedData: UnsafeRawBufferPointer
  ) throws -> Int {
    guard nonce.count == Self.nonceSize else {
      throw CryptoError.failed("AES-256-GCM nonce must be 12 bytes")
    }
    guard ciphertext.count >= Self.tagSize else {
      throw CryptoError.malformed("ciphertext shorter than its tag")
    }
    guard output.count >= ciphertext.count - Self.tagSize else {
      throw CryptoError.failed("AES-256-GCM output buffer too small")
    }
    let rc = zdc_gcm_open(
      gcm, AEAD.mutableBytes(output), AEAD.bytes(ciphertext), ciphertext.count,
      AEAD.bytes(associatedData), associatedData.count, AEAD.bytes(nonce))
    if rc == -1 { throw CryptoError.authenticationFailed("AES-256-GCM tag mismatch") }
    guard rc == 0 else { throw CryptoError.failed("AES-256-GCM decryption failed") }
    return ciphertext.count - Self.tagSize
  }
}
