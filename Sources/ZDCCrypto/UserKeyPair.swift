import CSodium
public import Foundation

/// A user's key pairs: X25519 for sealing node keys to the user, Ed25519 for signing.
public struct UserKeyPair: Sendable, Hashable, Codable {
  /// X25519 public key (32 bytes).
  public let boxPublicKey: Data
  /// X25519 secret key (32 bytes).
  public let boxSecretKey: Data
  /// Ed25519 public key (32 bytes).
  public let signPublicKey: Data
  /// Ed25519 secret key (64 bytes, libsodium's seed‖public form).
  public let signSecretKey: Data

  /// Validates sizes; throws `CryptoError.invalidKey` otherwise.
  public init(boxPublicKey: Data, boxSecretKey: Data, signPublicKey: Data, signSecretKey: Data)
    throws
  {
    guard boxPublicKey.count == Int(crypto_box_PUBLICKEYBYTES),
      boxSecretKey.count == Int(crypto_box_SECRETKEYBYTES),
      signPublicKey.count == Int(crypto_sign_PUBLICKEYBYTES),
      signSecretKey.count == Int(crypto_sign_SECRETKEYBYTES)
    else { throw CryptoError.invalidKey("user key pair has wrong sizes") }
    self.boxPublicKey = boxPublicKey
    self.boxSecretKey = boxSecretKey
    self.signPublicKey = signPublicKey
    self.signSecretKey = signSecretKey
  }

  /// New random key pairs.
  public static func generate() -> UserKeyPair {
    Sodium.ensure()
    var bpk = [UInt8](repeating: 0, count: Int(crypto_box_PUBLICKEYBYTES))
    var bsk = [UInt8](repeating: 0, count: Int(crypto_box_SECRETKEYBYTES))
    var spk = [UInt8](repeating: 0, count: Int(crypto_sign_PUBLICKEYBYTES))
    var ssk = [UInt8](repeating: 0, count: Int(crypto_sign_SECRETKEYBYTES))
    crypto_box_keypair(&bpk, &bsk)
    crypto_sign_keypair(&spk, &ssk)
    return try! UserKeyPair(
      boxPublicKey: Data(bpk), boxSecretKey: Data(bsk), signPublicKey: Data(spk),
      signSecretKey: Data(ssk))
  }

  /// Key pairs derived from a 32-byte seed (deterministic; for test vectors).
  public static func fromSeed(_ seed: Data) throws -> UserKeyPair {
    Sodium.ensure()
    guard seed.count == 32 else { throw CryptoError.invalidKey("seed must be 32 bytes") }
    var bpk = [UInt8](repeating: 0, count: Int(crypto_box_PUBLICKEYBYTES))
    var bsk = [UInt8](repeating: 0, count: Int(crypto_box_SECRETKEYBYTES))
    var spk = [UInt8](repeating: 0, count: Int(crypto_sign_PUBLICKEYBYTES))
    var ssk = [UInt8](repeating: 0, count: Int(crypto_sign_SECRETKEYBYTES))
    let s = [UInt8](seed)
    crypto_box_seed_keypair(&bpk, &bsk, s)
    crypto_sign_seed_keypair(&spk, &ssk, s)
    return try UserKeyPair(
      boxPublicKey: Data(bpk), boxSecretKey: Data(bsk), signPublicKey: Data(spk),
      signSecretKey: Data(ssk))
  }

  /// Seals a secret (e.g. a node key) so that only the holder of `publicKey` can open it
  /// (`crypto_box_seal`: anonymous sender, 48 bytes of overhead).
  public static func seal(_ secret: Data, to publicKey: Data) throws -> Data {
    Sodium.ensure()
    guard publicKey.count == Int(crypto_box_PUBLICKEYBYTES) else {
      throw CryptoError.invalidKey("X25519 public key must be 32 bytes")
    }
    var out = [UInt8](repeating: 0, count: secret.count + crypto_box_sealbytes())
    let m = [UInt8](secret)
    let pk = [UInt8](publicKey)
    guard crypto_box_seal(&out, m, UInt64(m.count), pk) == 0 else {
      throw CryptoError.failed("crypto_box_seal")
    }
    return Data(out)
  }

  /// Opens a secret sealed to this key pair.
  public func open(sealed: Data) throws -> Data {
    Sodium.ensure()
    guard sealed.count >= crypto_box_sealbytes() else {
      throw CryptoError.malformed("sealed box too short")
    }
    var out = [UInt8](repeating: 0, count: sealed.count - crypto_box_sealbytes())
    let c = [UInt8](sealed)
    guard
      crypto_box_seal_open(&out, c, UInt64(c.count), [UInt8](boxPublicKey), [UInt8](boxSecretKey))
        == 0
    else { throw CryptoError.authenticationFailed("sealed key does not open with this key pair") }
    return Data(out)
  }

  /// A detached Ed25519 signature of `message`.
  public func sign(_ message: Data) -> Data {
    Sodium.ensure()
    var sig = [UInt8](repeating: 0, count: Int(crypto_sign_BYTES))
    let m = [UInt8](message)
    crypto_sign_detached(&sig, nil, m, UInt64(m.count), [UInt8](signSecretKey))
    return Data(sig)
  }

  /// True when `signature` is a valid Ed25519 signature of `message` by `publicKey`.
  public static func verify(signature: Data, message: Data, publicKey: Data) -> Bool {
    Sodium.ensure()
    guard signature.count == Int(crypto_sign_BYTES),
      publicKey.count == Int(crypto_sign_PUBLICKEYBYTES)
    else { return false }
    let m = [UInt8](message)
    return crypto_sign_verify_detached([UInt8](signature), m, UInt64(m.count), [UInt8](publicKey))
      == 0
  }
}
