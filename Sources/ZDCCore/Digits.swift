public import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// Zero-padded integer text, for names and timestamps built on many threads at once (without
/// `String(format:)`, which goes through CoreFoundation on Linux).
public enum Digits {
  /// `value` in `radix` (lower-case digits), left-padded with zeros to at least `width`
  /// characters; a negative value keeps its sign in front of the padding.
  public static func zeroPadded(_ value: some BinaryInteger, width: Int, radix: Int = 10)
    -> String
  {
    let magnitude = String(value.magnitude, radix: radix)
    let padding = String(repeating: "0", count: max(0, width - magnitude.count))
    return (value < 0 ? "-" : "") + padding + magnitude
  }

  /// The UTC calendar fields of `date`, to the second (rounded down), zero-padded: the year to
  /// 4 digits, the others to 2.
  public static func utc(_ date: Date) -> UTCFields {
    var t = time_t(date.timeIntervalSince1970.rounded(.down))
    var c = tm()
    gmtime_r(&t, &c)
    return UTCFields(
      year: zeroPadded(Int(c.tm_year) + 1900, width: 4), month: zeroPadded(c.tm_mon + 1, width: 2),
      day: zeroPadded(c.tm_mday, width: 2), hour: zeroPadded(c.tm_hour, width: 2),
      minute: zeroPadded(c.tm_min, width: 2), second: zeroPadded(c.tm_sec, width: 2))
  }
}

/// A UTC date and time as zero-padded text fields (see ``Digits/utc(_:)``).
public struct UTCFields: Sendable, Hashable {
  public let year: String
  public let month: String
  public let day: String
  public let hour: String
  public let minute: String
  public let second: String
}
