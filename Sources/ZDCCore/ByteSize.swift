import Foundation

/// A size in bytes as people write it on a command line.
///
/// The conventions of coreutils (`dd`, `truncate`): a plain number is bytes; `K`, `M`, `G`, `T`
/// (or `KiB` … `TiB`) are powers of 1024; `KB`, `MB`, `GB`, `TB` are powers of 1000. Letters
/// may be lower case; a fractional number takes a suffix (`1.5G`).
public enum ByteSize {
  /// The number of bytes `text` stands for, or `nil` when it is not a size (or overflows).
  public static func parse(_ text: String) -> UInt64? {
    let s = text.trimmingCharacters(in: .whitespaces)
    let digits = s.prefix { $0.isASCII && ($0.isNumber || $0 == ".") }
    guard !digits.isEmpty, let value = Double(digits), value >= 0 else { return nil }
    let multiplier: Double
    switch s.dropFirst(digits.count).lowercased() {
    case "", "b": multiplier = 1
    case "k", "kib": multiplier = 0x1p10
    case "m", "mib": multiplier = 0x1p20
    case "g", "gib": multiplier = 0x1p30
    case "t", "tib": multiplier = 0x1p40
    case "kb": multiplier = 1e3
    case "mb": multiplier = 1e6
    case "gb": multiplier = 1e9
    case "tb": multiplier = 1e12
    default: return nil
    }
    if multiplier == 1 && digits.contains(".") { return nil }
    let bytes = (value * multiplier).rounded(.down)
    guard bytes < 0x1p64 else { return nil }
    return UInt64(bytes)
  }
}
