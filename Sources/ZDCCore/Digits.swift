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
}
