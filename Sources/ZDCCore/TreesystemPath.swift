import Foundation

/// The top-level containers of a user's treesystem.
public enum Trunk: String, Sendable, Hashable, Codable, CaseIterable, Comparable {
  /// The user's files; the mount shows this container.
  case home
  /// Application preferences.
  case prefs
  /// Incoming messages.
  case msgsIn
  /// Outgoing messages.
  case msgsOut

  /// The fixed dirPrefix under which the trunk's children live in the cloud.
  public var dirPrefix: String {
    switch self {
    case .home: return "00000000000000000000000000000000"
    case .prefs: return "prefs"
    case .msgsIn: return "msgsIn"
    case .msgsOut: return "msgsOut"
    }
  }

  public static func < (lhs: Trunk, rhs: Trunk) -> Bool {
    allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
  }
}

/// A location in a treesystem: a trunk and a list of node names below it.
///
/// Any valid Unicode string except the empty string is a legal name; there are no separator
/// characters and no escaping.
public struct TreesystemPath: Sendable, Hashable, Codable, Comparable, CustomStringConvertible {
  /// The trunk the path starts at.
  public let trunk: Trunk
  /// The names of the nodes from the trunk down to the node, in order.
  public let components: [String]

  /// A path from its components. Throws `CoreError.invalidName` for an empty component.
  public init(_ components: [String], trunk: Trunk = .home) throws {
    for c in components where c.isEmpty { throw CoreError.invalidName(c) }
    self.trunk = trunk
    self.components = components
  }

  /// The trunk itself.
  public init(trunk: Trunk) {
    self.trunk = trunk
    self.components = []
  }

  /// True for the path of a trunk.
  public var isTrunk: Bool { components.isEmpty }

  /// The last component, or `nil` for a trunk.
  public var name: String? { components.last }

  /// The path of the parent, or `nil` for a trunk.
  public var parent: TreesystemPath? {
    guard !components.isEmpty else { return nil }
    return TreesystemPath(trusted: Array(components.dropLast()), trunk: trunk)
  }

  /// This path with one more component.
  public func appending(_ component: String) throws -> TreesystemPath {
    guard !component.isEmpty else { throw CoreError.invalidName(component) }
    return TreesystemPath(trusted: components + [component], trunk: trunk)
  }

  /// This path with several more components.
  public func appending(contentsOf more: [String]) throws -> TreesystemPath {
    try TreesystemPath(components + more, trunk: trunk)
  }

  /// True when `self` is `other` or lies below it (names compared as the treesystem does:
  /// case-insensitively after NFC normalisation).
  public func isDescendant(of other: TreesystemPath) -> Bool {
    guard trunk == other.trunk, components.count >= other.components.count else { return false }
    for (a, b) in zip(components, other.components) where NameKey(a) != NameKey(b) {
      return false
    }
    return true
  }

  /// A readable form for logs and messages: `/home/a/b`. Not a parseable format.
  public var description: String {
    "/" + ([trunk.rawValue] + components).joined(separator: "/")
  }

  public static func < (lhs: TreesystemPath, rhs: TreesystemPath) -> Bool {
    if lhs.trunk != rhs.trunk { return lhs.trunk < rhs.trunk }
    for (a, b) in zip(lhs.components, rhs.components) where a != b {
      return Array(a.utf8).lexicographicallyPrecedes(Array(b.utf8))
    }
    return lhs.components.count < rhs.components.count
  }

  private init(trusted components: [String], trunk: Trunk) {
    self.trunk = trunk
    self.components = components
  }
}

/// The form of a name that the treesystem compares: Unicode lower case, then NFC.
///
/// Two names with the same key cannot be siblings, and they hash to the same cloudName.
public struct NameKey: Sendable, Hashable, Codable, CustomStringConvertible {
  /// The normalised string.
  public let value: String

  /// The key of a node name.
  public init(_ name: String) {
    let lower = name.lowercased()
    // ASCII text is its own NFC form (and the normalisation is costly on every lookup).
    value =
      lower.utf8.allSatisfy { $0 < 0x80 } ? lower : lower.precomposedStringWithCanonicalMapping
  }

  public var description: String { value }
}

/// Names kept beside a sibling whose name differs from theirs only in case.
///
/// Treesystem names compare case-insensitively (``NameKey``), but a Linux directory may hold
/// `Makefile` and `makefile`. The second one is kept under its *case variant*: the name, a NUL
/// and the 16 lower-case hex digits of the 64-bit FNV-1a hash of its UTF-8. The variant's key
/// differs from the name's (so its cloudName does too), and starts with it, so one range of the
/// name index holds a name and all its variants.
public enum CaseVariant {
  /// The bytes the variant adds after the name: a NUL and 16 hex digits.
  public static let suffixLength = 17

  /// The case variant of `name`.
  public static func name(for name: String) -> String {
    name + "\u{0}" + Digits.zeroPadded(fnv1a(Array(name.utf8)), width: 16, radix: 16)
  }

  /// The name a case variant stands for, or `nil` for a name that is not one.
  public static func base(of variant: String) -> String? {
    let u = Array(variant.utf8)
    guard u.count > suffixLength, u[u.count - suffixLength] == 0 else { return nil }
    let base = String(decoding: u[..<(u.count - suffixLength)], as: UTF8.self)
    return Self.name(for: base) == variant ? base : nil
  }

  /// True when a key (a ``NameKey`` value) has the shape of a case variant's: the key of the
  /// name, then the suffix (lower-casing leaves the NUL and the hex digits alone).
  public static func splitKey(_ key: String) -> (base: Substring, suffix: Substring)? {
    let u = key.utf8
    guard u.count > suffixLength else { return nil }
    let cut = u.index(u.endIndex, offsetBy: -suffixLength)
    guard u[cut] == 0,
      u[u.index(after: cut)...].allSatisfy({
        (0x30...0x39).contains($0) || (0x61...0x66).contains($0)
      })
    else { return nil }
    return (key[..<cut], key[cut...])
  }

  /// The 64-bit FNV-1a hash of `bytes`.
  public static func fnv1a(_ bytes: [UInt8]) -> UInt64 { FNV1a.hash(bytes) }
}
