import CSodium
public import Foundation
import ZDCCore

/// The cloudName of a node: the opaque file name of its objects in the store.
///
/// `zBase32(BLAKE2b-160(key: parent.dirSalt, message: UTF-8 of NFC(lowercased(name))))`,
/// 32 characters. Siblings whose names differ only in case share a cloudName.
public enum CloudName {
  /// Computes the cloudName of `name` under a parent with `parentDirSalt`.
  ///
  /// The salt must be 16 to 64 bytes (libsodium's keyed BLAKE2b limits); node dirSalts are 20.
  public static func compute(name: String, parentDirSalt: Data) throws -> String {
    Sodium.ensure()
    guard parentDirSalt.count >= Int(crypto_generichash_KEYBYTES_MIN),
      parentDirSalt.count <= Int(crypto_generichash_KEYBYTES_MAX)
    else { throw CryptoError.invalidKey("dirSalt must be 16...64 bytes") }
    var message = NameKey(name).value
    return try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digest in
      let rc = message.withUTF8 { m in
        parentDirSalt.withUnsafeBytes { salt in
          crypto_generichash(
            digest.baseAddress!, 20, m.baseAddress, UInt64(m.count),
            salt.bindMemory(to: UInt8.self).baseAddress, salt.count)
        }
      }
      guard rc == 0 else { throw CryptoError.failed("crypto_generichash") }
      return ZBase32.encode(UnsafeRawBufferPointer(digest))
    }
  }

  /// A random 160-bit cloudName, for objects that are not named after a node.
  public static func random() -> String { ZBase32.encode(SecureRandom.bytes(20)) }
}
