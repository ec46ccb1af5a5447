import CSodium
public import Foundation
import ZDCCore

/// libsodium initialisation, done once before any other call.
enum Sodium {
  /// Calls `sodium_init` exactly once; traps if libsodium cannot initialise (no entropy source).
  static let ready: Bool = {
    let rc = sodium_init()
    precondition(rc >= 0, "libsodium failed to initialise")
    return true
  }()

  @inline(__always) static func ensure() { _ = ready }
}

/// Cryptographically secure random values.
public enum SecureRandom {
  /// `count` random bytes.
  public static func bytes(_ count: Int) -> Data { RandomBytes.data(count) }

  /// Fills `buffer` with random bytes (``RandomBytes``).
  public static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
    RandomBytes.fill(buffer)
  }

  /// A new node key: 32 random bytes (XChaCha20-Poly1305 key size).
  public static func nodeKey() -> Data { bytes(32) }

  /// A new dirSalt: 20 random bytes.
  public static func dirSalt() -> Data { bytes(20) }

  /// A new dirPrefix: 128 random bits as 32 upper-case hex digits.
  public static func dirPrefix() -> String { hex128(uppercase: true) }

  /// A new cloudID: 128 random bits as 32 lower-case hex digits.
  public static func cloudID() -> String { hex128(uppercase: false) }

  /// 128 random bits as 32 hex digits (no `Data` in between).
  public static func hex128(uppercase: Bool = false) -> String {
    var b: (UInt64, UInt64) = (0, 0)
    return withUnsafeMutableBytes(of: &b) { raw in
      fill(raw)
      return Hex.encode(UnsafeRawBufferPointer(raw), uppercase: uppercase)
    }
  }

  /// A new local node uuid (RFC 4122 version 4 form, lower case), from ``RandomBytes``
  /// (Foundation's `UUID()` opens `/dev/urandom` for each one on Linux).
  public static func uuid() -> String {
    var b: (UInt64, UInt64) = (0, 0)
    return withUnsafeMutableBytes(of: &b) { raw in
      fill(raw)
      raw[6] = (raw[6] & 0x0f) | 0x40  // version 4
      raw[8] = (raw[8] & 0x3f) | 0x80  // RFC 4122 variant
      return String(unsafeUninitializedCapacity: 36) { out in
        var o = 0
        for i in 0..<16 {
          if i == 4 || i == 6 || i == 8 || i == 10 {
            out[o] = UInt8(ascii: "-")
            o += 1
          }
          out[o] = Hex.digit(raw[i] >> 4, uppercase: false)
          out[o + 1] = Hex.digit(raw[i] & 0x0f, uppercase: false)
          o += 2
        }
        return o
      }
    }
  }

  /// A new userID: 160 random bits in zBase32 (32 characters).
  public static func userID() -> String { ZBase32.encode(bytes(20)) }
}

/// Hexadecimal encoding.
public enum Hex {
  /// Encodes bytes as hex digits.
  public static func encode(_ data: Data, uppercase: Bool = false) -> String {
    data.withUnsafeBytes { encode($0, uppercase: uppercase) }
  }

  /// Encodes bytes in place as hex digits.
  public static func encode(_ src: UnsafeRawBufferPointer, uppercase: Bool = false) -> String {
    String(unsafeUninitializedCapacity: src.count * 2) { out in
      for (i, b) in src.enumerated() {
        out[2 * i] = digit(b >> 4, uppercase: uppercase)
        out[2 * i + 1] = digit(b & 0x0f, uppercase: uppercase)
      }
      return src.count * 2
    }
  }

  /// The hex digit (ASCII) of a nibble (0...15).
  @inline(__always)
  static func digit(_ nibble: UInt8, uppercase: Bool) -> UInt8 {
    nibble < 10 ? 0x30 + nibble : (uppercase ? 0x37 : 0x57) + nibble
  }

  /// Decodes hex digits (either case); `nil` on odd length or a non-hex character.
  public static func decode(_ string: String) -> Data? {
    let chars = Array(string.utf8)
    guard chars.count % 2 == 0 else { return nil }
    func nibble(_ c: UInt8) -> UInt8? {
      switch c {
      case 48...57: return c - 48
      case 65...70: return c - 55
      case 97...102: return c - 87
      default: return nil
      }
    }
    var out = Data(capacity: chars.count / 2)
    var i = 0
    while i < chars.count {
      guard let hi = nibble(chars[i]), let lo = nibble(chars[i + 1]) else { return nil }
      out.append(hi << 4 | lo)
      i += 2
    }
    return out
  }
}
