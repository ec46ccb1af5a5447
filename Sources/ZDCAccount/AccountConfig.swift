public import Foundation
public import ZDCS3Store

/// Where an S3 bucket is and how to reach it: everything but the credentials, which come from
/// the AWS environment or profile each time the store is opened.
public struct S3StoreLocation: Sendable, Hashable, Codable {
  /// The bucket.
  public var bucket: String
  /// The key prefix every object is stored under ("" or ending in `/`).
  public var prefix: String
  /// The endpoint URL; `nil` for AWS (`https://s3.{region}.amazonaws.com`).
  public var endpoint: String?
  /// The signing region.
  public var region: String
  /// Path-style, virtual-hosted or automatic addressing.
  public var addressing: S3AddressingStyle
  /// The AWS profile to read credentials from; `nil` for `AWS_PROFILE`, else `default`.
  public var profile: String?
  /// True when `zdc init` found that the server ignores conditional writes and was told to
  /// go on anyway.
  public var unconditionalWritesAccepted: Bool?

  public init(
    bucket: String, prefix: String, endpoint: String?, region: String,
    addressing: S3AddressingStyle, profile: String? = nil,
    unconditionalWritesAccepted: Bool? = nil
  ) {
    self.bucket = bucket
    self.prefix = prefix
    self.endpoint = endpoint
    self.region = region
    self.addressing = addressing
    self.profile = profile
    self.unconditionalWritesAccepted = unconditionalWritesAccepted
  }

  /// Resolves `s3://bucket/prefix` the way the AWS CLI would (explicit values, then the
  /// environment, then the profile), keeping everything but the credentials, which must be
  /// found too (`S3ConfigurationError.missingCredentials` otherwise).
  public static func resolve(
    storeURL: String, endpoint: String? = nil, region: String? = nil, pathStyle: Bool = false,
    profile: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment
  ) throws -> S3StoreLocation {
    let c = try S3Configuration.resolve(
      storeURL: storeURL, endpoint: endpoint, region: region, profile: profile,
      addressingStyle: pathStyle ? .path : nil, environment: environment)
    return S3StoreLocation(
      bucket: c.bucket, prefix: c.prefix, endpoint: c.endpoint?.absoluteString, region: c.region,
      addressing: c.addressingStyle, profile: profile)
  }

  /// The configuration to open the store with: the recorded bucket, prefix, endpoint, region
  /// and addressing, and credentials from the environment or profile now.
  public func configuration(
    environment: [String: String] = ProcessInfo.processInfo.environment
  ) throws -> S3Configuration {
    var c = try S3Configuration.resolve(
      bucket: bucket, prefix: prefix, endpoint: endpoint, region: region, profile: profile,
      addressingStyle: addressing, environment: environment)
    // The recorded endpoint is the store's; `AWS_ENDPOINT_URL` must not move it elsewhere.
    c.endpoint = endpoint.flatMap { URL(string: $0) }
    return c
  }

  /// `s3://bucket/prefix`.
  public var url: String { "s3://\(bucket)/\(prefix)" }
}

/// Where a treesystem's objects are kept.
public enum StoreLocation: Sendable, Hashable, Codable, CustomStringConvertible {
  /// A folder on this machine (or a shared/synced folder): the embedded default.
  case localFolder(path: String)
  /// A prefix of an S3 bucket (AWS or any S3-compatible server).
  case s3(S3StoreLocation)

  /// Parses a `--store` argument: a path, `file://PATH`, or `s3://bucket/prefix` (resolved
  /// with `S3StoreLocation.resolve`; the credentials must be found).
  public init(
    argument: String, endpoint: String? = nil, region: String? = nil, pathStyle: Bool = false,
    profile: String? = nil, environment: [String: String] = ProcessInfo.processInfo.environment
  ) throws {
    if argument.hasPrefix("file://") {
      self = .localFolder(path: String(argument.dropFirst("file://".count)))
    } else if argument.lowercased().hasPrefix("s3://") {
      self = .s3(
        try S3StoreLocation.resolve(
          storeURL: argument, endpoint: endpoint, region: region, pathStyle: pathStyle,
          profile: profile, environment: environment))
    } else if argument.contains("://") {
      throw AccountError.unsupportedStore(argument)
    } else {
      self = .localFolder(path: URL(fileURLWithPath: argument).standardizedFileURL.path)
    }
  }

  private enum CodingKeys: String, CodingKey { case localFolder, s3 }
  private enum FolderKeys: String, CodingKey { case path }

  /// `{"localFolder":{"path":…}}` or `{"s3":{"bucket":…,"prefix":…,…}}`.
  public init(from decoder: any Decoder) throws {
    let c = try decoder.container(keyedBy: CodingKeys.self)
    if c.contains(.s3) {
      self = .s3(try c.decode(S3StoreLocation.self, forKey: .s3))
    } else {
      let folder = try c.nestedContainer(keyedBy: FolderKeys.self, forKey: .localFolder)
      self = .localFolder(path: try folder.decode(String.self, forKey: .path))
    }
  }

  public func encode(to encoder: any Encoder) throws {
    var c = encoder.container(keyedBy: CodingKeys.self)
    switch self {
    case .localFolder(let path):
      var folder = c.nestedContainer(keyedBy: FolderKeys.self, forKey: .localFolder)
      try folder.encode(path, forKey: .path)
    case .s3(let l):
      try c.encode(l, forKey: .s3)
    }
  }

  public var description: String {
    switch self {
    case .localFolder(let p): return "file://\(p)"
    case .s3(let l):
      return
        "\(l.url) at \(l.endpoint ?? "AWS") (region \(l.region), \(l.addressing.rawValue) addressing)"
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
  /// The store's copy of the keys is sealed with another passphrase than this device's.
  case storePassphraseDiffers
  /// The store's copy of the keys changed while the passphrase was being changed.
  case storeKeysChanged
  /// The passphrase changed in the store, but this device's keystore could not be written.
  case devicePassphraseNotChanged(String)

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
    case .storePassphraseDiffers:
      return
        "the store's copy of your keys is sealed with another passphrase than this device's:"
        + " give that one, or your recovery key (--recovery-key-file), or change only this"
        + " device's passphrase (--device-only)"
    case .storeKeysChanged:
      return "the store's copy of your keys changed meanwhile (another device?): try again"
    case .devicePassphraseNotChanged(let m):
      return
        "the new passphrase is set in the store, but this device's keystore could not be"
        + " written (\(m)): run `zdc passwd --device-only` with the old passphrase"
    }
  }
}
