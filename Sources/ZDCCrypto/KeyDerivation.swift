import CSodium
public import Foundation

/// Purpose-bound symmetric keys derived from a user's secret, identical on every device of the
/// user (they hold the same private keys) and useless for anything but their purpose.
public enum KeyDerivation {
  /// The purposes keys are derived for.
  public enum Purpose: String, Sendable, CaseIterable {
    /// Encrypts change-log entries in the store.
    case changeLog = "changelog"
    /// Encrypts the local disk cache and staging files (CryptoFile).
    case localCache = "cache"
    /// Seals the catalog's sensitive fields (names, symlink targets, node keys, directory salts,
    /// extended attributes, data tags, redo journal records) and keys its name index.
    case catalog = "catalog"
  }

  /// `BLAKE2b-256(key: secret, message: "zdc.subkey.v1|" + purpose)`: a 32-byte key.
  public static func key(for purpose: Purpose, secret: Data) throws -> Data {
    Sodium.ensure()
    guard secret.count >= Int(crypto_generichash_KEYBYTES_MIN),
      secret.count <= Int(crypto_generichash_KEYBYTES_MAX)
    else { throw CryptoError.invalidKey("secret must be 16...64 bytes") }
    return try blake2b256(
      key: [UInt8](secret), message: Array("zdc.subkey.v1|\(purpose.rawValue)".utf8))
  }

  /// `BLAKE2b-256(key: key, message: message)` (a key of 16 to 64 bytes).
  static func blake2b256(key: [UInt8], message: [UInt8]) throws -> Data {
    Sodium.ensure()
    var out = [UInt8](repeating: 0, count: 32)
    guard crypto_generichash(&out, 32, message, UInt64(message.count), key, key.count) == 0 else {
      throw CryptoError.failed("crypto_generichash")
    }
    return Data(out)
  }
}

/// `BLAKE2b(key: key, message: …)` of a fixed length (16 to 64 bytes): a keyed digest, such as
/// an index key that reveals nothing of its message to whoever lacks the key. The key is
/// absorbed once, when the digester is made.
public final class KeyedDigest: @unchecked Sendable {
  // @unchecked: `keyed` is written only in `init` and copied, never changed, afterwards.
  /// The hash state after absorbing the key.
  private let keyed: UnsafeMutableRawPointer
  private static let stateSize = crypto_generichash_statebytes()
  private static let stateAlignment = 64
  /// The digest length, in bytes.
  public let length: Int

  public init(key: Data, length: Int = 20) throws {
    Sodium.ensure()
    guard key.count >= Int(crypto_generichash_KEYBYTES_MIN),
      key.count <= Int(crypto_generichash_KEYBYTES_MAX)
    else { throw CryptoError.invalidKey("a digest key must be 16...64 bytes") }
    guard length >= Int(crypto_generichash_BYTES_MIN), length <= Int(crypto_generichash_BYTES_MAX)
    else { throw CryptoError.failed("digest length \(length)") }
    self.length = length
    keyed = UnsafeMutableRawPointer.allocate(
      byteCount: Self.stateSize, alignment: Self.stateAlignment)
    let rc = key.withUnsafeBytes { k in
      crypto_generichash_init(
        OpaquePointer(keyed), k.bindMemory(to: UInt8.self).baseAddress, k.count, length)
    }
    guard rc == 0 else {
      keyed.deallocate()
      throw CryptoError.failed("crypto_generichash_init")
    }
  }

  deinit {
    sodium_memzero(keyed, Self.stateSize)
    keyed.deallocate()
  }

  /// The digest of `message`.
  public func digest(_ message: some StringProtocol) -> Data {
    var text = String(message)
    return text.withUTF8 { digest(UnsafeRawBufferPointer($0)) }
  }

  /// The digest of `message`.
  public func digest(_ message: UnsafeRawBufferPointer) -> Data {
    withUnsafeTemporaryAllocation(byteCount: Self.stateSize, alignment: Self.stateAlignment) {
      state in
      state.baseAddress!.copyMemory(from: keyed, byteCount: Self.stateSize)
      let st = OpaquePointer(state.baseAddress!)
      _ = crypto_generichash_update(
        st, message.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(message.count))
      var out = Data(count: length)
      out.withUnsafeMutableBytes { o in
        _ = crypto_generichash_final(st, o.bindMemory(to: UInt8.self).baseAddress!, o.count)
      }
      sodium_memzero(state.baseAddress!, Self.stateSize)
      return out
    }
  }
}
