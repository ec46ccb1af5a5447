public import Foundation
public import ZDCCatalog
public import ZDCCore
public import ZDCCrypto
import ZDCLocalStore
import ZDCS3Store

/// How a new device proves it is the user when joining an existing account.
public enum JoinCredential: Sendable {
  /// The account passphrase (opens the sealed keys kept in the store).
  case passphrase(String)
  /// The recovery key printed at `zdc init`.
  case recoveryKey(RecoveryKey)
}

/// An unlocked account on this device: its settings, its keys and its store.
public final class Account: Sendable {
  /// The state directory.
  public let stateDirectory: StateDirectory
  /// Public settings.
  public let config: AccountConfig
  /// The private keys.
  public let keys: PrivateKeyBundle
  /// The store holding the treesystem.
  public let store: any CloudStore
  /// This device's catalog of nodes and pending operations.
  public let catalog: Catalog

  /// The tree's object layout.
  public var layout: CloudLayout { CloudLayout(userID: config.userID, treeID: config.treeID) }

  init(
    stateDirectory: StateDirectory, config: AccountConfig, keys: PrivateKeyBundle,
    store: any CloudStore, catalog: Catalog
  ) {
    self.stateDirectory = stateDirectory
    self.config = config
    self.keys = keys
    self.store = store
    self.catalog = catalog
  }

  /// The default tree ID of the files treesystem.
  public static let defaultTreeID = "zdcfs"

  /// Opens the store at a location (an S3 store with credentials from the environment or
  /// profile). `transfers`: how many uploads will run at once; an S3 store then allows that many
  /// requests at once, and a few more for the downloads and listings beside them.
  public static func makeStore(_ location: StoreLocation, transfers: Int? = nil) throws
    -> any CloudStore
  {
    switch location {
    case .localFolder(let path):
      return try LocalFolderStore(root: URL(fileURLWithPath: path))
    case .s3(let l):
      var configuration = try l.configuration()
      if let transfers {
        configuration.transport.maxConcurrentRequests = max(
          configuration.transport.maxConcurrentRequests, transfers + 2)
      }
      return S3Store(configuration: configuration)
    }
  }

  /// Creates a new user: keys, a recovery key, the sealed keys and public key in the store,
  /// and this device's state directory.
  ///
  /// - Parameters:
  ///   - passphrase: seals the keys (in the store and locally). May be empty.
  ///   - storeKDF: Argon2id cost for the copy in the store (default `.moderate`).
  ///   - localKDF: Argon2id cost for the local keystore (default `.interactive`).
  /// - Returns: the account and its recovery key (shown to the user once).
  public static func create(
    stateDirectory: StateDirectory, store location: StoreLocation, passphrase: String,
    deviceName: String = ProcessInfo.processInfo.hostName, treeID: String = defaultTreeID,
    storeKDF: KDFParameters = .moderate, localKDF: KDFParameters = .interactive
  ) throws -> (Account, RecoveryKey) {
    guard !stateDirectory.isInitialized else {
      throw AccountError.alreadyInitialized(stateDirectory.url.path)
    }
    let store = try makeStore(location)
    let userID = SecureRandom.userID()
    let bundle = PrivateKeyBundle(userID: userID, keyPair: .generate())
    let recovery = try RecoveryKey.generate(userID: userID)
    let pubkey = try PublicKeyDocument(bundle: bundle).encoded()
    let sealedForStore = try Keystore.seal(
      bundle, passphrase: passphrase, recoveryKey: recovery, kdf: storeKDF)
    do {
      _ = try store.put(
        key: CloudLayout.privkeyKey(userID: userID), body: .data(sealedForStore),
        condition: .ifNoneMatch)
      _ = try store.put(
        key: CloudLayout.pubkeyKey(userID: userID), body: .data(pubkey), condition: .ifNoneMatch)
      _ = try store.put(
        key: CloudLayout.userRegistryKey(userID: userID), body: .data(pubkey),
        condition: .ifNoneMatch)
    } catch StoreError.preconditionFailed {
      throw AccountError.userExistsInStore(userID)
    }
    let account = try install(
      stateDirectory: stateDirectory, bundle: bundle, location: location, store: store,
      localPassphrase: passphrase, localKDF: localKDF, deviceName: deviceName, treeID: treeID)
    return (account, recovery)
  }

  /// Adds this device to an existing user found in the store.
  ///
  /// - Parameters:
  ///   - userID: which user, when the store holds several and the credential does not say.
  ///   - localPassphrase: seals the local keystore; defaults to the passphrase used to join
  ///     (required when joining with a recovery key).
  public static func join(
    stateDirectory: StateDirectory, store location: StoreLocation, credential: JoinCredential,
    userID: String? = nil, localPassphrase: String? = nil,
    deviceName: String = ProcessInfo.processInfo.hostName, treeID: String = defaultTreeID,
    localKDF: KDFParameters = .interactive
  ) throws -> Account {
    guard !stateDirectory.isInitialized else {
      throw AccountError.alreadyInitialized(stateDirectory.url.path)
    }
    let store = try makeStore(location)
    let bundle: PrivateKeyBundle
    let sealLocal: String
    switch credential {
    case .recoveryKey(let rk):
      if let u = userID, u != rk.userID { throw AccountError.userNotFound(u) }
      let sealed = try fetch(store, CloudLayout.privkeyKey(userID: rk.userID), user: rk.userID)
      bundle = try Keystore.open(sealed, recoveryKey: rk)
      guard let lp = localPassphrase else {
        throw AccountError.io("a passphrase for this device's keystore is required")
      }
      sealLocal = lp
    case .passphrase(let pass):
      let candidates: [String]
      if let u = userID {
        candidates = [u]
      } else {
        candidates = try store.listAll(prefix: CloudLayout.usersPrefix).map {
          String($0.key.dropFirst(CloudLayout.usersPrefix.count))
        }
      }
      guard !candidates.isEmpty else { throw AccountError.noUserInStore }
      var opened: [PrivateKeyBundle] = []
      for u in candidates {
        let sealed = try fetch(store, CloudLayout.privkeyKey(userID: u), user: u)
        do {
          opened.append(try Keystore.open(sealed, passphrase: pass))
        } catch CryptoError.wrongPassphrase {
          continue
        }
      }
      guard let first = opened.first else { throw CryptoError.wrongPassphrase }
      guard opened.count == 1 else { throw AccountError.ambiguousUser(opened.map(\.userID)) }
      bundle = first
      sealLocal = localPassphrase ?? pass
    }
    let doc = try PublicKeyDocument.decode(
      try fetch(store, CloudLayout.pubkeyKey(userID: bundle.userID), user: bundle.userID))
    guard doc.userID == bundle.userID, doc.boxPublicKey == bundle.keyPair.boxPublicKey,
      doc.signPublicKey == bundle.keyPair.signPublicKey
    else { throw AccountError.inconsistentKeys("public key document does not match the keys") }
    return try install(
      stateDirectory: stateDirectory, bundle: bundle, location: location, store: store,
      localPassphrase: sealLocal, localKDF: localKDF, deviceName: deviceName, treeID: treeID)
  }

  /// Unlocks the account of a state directory (`transfers`: see ``makeStore(_:transfers:)``).
  public static func open(
    stateDirectory: StateDirectory, passphrase: String, transfers: Int? = nil
  ) throws -> Account {
    guard stateDirectory.isInitialized else {
      throw AccountError.notInitialized(stateDirectory.url.path)
    }
    let config = try readConfig(stateDirectory)
    let bundle = try Keystore.open(try readKeystore(stateDirectory), passphrase: passphrase)
    guard bundle.userID == config.userID else {
      throw AccountError.inconsistentKeys("keystore is for another user than config.json")
    }
    return Account(
      stateDirectory: stateDirectory, config: config, keys: bundle,
      store: try makeStore(config.store, transfers: transfers),
      catalog: try openCatalog(stateDirectory, config, bundle))
  }

  /// Which copies of the keys a passphrase change applies to.
  public enum PassphraseScope: Sendable {
    /// The store's copy (which other devices join with) and this device's keystore.
    case storeAndDevice
    /// This device's keystore only.
    case deviceOnly
  }

  /// Changes the passphrase that seals the private keys, proving the right to with
  /// `credential`: this device's passphrase, or the recovery key (which opens the store's copy,
  /// for a forgotten passphrase). The store's copy is changed first, with a conditional write,
  /// keeping its recovery wrap; then this device's keystore is replaced atomically. Devices that
  /// joined earlier keep their own keystores and passphrases.
  public static func changePassphrase(
    stateDirectory: StateDirectory, credential: Keystore.Credential, newPassphrase: String,
    scope: PassphraseScope = .storeAndDevice, storeKDF: KDFParameters? = nil,
    localKDF: KDFParameters? = nil
  ) throws {
    guard stateDirectory.isInitialized else {
      throw AccountError.notInitialized(stateDirectory.url.path)
    }
    let config = try readConfig(stateDirectory)
    let local = try readKeystore(stateDirectory)
    var store: (any CloudStore)?
    var storeCopy: (data: Data, info: ObjectInfo)?
    var byRecoveryKey = false
    if case .recoveryKey = credential { byRecoveryKey = true }
    if scope == .storeAndDevice || byRecoveryKey {
      let s = try makeStore(config.store)
      do {
        storeCopy = try s.getWithInfo(key: CloudLayout.privkeyKey(userID: config.userID))
      } catch StoreError.notFound {
        throw AccountError.userNotFound(config.userID)
      }
      store = s
    }
    // The keys, opened with the credential: from this device's keystore with its passphrase,
    // from the store's copy with the recovery key.
    let bundle: PrivateKeyBundle
    switch credential {
    case .passphrase(let old):
      bundle = try Keystore.open(local, passphrase: old)
    case .recoveryKey(let rk):
      bundle = try Keystore.open(storeCopy!.data, recoveryKey: rk)
    }
    guard bundle.userID == config.userID else {
      throw AccountError.inconsistentKeys("the keys opened are another user's")
    }
    if scope == .storeAndDevice, let store, let storeCopy {
      let rewrapped: Data
      do {
        rewrapped = try Keystore.rewrap(
          storeCopy.data, opening: credential, newPassphrase: newPassphrase, kdf: storeKDF)
      } catch CryptoError.wrongPassphrase {
        throw AccountError.storePassphraseDiffers
      }
      do {
        _ = try store.put(
          key: CloudLayout.privkeyKey(userID: config.userID), body: .data(rewrapped),
          condition: .ifMatch(storeCopy.info.eTag))
      } catch StoreError.preconditionFailed {
        throw AccountError.storeKeysChanged
      }
    }
    let newLocal: Data
    switch credential {
    case .passphrase:
      newLocal = try Keystore.rewrap(
        local, opening: credential, newPassphrase: newPassphrase, kdf: localKDF)
    case .recoveryKey:
      // A device's keystore has no recovery wrap: sealed again from the keys.
      newLocal = try Keystore.seal(
        bundle, passphrase: newPassphrase, recoveryKey: nil, kdf: localKDF ?? .interactive)
    }
    do {
      try stateDirectory.writePrivate(newLocal, to: stateDirectory.keystoreURL)
    } catch {
      if scope == .storeAndDevice { throw AccountError.devicePassphraseNotChanged("\(error)") }
      throw error
    }
  }

  /// This device's sealed keystore.
  private static func readKeystore(_ stateDirectory: StateDirectory) throws -> Data {
    do {
      return try Data(contentsOf: stateDirectory.keystoreURL)
    } catch {
      throw AccountError.io("cannot read \(stateDirectory.keystoreURL.path)")
    }
  }

  /// Reads `config.json` without unlocking anything.
  public static func readConfig(_ stateDirectory: StateDirectory) throws -> AccountConfig {
    do {
      let dec = JSONDecoder()
      dec.dateDecodingStrategy = .iso8601
      return try dec.decode(AccountConfig.self, from: Data(contentsOf: stateDirectory.configURL))
    } catch {
      throw AccountError.io("cannot read \(stateDirectory.configURL.path): \(error)")
    }
  }

  private static func fetch(_ store: any CloudStore, _ key: String, user: String) throws -> Data {
    do {
      return try store.get(key: key)
    } catch StoreError.notFound {
      throw AccountError.userNotFound(user)
    }
  }

  private static func install(
    stateDirectory: StateDirectory, bundle: PrivateKeyBundle, location: StoreLocation,
    store: any CloudStore, localPassphrase: String, localKDF: KDFParameters, deviceName: String,
    treeID: String
  ) throws -> Account {
    try stateDirectory.create()
    try stateDirectory.writePrivate(
      try Keystore.seal(bundle, passphrase: localPassphrase, recoveryKey: nil, kdf: localKDF),
      to: stateDirectory.keystoreURL)
    let config = AccountConfig(
      userID: bundle.userID, treeID: treeID,
      deviceID: ZBase32.encode(SecureRandom.bytes(10)), deviceName: deviceName, store: location,
      createdAt: Date())
    let enc = JSONEncoder()
    enc.outputFormatting = [.sortedKeys, .prettyPrinted]
    enc.dateEncodingStrategy = .iso8601
    let catalog = try openCatalog(stateDirectory, config, bundle)
    try stateDirectory.writePrivate(try enc.encode(config), to: stateDirectory.configURL)
    return Account(
      stateDirectory: stateDirectory, config: config, keys: bundle, store: store, catalog: catalog)
  }

  /// Opens (creating if needed) the catalog, with the user and its trunks in it.
  private static func openCatalog(
    _ stateDirectory: StateDirectory, _ config: AccountConfig, _ bundle: PrivateKeyBundle
  ) throws -> Catalog {
    // Commits survive a crash of the daemon; `fsync(2)` through the mount makes them durable
    // against power loss too (`Catalog.makeDurable`).
    // Node keys, extended attributes, sections and journal records are sealed at rest with a
    // key only the unlocked private key gives.
    let fieldKey = try KeyDerivation.key(for: .catalog, secret: bundle.keyPair.boxSecretKey)
    let catalog = try Catalog(
      path: stateDirectory.catalogURL.path,
      options: Catalog.Options(durability: .normal, fieldKey: fieldKey))
    if try catalog.localUser(id: config.userID) == nil {
      _ = try catalog.createLocalUser(
        LocalUser(
          id: config.userID, treeID: config.treeID, boxPublicKey: bundle.keyPair.boxPublicKey,
          signPublicKey: bundle.keyPair.signPublicKey))
    }
    return catalog
  }
}
