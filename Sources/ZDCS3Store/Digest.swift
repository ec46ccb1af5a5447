import CSodium
import Foundation

/// SHA-256 and HMAC-SHA256 through libsodium.
enum Digest {
  static let ready: Bool = {
    precondition(sodium_init() >= 0, "libsodium failed to initialise")
    return true
  }()

  /// SHA-256 of some bytes.
  static func sha256(_ data: Data) -> [UInt8] {
    _ = ready
    var out = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
    data.withUnsafeBytes { buf in
      _ = crypto_hash_sha256(
        &out, buf.bindMemory(to: UInt8.self).baseAddress, UInt64(buf.count))
    }
    return out
  }

  /// SHA-256 of a string's UTF-8 bytes.
  static func sha256(_ string: String) -> [UInt8] { sha256(Data(string.utf8)) }

  /// HMAC-SHA256 of `message` under `key` (any key length).
  static func hmacSHA256(key: [UInt8], _ message: String) -> [UInt8] {
    _ = ready
    var state = crypto_auth_hmacsha256_state()
    var out = [UInt8](repeating: 0, count: Int(crypto_auth_hmacsha256_BYTES))
    _ = crypto_auth_hmacsha256_init(&state, key, key.count)
    let bytes = Array(message.utf8)
    _ = crypto_auth_hmacsha256_update(&state, bytes, UInt64(bytes.count))
    _ = crypto_auth_hmacsha256_final(&state, &out)
    return out
  }

  /// Lower-case hexadecimal.
  static func hex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out = [UInt8]()
    out.reserveCapacity(bytes.count * 2)
    for b in bytes {
      out.append(digits[Int(b >> 4)])
      out.append(digits[Int(b & 0x0f)])
    }
    return String(decoding: out, as: UTF8.self)
  }
}
