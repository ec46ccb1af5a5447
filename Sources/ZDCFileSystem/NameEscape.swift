import Foundation
import ZDCCore

/// The reversible mapping between treesystem names and the names shown through the mount.
///
/// See the "Names" article: a *plain* name is shown as is, and so is the case variant of one
/// (``CaseVariant``: kept beside a sibling that differs from it only in case); any other name
/// is shown as `%%`
/// followed by its percent-escaped UTF-8 (`%`, `/` and NUL escaped as `%XX`), and, when that is
/// longer than 255 bytes, cut and ended with `%~` and a 64-bit FNV-1a hash of the name.
public enum NameEscape {
  /// The prefix of every escaped name.
  public static let prefix = "%%"
  /// The names of a directory node's sections.
  public static let reserved: Set<String> = [".data", ".meta", ".thumb"]
  /// The longest name POSIX shows, in bytes.
  public static let maxBytes = 255

  /// True when `name` is shown unchanged.
  public static func isPlain(_ name: String) -> Bool {
    let bytes = name.utf8
    return !bytes.isEmpty && bytes.count <= maxBytes && !bytes.contains(0x2F)
      && !bytes.contains(0) && name != "." && name != ".." && !reserved.contains(name)
      && !name.hasPrefix(prefix)
  }

  /// The name shown for a treesystem name (see ``shown(_:baseTaken:)`` for a case variant).
  public static func shown(_ name: String) -> String {
    if isPlain(name) { return name }
    // A plain name kept beside a sibling that differs from it only in case.
    return variantBase(name) ?? escaped(name)
  }

  /// The name shown for a treesystem name whose siblings are known: the case variant of a
  /// name that a sibling holds exactly (two devices each kept their spelling, and the other
  /// spelling is gone) is shown escaped, so that no two entries of a directory show alike.
  public static func shown(_ name: String, baseTaken: Bool) -> String {
    baseTaken && variantBase(name) != nil ? escaped(name) : shown(name)
  }

  /// Whether `typed` is the escaped form of the case variant `name` it parsed to (see
  /// ``shown(_:baseTaken:)``): a name of the variant only while its plain name is taken.
  public static func isEscapedVariant(_ typed: String, parsedAs name: String) -> Bool {
    typed.hasPrefix(prefix) && variantBase(name) != nil
  }

  /// Every name a treesystem name may be shown as (a case variant: two), for the kernel's
  /// entries to forget.
  public static func shownForms(_ name: String) -> [String] {
    variantBase(name) != nil ? [shown(name), escaped(name)] : [shown(name)]
  }

  /// The plain name a case variant is shown as, when it is one (`nil` otherwise).
  public static func variantBase(_ name: String) -> String? {
    guard let base = CaseVariant.base(of: name), isPlain(base) else { return nil }
    return base
  }

  /// The escaped form of a name (form 1, or form 2 when too long).
  static func escaped(_ name: String) -> String {
    let full = prefix + percentEncode(name)
    if full.utf8.count <= maxBytes { return full }
    // Too long even escaped: a cut prefix plus a hash; resolved by scanning the directory.
    var cut = ""
    var bytes = 0
    let budget = maxBytes - prefix.utf8.count - 2 - 16
    var scalars = percentEncode(name).unicodeScalars.makeIterator()
    while let s = scalars.next() {
      let n = String(s).utf8.count
      if bytes + n > budget { break }
      cut.unicodeScalars.append(s)
      bytes += n
    }
    // Never end the cut inside a %XX escape.
    if let pct = cut.lastIndex(of: "%"), cut.distance(from: pct, to: cut.endIndex) < 3 {
      cut = String(cut[..<pct])
    }
    return prefix + cut + "%~" + Digits.zeroPadded(fnv1a(Array(name.utf8)), width: 16, radix: 16)
  }

  /// What a name typed through the mount means.
  public enum Parsed: Sendable, Hashable {
    /// Exactly this treesystem name.
    case name(String)
    /// A hashed form: the treesystem name is the child whose ``shown(_:)`` equals it.
    case hashed(String)
  }

  /// Parses a name typed through the mount. Throws `invalidArgument` for an escaped form that
  /// is not the canonical escape of any name (so every accepted name round-trips); the escape
  /// of a case variant is accepted too (it is how the variant is shown while a sibling holds
  /// its plain name: the file system checks that).
  public static func parse(_ typed: String) throws -> Parsed {
    guard typed.hasPrefix(prefix) else { return .name(typed) }
    let body = typed.dropFirst(prefix.count)
    if body.contains("%~") { return .hashed(typed) }
    guard let decoded = percentDecode(String(body)), !decoded.isEmpty,
      shown(decoded) == typed || (variantBase(decoded) != nil && escaped(decoded) == typed)
    else { throw FileSystemError.invalidArgument }
    return .name(decoded)
  }

  static func percentEncode(_ name: String) -> String {
    var out = ""
    for s in name.unicodeScalars {
      switch s {
      case "%": out += "%25"
      case "/": out += "%2F"
      case "\0": out += "%00"
      default: out.unicodeScalars.append(s)
      }
    }
    return out
  }

  static func percentDecode(_ text: String) -> String? {
    var bytes: [UInt8] = []
    let u = Array(text.utf8)
    var i = 0
    while i < u.count {
      if u[i] == 0x25 {
        guard i + 2 < u.count,
          let v = UInt8(String(decoding: u[(i + 1)...(i + 2)], as: UTF8.self), radix: 16)
        else { return nil }
        bytes.append(v)
        i += 3
      } else {
        bytes.append(u[i])
        i += 1
      }
    }
    return String(validating: bytes, as: UTF8.self)
  }

  static func fnv1a(_ bytes: [UInt8]) -> UInt64 { CaseVariant.fnv1a(bytes) }
}
