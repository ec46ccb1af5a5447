public import Foundation

/// zBase32 (Zooko's human-oriented base-32), as used for cloudNames and userIDs.
///
/// Bits are taken most-significant first, 5 at a time; a final partial group is padded with
/// zero bits. No padding characters.
public enum ZBase32 {
  static let alphabet = Array("ybndrfg8ejkmcpqxot1uwisza345h769".utf8)
  static let reverse: [UInt8: UInt8] = {
    var r: [UInt8: UInt8] = [:]
    for (i, c) in alphabet.enumerated() { r[c] = UInt8(i) }
    return r
  }()

  /// Encodes bytes; 20 bytes give 32 characters.
  public static func encode(_ data: Data) -> String {
    data.withUnsafeBytes { encode($0) }
  }

  /// Encodes bytes; 20 bytes give 32 characters.
  public static func encode(_ bytes: UnsafeRawBufferPointer) -> String {
    // Written in place: every cloudName of a create or rename is encoded (appending to an
    // array and reading `Data` byte by byte cost more than the hash before it).
    alphabet.withUnsafeBufferPointer { abc in
      String(unsafeUninitializedCapacity: (bytes.count * 8 + 4) / 5) { out in
        var buffer: UInt32 = 0
        var bits = 0
        var n = 0
        for byte in bytes {
          buffer = (buffer << 8) | UInt32(byte)
          bits += 8
          while bits >= 5 {
            out[n] = abc[Int((buffer >> UInt32(bits - 5)) & 31)]
            n += 1
            bits -= 5
          }
        }
        if bits > 0 {
          out[n] = abc[Int((buffer << UInt32(5 - bits)) & 31)]
          n += 1
        }
        return n
      }
    }
  }

  /// Decodes a string produced by `encode`; `nil` on a character outside the alphabet or
  /// non-zero padding bits.
  public static func decode(_ string: String) -> Data? {
    var out = Data()
    var buffer: UInt32 = 0
    var bits = 0
    for c in string.utf8 {
      guard let v = reverse[c] else { return nil }
      buffer = (buffer << 5) | UInt32(v)
      bits += 5
      if bits >= 8 {
        out.append(UInt8((buffer >> UInt32(bits - 8)) & 0xff))
        bits -= 8
      }
    }
    if bits > 0 && (buffer & ((1 << UInt32(bits)) - 1)) != 0 { return nil }
    return out
  }
}
