public import Foundation

/// Where a treesystem's objects are kept.
public enum StoreLocation: Sendable, Hashable, Codable, CustomStringConvertible {
  /// A folder on this machine (or a shared/synced folder): the embedded default.
  case localFolder(path: String)

  /// Parses a `--store` argument: a path, or `file://PATH`.
  public init(argument: String) throws {
    if argument.hasPrefix("file://") {
      self = .localFolder(path: String(argument.dropFirst("file://".count)))
    } else if argument.contains("://") {
      throw AccountError.unsupportedStore(argument)
    } else {
      self = .localFolder(path: URL(fileURLWithPath: argument).standardizedFileURL.path)
    }
  }

  public var description: String {
    switch self {
    case .localFolder(let p): return "file://\(p)"
    }
  }
}

/// An account's public settings on one device (`config.json`).
public struct AccountConfig: Sendable, Hashable, Codable {
  /// Config format version (1).
  public var version: Int
  /// The user's ID.
  public var userID: String
  /// The tree this device mounts.
  public var treeID: String
  /// This device's random ID (names its change-log entries).
  public var deviceID: String
  /// A human name for this device (used in conflicted-copy names).
  public var deviceName: String
  /// Where the objects are kept.
  public var store: StoreLocation
  /// When this device joined.
  public var createdAt: Date

  public init(
    userID: String, treeID: String, deviceID: String, deviceName: String, store: StoreLocation,
    createdAt: Date
  ) {
    self.version = 1
    self.userID = userID
    self.treeID = treeID
    self.deviceID = deviceID
    self.deviceName = deviceName
    self.store = store
    self.createdAt = createdAt
  }
}

/// Errors of account setup and unlocking, each with a message meant for the user.
public enum AccountError: Error, Sendable, Equatable, CustomStringConvertible {
  /// `zdc init` on a state directory that already has an account.
  case alreadyInitialized(String)
  /// A command that needs an account, on a state directory without one.
  case notInitialized(String)
  /// The store already holds this user (init without --join).
  case userExistsInStore(String)
  /// `--join` found no user in the store.
  case noUserInStore
  /// `--join` found several users and none was chosen.
  case ambiguousUser([String])
  /// The user named is not in the store.
  case userNotFound(String)
  /// The store location is not one this build supports.
  case unsupportedStore(String)
  /// The keys in the store do not match each other.
  case inconsistentKeys(String)
  /// A local file could not be read or written.
  case io(String)

  public var description: String {
    switch self {
    case .alreadyInitialized(let p): return "an account already exists in \(p)"
    case .notInitialized(let p): return "no account in \(p): run `zdc init` first"
    case .userExistsInStore(let u):
      return "the store already holds user \(u): use `zdc init --join` to add this device"
    case .noUserInStore: return "the store holds no user: run `zdc init` without --join"
    case .ambiguousUser(let us):
      return "the store holds several users (\(us.joined(separator: ", "))): choose one with --user"
    case .userNotFound(let u): return "user \(u) is not in the store"
    case .unsupportedStore(let s): return "unsupported store location \(s)"
    case .inconsistentKeys(let m): return "inconsistent keys in the store: \(m)"
    case .io(let m): return m
    }
  }
}
