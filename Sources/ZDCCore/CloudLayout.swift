/// Object keys of a treesystem in a store (DESIGN §3, format version 1).
///
/// `{userID}/{treeID}/{dirPrefix}/{cloudName}.rcrd` and `.data`; the change log under
/// `{userID}/{treeID}/changes/`; the public key at `{userID}/pubkey`; the sealed private key at
/// `{userID}/privkey`.
public struct CloudLayout: Sendable, Hashable {
  /// The owner of the tree.
  public let userID: String
  /// The tree (application) identifier.
  public let treeID: String

  public init(userID: String, treeID: String) {
    self.userID = userID
    self.treeID = treeID
  }

  /// The prefix of every object of this tree.
  public var treePrefix: String { "\(userID)/\(treeID)/" }

  /// The prefix under which the children of a node with this dirPrefix live.
  public func childrenPrefix(dirPrefix: String) -> String { "\(treePrefix)\(dirPrefix)/" }

  /// The RCRD key of a node.
  public func rcrdKey(dirPrefix: String, cloudName: String) -> String {
    "\(treePrefix)\(dirPrefix)/\(cloudName).rcrd"
  }

  /// The DATA key of a node.
  public func dataKey(dirPrefix: String, cloudName: String) -> String {
    "\(treePrefix)\(dirPrefix)/\(cloudName).data"
  }

  /// The prefix of the change log.
  public var changesPrefix: String { "\(treePrefix)changes/" }

  /// The key of one change-log entry.
  public func changeKey(ulid: String, deviceID: String) -> String {
    "\(changesPrefix)\(ulid)-\(deviceID)"
  }

  /// The user's public key document.
  public static func pubkeyKey(userID: String) -> String { "\(userID)/pubkey" }

  /// The user's private keys, sealed under a passphrase and a recovery key.
  public static func privkeyKey(userID: String) -> String { "\(userID)/privkey" }

  /// The prefix of the user registry, one object per user, so a new device can find its user.
  public static let usersPrefix = "users/"

  /// The registry object of one user (its content is the public key document).
  public static func userRegistryKey(userID: String) -> String { "\(usersPrefix)\(userID)" }

  /// Splits an object key of this tree into (dirPrefix, cloudName, extension), or `nil`.
  public func parse(key: String) -> (dirPrefix: String, cloudName: String, isRcrd: Bool)? {
    guard key.hasPrefix(treePrefix) else { return nil }
    let rest = key.dropFirst(treePrefix.count)
    let parts = rest.split(separator: "/", omittingEmptySubsequences: false)
    guard parts.count == 2 else { return nil }
    let file = parts[1]
    if file.hasSuffix(".rcrd") {
      return (String(parts[0]), String(file.dropLast(5)), true)
    } else if file.hasSuffix(".data") {
      return (String(parts[0]), String(file.dropLast(5)), false)
    }
    return nil
  }
}
