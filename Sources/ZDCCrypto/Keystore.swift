import CSodium
public import Foundation

/// Argon2id cost parameters for deriving a key from a passphrase.
public struct KDFParameters: Sendable, Hashable, Codable {
  /// Number of passes (libsodium `opslimit`).
  public var opsLimit: UInt64
  /// Memory in bytes (libsodium `memlimit`).
  public var memLimit: UInt64

  public init(opsLimit: UInt64, memLimit: UInt64) {
    self.opsLimit = opsLimit
    self.memLimit = memLimit
  }

  /// libsodium's INTERACTIVE limits (2 passes, 64 MiB): the local keystore, unlocked at each mount.
  public static var interactive: KDFParameters {
    KDFParameters(
      opsLimit: UInt64(crypto_pwhash_opslimit_interactive()),
      memLimit: UInt64(crypto_pwhash_memlimit_interactive()))
  }

  /// libsodium's MODERATE limits (3 passes, 256 MiB): the copy kept in the store, which the
  /// store's operator could attack offline.
  public static var moderate: KDFParameters {
    KDFParameters(
      opsLimit: UInt64(crypto_pwhash_opslimit_moderate()),
      memLimit: UInt64(crypto_pwhash_memlimit_moderate()))
  }

  /// The weakest parameters libsodium allows; only for tests.
  public static var minimum: KDFParameters {
    KDFParameters(
      opsLimit: UInt64(crypto_pwhash_opslimit_min()),
      memLimit: UInt64(crypto_pwhash_memlimit_min()))
  }
}

/// The secret half of an account: the user's identity and private keys.
public struct PrivateKeyBundle: Sendable, Hashable, Codable {
  /// The user's ID.
  public var userID: String
  /// The user's key pairs.
  public var keyPair: UserKeyPair

  public init(userID: String, keyPair: UserKeyPair) {
    self.userID = userID
    self.keyPair = keyPair
  }
}

/// A printable key that opens a keystore without the passphrase.
///
/// Text form: zBase32 of (userID's 20 bytes ‖ 32 secret bytes), 84 characters in groups of four
/// joined by `-`. It names the user, so `zdc init --join` needs nothing else.
public struct RecoveryKey: Sendable, Hashable, CustomStringConvertible {
  /// The user it belongs to.
  public let userID: String
  /// 32 secret bytes.
  public let secret: Data

  /// A new random recovery key for a user (whose ID must be zBase32 of 20 bytes).
  public static func generate(userID: String) throws -> RecoveryKey {
    guard let raw = ZBase32.decode(userID), raw.count == 20 else {
      throw CryptoError.invalidKey("userID is not 20 bytes of zBase32")
    }
    return RecoveryKey(userID: userID, secret: SecureRandom.bytes(32))
  }

  /// Parses the text form; spaces, dashes and case are ignored.
  public init(text: String) throws {
    let compact = text.lowercased().filter { !$0.isWhitespace && $0 != "-" }
    guard let raw = ZBase32.decode(compact), raw.count == 52 else {
      throw CryptoError.malformed("not a recovery key")
    }
    userID = ZBase32.encode(raw.prefix(20))
    secret = Data(raw.suffix(32))
  }

  private init(userID: String, secret: Data) {
    self.userID = userID
    self.secret = secret
  }

  /// The text form, in groups of four.
  public var description: String {
    let raw = (ZBase32.decode(userID) ?? Data()) + secret
    let s = Array(ZBase32.encode(raw))
    return stride(from: 0, to: s.count, by: 4).map { String(s[$0..<min($0 + 4, s.count)]) }
      .joined(separator: "-")
  }
}

/// A file that holds a `PrivateKeyBundle` sealed under a passphrase and, optionally, a
/// recovery key (format `zdc-keystore` version 1; see the on-store format document).
///
/// A random 32-byte data key encrypts the bundle with XChaCha20-Poly1305; the data key is
/// wrapped once under an Argon2id key derived from the passphrase and once under the recovery
/// key's secret. Changing the passphrase rewraps the data key only.
public enum Keystore {
  static let formatName = "zdc-keystore"
  static let version = 1

  struct Wrapped: Codable {
    var nonce: Data
    var ciphertext: Data
  }

  struct KDF: Codable {
    var alg: String
    var opsLimit: UInt64
    var memLimit: UInt64
    var salt: Data
  }

  struct File: Codable {
    var format: String
    var version: Int
    var userID: String
    var kdf: KDF
    var passphraseWrap: Wrapped
    var recoveryWrap: Wrapped?
    var bundle: Wrapped
  }

  /// Seals a bundle. An empty passphrase is allowed (the caller warns): the file is then only
  /// as safe as the place it is kept.
  public static func seal(
    _ bundle: PrivateKeyBundle, passphrase: String, recoveryKey: RecoveryKey?,
    kdf: KDFParameters
  ) throws -> Data {
    if let r = recoveryKey, r.userID != bundle.userID {
      throw CryptoError.invalidKey("recovery key belongs to another user")
    }
    let dataKey = SecureRandom.bytes(32)
    let salt = SecureRandom.bytes(Int(crypto_pwhash_SALTBYTES))
    let passKey = try derive(passphrase: passphrase, salt: salt, kdf: kdf)
    let body = try JSONEncoder().encode(bundle)
    let file = File(
      format: formatName, version: version, userID: bundle.userID,
      kdf: KDF(alg: "argon2id13", opsLimit: kdf.opsLimit, memLimit: kdf.memLimit, salt: salt),
      passphraseWrap: try wrap(dataKey, key: passKey, ad: ad("passphrase", bundle.userID)),
      recoveryWrap: try recoveryKey.map {
        try wrap(dataKey, key: $0.secret, ad: ad("recovery", bundle.userID))
      },
      bundle: try wrap(body, key: dataKey, ad: ad("bundle", bundle.userID)))
    let enc = JSONEncoder()
    enc.outputFormatting = [.sortedKeys, .prettyPrinted]
    return try enc.encode(file)
  }

  /// The userID a sealed keystore belongs to (readable without a secret).
  public static func userID(of sealed: Data) throws -> String {
    try parse(sealed).userID
  }

  /// Opens a keystore with its passphrase. Throws `CryptoError.wrongPassphrase` if it is wrong.
  public static func open(_ sealed: Data, passphrase: String) throws -> PrivateKeyBundle {
    let file = try parse(sealed)
    return try openBundle(file, dataKey: try openDataKey(file, passphrase: passphrase))
  }

  /// A secret that opens a keystore.
  public enum Credential: Sendable {
    case passphrase(String)
    case recoveryKey(RecoveryKey)
  }

  /// The keystore `sealed` with its passphrase changed to `newPassphrase`: the data key is opened
  /// with `credential` and wrapped again under an Argon2id key from a fresh salt (with `kdf`, else
  /// the file's own cost); the recovery wrap and the sealed bundle are kept as they are. Throws
  /// `CryptoError.wrongPassphrase` if `credential` does not open it.
  public static func rewrap(
    _ sealed: Data, opening credential: Credential, newPassphrase: String,
    kdf: KDFParameters? = nil
  ) throws -> Data {
    var file = try parse(sealed)
    let dataKey: Data
    switch credential {
    case .passphrase(let old):
      dataKey = try openDataKey(file, passphrase: old)
    case .recoveryKey(let rk):
      dataKey = try openDataKey(file, recoveryKey: rk)
    }
    // The bundle must open with it, or the file is not what it claims.
    _ = try openBundle(file, dataKey: dataKey)
    let cost = kdf ?? KDFParameters(opsLimit: file.kdf.opsLimit, memLimit: file.kdf.memLimit)
    let salt = SecureRandom.bytes(Int(crypto_pwhash_SALTBYTES))
    let passKey = try derive(passphrase: newPassphrase, salt: salt, kdf: cost)
    file.kdf = KDF(alg: "argon2id13", opsLimit: cost.opsLimit, memLimit: cost.memLimit, salt: salt)
    file.passphraseWrap = try wrap(dataKey, key: passKey, ad: ad("passphrase", file.userID))
    let enc = JSONEncoder()
    enc.outputFormatting = [.sortedKeys, .prettyPrinted]
    return try enc.encode(file)
  }

  /// Opens a keystore with whichever secret `credential` is.
  public static func open(_ sealed: Data, with credential: Credential) throws -> PrivateKeyBundle {
    switch credential {
    case .passphrase(let p): return try open(sealed, passphrase: p)
    case .recoveryKey(let rk): return try open(sealed, recoveryKey: rk)
    }
  }

  /// True when the keystore holds a recovery wrap (the store's copy does; a device's does not).
  public static func hasRecoveryWrap(_ sealed: Data) throws -> Bool {
    try parse(sealed).recoveryWrap != nil
  }

  private static func openDataKey(_ file: File, passphrase: String) throws -> Data {
    guard file.kdf.alg == "argon2id13" else {
      throw CryptoError.malformed("unknown KDF \(file.kdf.alg)")
    }
    let kdf = KDFParameters(opsLimit: file.kdf.opsLimit, memLimit: file.kdf.memLimit)
    let passKey = try derive(passphrase: passphrase, salt: file.kdf.salt, kdf: kdf)
    guard
      let dataKey = try? unwrap(
        file.passphraseWrap, key: passKey, ad: ad("passphrase", file.userID))
    else { throw CryptoError.wrongPassphrase }
    return dataKey
  }

  private static func openDataKey(_ file: File, recoveryKey: RecoveryKey) throws -> Data {
    guard let wrapped = file.recoveryWrap else {
      throw CryptoError.malformed("keystore has no recovery key")
    }
    guard recoveryKey.userID == file.userID,
      let dataKey = try? unwrap(wrapped, key: recoveryKey.secret, ad: ad("recovery", file.userID))
    else { throw CryptoError.wrongPassphrase }
    return dataKey
  }

  /// Opens a keystore with a recovery key.
  public static func open(_ sealed: Data, recoveryKey: RecoveryKey) throws -> PrivateKeyBundle {
    let file = try parse(sealed)
    return try openBundle(file, dataKey: try openDataKey(file, recoveryKey: recoveryKey))
  }

  private static func openBundle(_ file: File, dataKey: Data) throws -> PrivateKeyBundle {
    let body = try unwrap(file.bundle, key: dataKey, ad: ad("bundle", file.userID))
    let bundle: PrivateKeyBundle
    do {
      bundle = try JSONDecoder().decode(PrivateKeyBundle.self, from: body)
    } catch {
      throw CryptoError.malformed("keystore bundle: \(error)")
    }
    guard bundle.userID == file.userID else {
      throw CryptoError.malformed("keystore bundle is for another user")
    }
    return bundle
  }

  private static func parse(_ sealed: Data) throws -> File {
    let file: File
    do {
      file = try JSONDecoder().decode(File.self, from: sealed)
    } catch {
      throw CryptoError.malformed("not a keystore file")
    }
    guard file.format == formatName else { throw CryptoError.malformed("not a keystore file") }
    guard file.version == version else { throw CryptoError.unsupportedVersion(file.version) }
    return file
  }

  private static func ad(_ purpose: String, _ userID: String) -> Data {
    Data("zdc.keystore.v1|\(purpose)|\(userID)".utf8)
  }

  static func derive(passphrase: String, salt: Data, kdf: KDFParameters) throws -> Data {
    Sodium.ensure()
    guard salt.count == Int(crypto_pwhash_SALTBYTES) else {
      throw CryptoError.malformed("bad KDF salt")
    }
    guard kdf.opsLimit >= UInt64(crypto_pwhash_opslimit_min()),
      kdf.memLimit >= UInt64(crypto_pwhash_memlimit_min()),
      kdf.opsLimit <= 64, kdf.memLimit <= 8 << 30
    else { throw CryptoError.malformed("KDF parameters out of range") }
    var key = [UInt8](repeating: 0, count: 32)
    let pw = Array(passphrase.utf8).map { CChar(bitPattern: $0) }
    let saltBytes = [UInt8](salt)
    let rc = crypto_pwhash(
      &key, 32, pw, UInt64(pw.count), saltBytes, kdf.opsLimit, Int(kdf.memLimit),
      crypto_pwhash_ALG_ARGON2ID13)
    guard rc == 0 else { throw CryptoError.failed("crypto_pwhash (out of memory?)") }
    return Data(key)
  }

  private static func wrap(_ plaintext: Data, key: Data, ad: Data) throws -> Wrapped {
    let nonce = SecureRandom.bytes(24)
    return Wrapped(
      nonce: nonce, ciphertext: try AEAD.seal(plaintext, nonce: nonce, associatedData: ad, key: key)
    )
  }

  private static func unwrap(_ w: Wrapped, key: Data, ad: Data) throws -> Data {
    try AEAD.open(w.ciphertext, nonce: w.nonce, associatedData: ad, key: key)
  }
}

/// The public half of an account, stored at `{userID}/pubkey`: self-signed with Ed25519.
public struct PublicKeyDocument: Sendable, Hashable, Codable {
  /// Format version (1).
  public var version: Int
  /// The user's ID.
  public var userID: String
  /// X25519 public key that node keys are sealed to.
  public var boxPublicKey: Data
  /// Ed25519 public key that signs this document.
  public var signPublicKey: Data
  /// Ed25519 signature of the other fields (sorted-keys JSON without `signature`).
  public var signature: Data

  struct Signed: Codable {
    var version: Int
    var userID: String
    var boxPublicKey: Data
    var signPublicKey: Data
  }

  /// Makes and signs the document for a key bundle.
  public init(bundle: PrivateKeyBundle) throws {
    version = 1
    userID = bundle.userID
    boxPublicKey = bundle.keyPair.boxPublicKey
    signPublicKey = bundle.keyPair.signPublicKey
    signature = Data()
    signature = bundle.keyPair.sign(try signedBytes())
  }

  func signedBytes() throws -> Data {
    let enc = JSONEncoder()
    enc.outputFormatting = [.sortedKeys]
    return try enc.encode(
      Signed(
        version: version, userID: userID, boxPublicKey: boxPublicKey, signPublicKey: signPublicKey))
  }

  /// Encodes as JSON.
  public func encoded() throws -> Data {
    let enc = JSONEncoder()
    enc.outputFormatting = [.sortedKeys, .prettyPrinted]
    return try enc.encode(self)
  }

  /// Decodes and verifies the self-signature.
  public static func decode(_ data: Data) throws -> PublicKeyDocument {
    let doc: PublicKeyDocument
    do {
      doc = try JSONDecoder().decode(PublicKeyDocument.self, from: data)
    } catch {
      throw CryptoError.malformed("public key document")
    }
    guard doc.version == 1 else { throw CryptoError.unsupportedVersion(doc.version) }
    guard
      UserKeyPair.verify(
        signature: doc.signature, message: try doc.signedBytes(), publicKey: doc.signPublicKey)
    else { throw CryptoError.authenticationFailed("public key document signature") }
    return doc
  }
}
