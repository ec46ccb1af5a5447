import CSodium
import Foundation

/// AES-256-GCM authenticated encryption under one key whose expansion is computed once (key 32
/// bytes, nonce 12 bytes, tag 16 bytes), for the local cache on processors with AES-NI and
/// carry-less multiplication. Only ``isAvailable`` processors may use it.
///
/// A GCM nonce must never repeat under one key: callers use a key of their own (see
/// ``derive(from:context:id:)``) and random nonces, for few enough messages that a collision is
/// negligible.
final class AESGCMKey: @unchecked Sendable {
  // @unchecked: `state` is written once, in `init`, and only read afterwards.

  /// Nonce size in bytes.
  static let nonceSize = 12
  /// Authentication tag size in bytes.
  static let tagSize = 16

  /// True when this processor runs libsodium's AES-256-GCM (AES-NI and PCLMUL).
  static let isAvailable: Bool = {
    Sodium.ensure()
    return crypto_aead_aes256gcm_is_available() == 1
  }()

  private let state: UnsafeMutableRawPointer
  private let stateSize = crypto_aead_aes256gcm_statebytes()

  /// Expands `key` (32 bytes). Fails where ``isAvailable`` is false.
  init(_ key: UnsafeRawBufferPointer) throws {
    guard Self.isAvailable else { throw CryptoError.failed("AES-256-GCM is not available") }
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("AES-256-GCM key must be 32 bytes")
    }
    state = .allocate(byteCount: stateSize, alignment: 16)
    let rc = crypto_aead_aes256gcm_beforenm(
      state.assumingMemoryBound(to: crypto_aead_aes256gcm_state.self), AEAD.bytes(key))
    guard rc == 0 else {
      sodium_memzero(state, stateSize)
      state.deallocate()
      throw CryptoError.failed("crypto_aead_aes256gcm_beforenm")
    }
  }

  deinit {
    sodium_memzero(state, stateSize)
    state.deallocate()
  }

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
    var written: UInt64 = 0
    let rc = crypto_aead_aes256gcm_encrypt_afternm(
      out.assumingMemoryBound(to: UInt8.self), &written, AEAD.bytes(plaintext),
      UInt64(plaintext.count), AEAD.bytes(associatedData), UInt64(associatedData.count), nil,
      AEAD.bytes(nonce), state.assumingMemoryBound(to: crypto_aead_aes256gcm_state.self))
    guard rc == 0 else { throw CryptoError.failed("crypto_aead_aes256gcm_encrypt_afternm") }
    return Int(written)
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
    var written: UInt64 = 0
    let rc = crypto_aead_aes256gcm_decrypt_afternm(
      AEAD.mutableBytes(output), &written, nil, AEAD.bytes(ciphertext), UInt64(ciphertext.count),
      AEAD.bytes(associatedData), UInt64(associatedData.count), AEAD.bytes(nonce),
      state.assumingMemoryBound(to: crypto_aead_aes256gcm_state.self))
    guard rc == 0 else { throw CryptoError.authenticationFailed("AES-256-GCM tag mismatch") }
    return Int(written)
  }
}
