/// Errors of the crypto layer: bad keys, failed authentication, malformed formats.
public enum CryptoError: Error, Sendable, Equatable, CustomStringConvertible {
  /// A key of the wrong size or kind.
  case invalidKey(String)
  /// Decryption failed: wrong key, or the bytes were altered.
  case authenticationFailed(String)
  /// The bytes are not in the expected format (bad magic, version, sizes, JSON).
  case malformed(String)
  /// The ciphertext ends before its last chunk: truncated.
  case truncated(String)
  /// A format version this build does not understand.
  case unsupportedVersion(Int)
  /// A libsodium call failed unexpectedly.
  case failed(String)
  /// A passphrase or recovery key did not open a keystore.
  case wrongPassphrase

  public var description: String {
    switch self {
    case .invalidKey(let m): return "invalid key: \(m)"
    case .authenticationFailed(let m):
      return "authentication failed (wrong key or tampered data): \(m)"
    case .malformed(let m): return "malformed encrypted object: \(m)"
    case .truncated(let m): return "truncated encrypted object: \(m)"
    case .unsupportedVersion(let v): return "unsupported format version \(v)"
    case .failed(let m): return "crypto operation failed: \(m)"
    case .wrongPassphrase: return "wrong passphrase or recovery key"
    }
  }
}
