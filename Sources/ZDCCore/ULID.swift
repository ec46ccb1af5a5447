public import Foundation

/// A Universally Unique Lexicographically Sortable Identifier: 48-bit millisecond time and
/// 80 random bits, 26 characters of Crockford base-32. Change-log keys start with one, so a
/// store's byte-ordered listing returns entries in time order.
public struct ULID: Sendable, Hashable, Comparable, CustomStringConvertible {
  static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

  /// The 26-character text form.
  public let string: String

  /// A new ULID for a time, with random low bits.
  public init(date: Date = Date()) {
    var rng = PooledRandomGenerator()
    self.init(milliseconds: UInt64(max(0, date.timeIntervalSince1970 * 1000)), random: &rng)
  }

  /// A ULID from explicit parts (tests, monotonic generators).
  public init<R: RandomNumberGenerator>(milliseconds: UInt64, random: inout R) {
    var chars = [UInt8](repeating: 0, count: 26)
    var t = milliseconds & 0xFFFF_FFFF_FFFF
    for i in stride(from: 9, through: 0, by: -1) {
      chars[i] = Self.alphabet[Int(t & 31)]
      t >>= 5
    }
    for i in 10..<26 { chars[i] = Self.alphabet[Int(random.next() & 31)] }
    string = String(decoding: chars, as: UTF8.self)
  }

  /// Parses a text form; `nil` unless 26 characters of the alphabet.
  public init?(_ text: String) {
    let up = text.uppercased()
    guard up.utf8.count == 26, up.utf8.allSatisfy({ Self.alphabet.contains($0) }) else {
      return nil
    }
    string = up
  }

  /// The time part, in milliseconds since the epoch.
  public var milliseconds: UInt64 {
    var t: UInt64 = 0
    for c in string.utf8.prefix(10) {
      t = t << 5 | UInt64(Self.alphabet.firstIndex(of: c) ?? 0)
    }
    return t
  }

  public static func < (a: ULID, b: ULID) -> Bool { a.string < b.string }
  public var description: String { string }
}
