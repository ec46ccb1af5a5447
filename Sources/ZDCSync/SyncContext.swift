import CSodium
public import Foundation
import Logging
import ZDCCatalog
import ZDCCore
public import ZDCCrypto

/// Who this device is and what it syncs: shared by the push and pull managers.
public struct SyncAccount: Sendable {
  /// The local user.
  public var userID: String
  /// The user's key pairs (the same on every device of the user).
  public var keys: UserKeyPair
  /// This device's identifier (appears in change-log keys; letters, digits, `_`).
  public var deviceID: String
  /// A human-readable device name (appears in conflicted-copy names).
  public var deviceName: String

  public init(userID: String, keys: UserKeyPair, deviceID: String, deviceName: String) {
    self.userID = userID
    self.keys = keys
    self.deviceID = deviceID
    self.deviceName = deviceName
  }
}

/// Everything the managers share.
final class SyncContext: Sendable {
  let catalog: Catalog
  let store: any CloudStore
  let account: SyncAccount
  let layout: CloudLayout
  let changeLogKey: Data
  let delegate: any SyncDelegate
  let progress: ProgressTracker
  let logger: Logger

  var userID: String { account.userID }

  init(
    catalog: Catalog, store: any CloudStore, account: SyncAccount, delegate: any SyncDelegate,
    progress: ProgressTracker, label: String
  ) throws {
    self.catalog = catalog
    self.store = store
    self.account = account
    guard let user = try catalog.localUser(id: account.userID) else {
      throw CatalogError.userNotFound(account.userID)
    }
    layout = user.layout
    changeLogKey = try KeyDerivation.key(for: .changeLog, secret: account.keys.boxSecretKey)
    self.delegate = delegate
    self.progress = progress
    var logger = Logger(label: "zdc.sync.\(label)")
    logger[metadataKey: "device"] = "\(account.deviceID)"
    self.logger = logger
    try TrunkSalts.ensure(catalog: catalog, userID: account.userID, keys: account.keys)
  }

  var publicKeys: [String: Data] { [account.userID: account.keys.boxPublicKey] }

  /// Fetches and opens the RCRD at `key`: `nil` when there is none; `decoded` is `nil` when it
  /// cannot be opened (malformed, tampered, not ours).
  func fetchRcrd(_ key: String) throws -> (info: ObjectInfo, data: Data, decoded: DecodedRcrd?)? {
    let data: Data
    let info: ObjectInfo
    do {
      (data, info) = try store.getWithInfo(key: key)
    } catch StoreError.notFound {
      return nil
    }
    do {
      let d = try Rcrd.decode(data, userID: account.userID, keyPair: account.keys)
      return (info, data, d)
    } catch {
      logger.error("undecodable RCRD skipped", metadata: ["key": "\(key)", "error": "\(error)"])
      return (info, data, nil)
    }
  }

  /// HEAD that maps 404 to `nil`.
  func headIfExists(_ key: String) throws -> ObjectInfo? {
    do { return try store.head(key: key) } catch StoreError.notFound { return nil }
  }
}

/// The trunks' dirSalts, derived from the user's secret so every device of the user computes
/// the same cloudNames for the trunks' children (and two devices creating one name collide on
/// one key).
enum TrunkSalts {
  static func salt(for trunk: Trunk, secret: Data) throws -> Data {
    Sodium.ensureInitialized()
    let message = Array("zdc.subkey.v1|trunk-dirsalt|\(trunk.rawValue)".utf8)
    var out = [UInt8](repeating: 0, count: 20)
    let key = [UInt8](secret)
    guard crypto_generichash(&out, 20, message, UInt64(message.count), key, key.count) == 0 else {
      throw CryptoError.failed("crypto_generichash")
    }
    return Data(out)
  }

  static func ensure(catalog: Catalog, userID: String, keys: UserKeyPair) throws {
    var salts: [Trunk: Data] = [:]
    for t in Trunk.allCases { salts[t] = try salt(for: t, secret: keys.boxSecretKey) }
    let needed = try catalog.read(userID) { tx in
      try Trunk.allCases.contains { try tx.trunkNode($0)?.dirSalt != salts[$0] }
    }
    guard needed else { return }
    try catalog.write(userID) { tx in
      for t in Trunk.allCases { try tx.setTrunkDirSalt(t, dirSalt: salts[t]!) }
    }
  }
}

enum Sodium {
  static func ensureInitialized() { _ = sodiumInit }
  private static let sodiumInit: Int32 = sodium_init()
}

/// Names for the versions a conflict keeps.
public enum ConflictNames {
  /// Splits `name` into base and extension (`"a.txt"` → `("a", ".txt")`; no extension for
  /// `".profile"` or `"a."`).
  public static func split(_ name: String) -> (base: String, ext: String) {
    guard let dot = name.lastIndex(of: "."), dot != name.startIndex,
      name.index(after: dot) != name.endIndex
    else { return (name, "") }
    return (String(name[..<dot]), String(name[dot...]))
  }

  /// `name (conflicted copy YYYY-MM-DD HHMMSS device).ext`, in UTC.
  public static func conflictedCopy(of name: String, date: Date, deviceName: String) -> String {
    let u = Digits.utc(date)
    let stamp = "\(u.year)-\(u.month)-\(u.day) \(u.hour)\(u.minute)\(u.second)"
    let (base, ext) = split(name)
    return "\(base) (conflicted copy \(stamp) \(deviceName))\(ext)"
  }

  /// `name n.ext`.
  public static func numbered(_ name: String, _ n: Int) -> String {
    let (base, ext) = split(name)
    return "\(base) \(n)\(ext)"
  }
}

extension CloudTransaction {
  /// `base`, or the first of `base 2`, `base 3` … that no child of `parentID` other than
  /// `except` has.
  func freeChildName(_ base: String, in parentID: NodeID, except: NodeID? = nil) throws
    -> String
  {
    var name = base
    var n = 2
    while let other = try child(of: parentID, named: name), other.id != except {
      name = ConflictNames.numbered(base, n)
      n += 1
    }
    return name
  }
}
