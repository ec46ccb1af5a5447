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
    /// Seals the catalog's sensitive fields (node keys, extended attributes, data tags, redo
    /// journal records).
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
