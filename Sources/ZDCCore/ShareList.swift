public import Foundation

/// Permissions one principal holds on a node, written as a string of flag characters.
public struct Permissions: OptionSet, Sendable, Hashable, Codable, CustomStringConvertible {
  public let rawValue: UInt16
  public init(rawValue: UInt16) { self.rawValue = rawValue }

  /// `r`: may read the node (and is given its key).
  public static let read = Permissions(rawValue: 1 << 0)
  /// `w`: may write the node.
  public static let write = Permissions(rawValue: 1 << 1)
  /// `s`: may share the node with others.
  public static let share = Permissions(rawValue: 1 << 2)
  /// `L`: may only create leaves below the node (drop-box style).
  public static let leafsOnly = Permissions(rawValue: 1 << 3)
  /// `U`: the node's writers must be its owner.
  public static let userMustBeOwner = Permissions(rawValue: 1 << 4)
  /// `B`: the owner may burn (delete) the node.
  public static let burnIfOwner = Permissions(rawValue: 1 << 5)

  private static let letters: [(Character, Permissions)] = [
    ("r", .read), ("w", .write), ("s", .share), ("L", .leafsOnly), ("U", .userMustBeOwner),
    ("B", .burnIfOwner),
  ]

  /// Parses a permission string such as `"rws"`. Throws on an unknown character.
  public init(string: String) throws {
    var p = Permissions()
    for ch in string {
      guard let flag = Self.letters.first(where: { $0.0 == ch })?.1 else {
        throw CoreError.invalidPermissions(string)
      }
      p.insert(flag)
    }
    self = p
  }

  /// The canonical string form, flags in a fixed order.
  public var description: String {
    String(Self.letters.filter { contains($0.1) }.map(\.0))
  }

  public init(from decoder: any Decoder) throws {
    try self.init(string: decoder.singleValueContainer().decode(String.self))
  }

  public func encode(to encoder: any Encoder) throws {
    var c = encoder.singleValueContainer()
    try c.encode(description)
  }
}

/// The identity a share-list entry is for.
public enum SharePrincipal: Sendable, Hashable, Codable, CustomStringConvertible {
  /// A user, by userID.
  case user(String)

  /// Parses `UID:{userID}`.
  public init?(key: String) {
    guard key.hasPrefix("UID:"), key.count > 4 else { return nil }
    self = .user(String(key.dropFirst(4)))
  }

  /// The share-list key: `UID:{userID}`.
  public var key: String {
    switch self {
    case .user(let id): return "UID:\(id)"
    }
  }

  public var description: String { key }
}

/// One entry of a share list: what a principal may do, and the node key wrapped for it.
public struct ShareItem: Sendable, Hashable, Codable {
  /// The principal's permissions.
  public var permissions: Permissions
  /// The node key sealed to the principal's public key (`crypto_box_seal`), if already wrapped.
  public var wrappedKey: Data?

  public init(permissions: Permissions, wrappedKey: Data? = nil) {
    self.permissions = permissions
    self.wrappedKey = wrappedKey
  }
}

/// Who may do what with a node.
public struct ShareList: Sendable, Hashable, Codable {
  /// Entries by principal.
  public private(set) var items: [SharePrincipal: ShareItem]

  /// An empty list.
  public init() { items = [:] }

  /// The list that gives a single owner every right.
  public static func owner(_ userID: String) -> ShareList {
    var list = ShareList()
    list.set(ShareItem(permissions: [.read, .write, .share]), for: .user(userID))
    return list
  }

  /// Sets (or replaces) one principal's entry.
  public mutating func set(_ item: ShareItem, for principal: SharePrincipal) {
    items[principal] = item
  }

  /// Removes one principal's entry.
  public mutating func remove(_ principal: SharePrincipal) {
    items[principal] = nil
  }

  /// One principal's entry.
  public subscript(principal: SharePrincipal) -> ShareItem? { items[principal] }

  /// The userIDs with an entry, sorted.
  public var userIDs: [String] {
    items.keys.compactMap { if case .user(let id) = $0 { return id } else { return nil } }.sorted()
  }
}
