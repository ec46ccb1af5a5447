public import Foundation
public import ZDCCore

/// The encrypted part of a node record: everything about a node the store must not see.
public struct RcrdMeta: Sendable, Hashable {
  /// The cleartext name.
  public var name: String
  /// Random bytes keying the cloudNames of the node's children.
  public var dirSalt: Data
  /// How the node presents.
  public var kind: NodeKind
  /// POSIX permission bits.
  public var mode: UInt32
  /// Content modification time.
  public var mtime: FileTime
  /// User extended attributes by full name.
  public var xattrs: [String: Data]
  /// For a symlink, its target.
  public var symlinkTarget: String?
  /// Plaintext size of the data section.
  public var dataSize: UInt64
  /// True for a claim: a fresh copy of the node's record put over it by a device whose move of
  /// the node is committing (it deletes the record next). Absent from ordinary records.
  public var moving: Bool
  /// True for the record a move puts at its target before it commits (rewritten without the
  /// mark once committed). Absent from ordinary records.
  public var arriving: Bool

  public init(
    name: String, dirSalt: Data, kind: NodeKind, mode: UInt32, mtime: FileTime,
    xattrs: [String: Data] = [:], symlinkTarget: String? = nil, dataSize: UInt64 = 0,
    moving: Bool = false, arriving: Bool = false
  ) {
    self.arriving = arriving
    self.name = name
    self.dirSalt = dirSalt
    self.kind = kind
    self.mode = mode
    self.mtime = mtime
    self.xattrs = xattrs
    self.symlinkTarget = symlinkTarget
    self.dataSize = dataSize
    self.moving = moving
  }

  /// The meta of a node.
  public init(node: Node) {
    self.init(
      name: node.name, dirSalt: node.dirSalt, kind: node.kind, mode: node.mode, mtime: node.mtime,
      xattrs: node.xattrs, symlinkTarget: node.symlinkTarget, dataSize: node.dataSize)
  }
}

/// A node record as read back from the store, opened with one user's key pair.
public struct DecodedRcrd: Sendable, Hashable {
  /// The node's immutable identity.
  public var cloudID: String
  /// Where the node's children live.
  public var dirPrefix: String
  /// Who may do what, with each reader's wrapped node key.
  public var shareList: ShareList
  /// The node key (32 bytes).
  public var nodeKey: Data
  /// The decrypted metadata.
  public var meta: RcrdMeta
  /// When the server should delete the node.
  public var burnDate: Date?
}

/// Why an RCRD cannot be opened by a particular user (beyond `CryptoError`).
public enum RcrdError: Error, Sendable, Equatable, CustomStringConvertible {
  /// The user has no entry in the record's `keys`.
  case userNotInKeys(userID: String)
  /// The user has an entry but no wrapped key (no read permission).
  case noKeyForUser(userID: String)
  /// A reader in the share list has no public key to wrap the node key to.
  case missingPublicKey(userID: String)

  public var description: String {
    switch self {
    case .userNotInKeys(let u): return "user \(u) is not in the node record's keys"
    case .noKeyForUser(let u): return "user \(u) has no key in the node record (no read access)"
    case .missingPublicKey(let u): return "no public key to share the node with user \(u)"
    }
  }
}

/// The RCRD object (node record), format version 1: a JSON document with the share list, the
/// node key wrapped to each reader, the children's dirPrefix and the encrypted metadata.
public enum Rcrd {
  /// The format version written and understood.
  public static let version = 1

  /// Associated data of the `meta` ciphertext.
  static func metaAD(cloudID: String) -> Data { Data("zdc.rcrd.meta.v1|\(cloudID)".utf8) }

  // Wire forms.
  struct Wire: Codable {
    var version: Int
    var cloudID: String
    var keys: [String: KeyEntry]
    var children: [String: Child]
    var meta: String
    var burnDate: Int64?
  }
  struct KeyEntry: Codable {
    var perms: String
    var key: String?
  }
  struct Child: Codable {
    var prefix: String
  }
  struct MetaWire: Codable {
    var name: String
    var dirSalt: String
    var kind: String
    var mode: UInt32
    var mtime: Time
    var xattrs: [String: String]
    var symlinkTarget: String?
    var dataSize: UInt64
    var moving: Bool?
    var arriving: Bool?
  }
  struct Time: Codable {
    var s: Int64
    var ns: Int32
  }
  struct VersionProbe: Decodable {
    var version: Int
  }

  static func encoder() -> JSONEncoder {
    let e = JSONEncoder()
    e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return e
  }

  /// Encodes a node's record, wrapping its key to every user in its share list with read
  /// permission; `publicKeys` maps those userIDs to X25519 public keys. With `moving` or
  /// `arriving`, the record carries that mark (see ``RcrdMeta/moving``, ``RcrdMeta/arriving``).
  public static func encode(
    node: Node, publicKeys: [String: Data], moving: Bool = false, arriving: Bool = false
  ) throws -> Data {
    try encode(
      node: node, publicKeys: publicKeys, metaNonce: SecureRandom.bytes(AEAD.nonceSize),
      moving: moving, arriving: arriving)
  }

  static func encode(
    node: Node, publicKeys: [String: Data], metaNonce: Data, moving: Bool = false,
    arriving: Bool = false
  ) throws -> Data {
    guard node.encryptionKey.count == AEAD.keySize else {
      throw CryptoError.invalidKey("node key must be 32 bytes")
    }
    guard !node.cloudID.isEmpty, !node.dirPrefix.isEmpty, !node.dirPrefix.contains("/") else {
      throw CryptoError.malformed("node has no cloudID or an invalid dirPrefix")
    }
    var keys: [String: KeyEntry] = [:]
    for (principal, item) in node.shareList.items {
      var entry = KeyEntry(perms: item.permissions.description, key: nil)
      if item.permissions.contains(.read), case .user(let userID) = principal {
        guard let pk = publicKeys[userID] else { throw RcrdError.missingPublicKey(userID: userID) }
        entry.key = try WrappedKeyMemo.shared.seal(node.encryptionKey, to: pk).base64EncodedString()
      }
      keys[principal.key] = entry
    }
    let m = RcrdMeta(node: node)
    let metaWire = MetaWire(
      name: m.name, dirSalt: m.dirSalt.base64EncodedString(), kind: m.kind.rawValue, mode: m.mode,
      mtime: Time(s: m.mtime.seconds, ns: m.mtime.nanoseconds),
      xattrs: m.xattrs.mapValues { $0.base64EncodedString() }, symlinkTarget: m.symlinkTarget,
      dataSize: m.dataSize, moving: moving ? true : nil, arriving: arriving ? true : nil)
    let plain = try encoder().encode(metaWire)
    let sealed = try AEAD.seal(
      plain, nonce: metaNonce, associatedData: metaAD(cloudID: node.cloudID),
      key: node.encryptionKey)
    let wire = Wire(
      version: version, cloudID: node.cloudID, keys: keys,
      children: ["": Child(prefix: node.dirPrefix)],
      meta: (metaNonce + sealed).base64EncodedString(),
      burnDate: node.burnDate.map { Int64($0.timeIntervalSince1970.rounded(.down)) })
    return try encoder().encode(wire)
  }

  /// Decodes and opens a record as `userID`, unwrapping the node key with `keyPair`.
  public static func decode(_ data: Data, userID: String, keyPair: UserKeyPair) throws
    -> DecodedRcrd
  {
    let decoder = JSONDecoder()
    let probe: VersionProbe
    do {
      probe = try decoder.decode(VersionProbe.self, from: data)
    } catch {
      throw CryptoError.malformed("RCRD is not a JSON object with a version")
    }
    guard probe.version == version else { throw CryptoError.unsupportedVersion(probe.version) }
    let wire: Wire
    do {
      wire = try decoder.decode(Wire.self, from: data)
    } catch {
      throw CryptoError.malformed("RCRD JSON: \(error)")
    }
    guard !wire.cloudID.isEmpty else { throw CryptoError.malformed("RCRD cloudID is empty") }
    guard wire.children.count == 1, let prefix = wire.children[""]?.prefix, !prefix.isEmpty,
      !prefix.contains("/")
    else { throw CryptoError.malformed("RCRD children") }

    var shareList = ShareList()
    for (k, entry) in wire.keys {
      guard let principal = SharePrincipal(key: k) else {
        throw CryptoError.malformed("RCRD keys: bad principal \(k.debugDescription)")
      }
      let perms: Permissions
      do { perms = try Permissions(string: entry.perms) } catch {
        throw CryptoError.malformed("RCRD keys: bad perms \(entry.perms.debugDescription)")
      }
      var wrapped: Data? = nil
      if let key = entry.key {
        guard let d = Data(base64Encoded: key) else {
          throw CryptoError.malformed("RCRD keys: bad base64 for \(k)")
        }
        wrapped = d
      }
      shareList.set(ShareItem(permissions: perms, wrappedKey: wrapped), for: principal)
    }
    guard let mine = shareList[.user(userID)] else { throw RcrdError.userNotInKeys(userID: userID) }
    guard let wrapped = mine.wrappedKey else { throw RcrdError.noKeyForUser(userID: userID) }
    let nodeKey = try WrappedKeyMemo.shared.open(wrapped, with: keyPair)
    guard nodeKey.count == AEAD.keySize else { throw CryptoError.malformed("RCRD node key size") }

    guard let blob = Data(base64Encoded: wire.meta),
      blob.count >= AEAD.nonceSize + AEAD.tagSize
    else { throw CryptoError.malformed("RCRD meta") }
    let plain = try AEAD.open(
      blob.subdata(in: AEAD.nonceSize..<blob.count), nonce: blob.prefix(AEAD.nonceSize),
      associatedData: metaAD(cloudID: wire.cloudID), key: nodeKey)
    let mw: MetaWire
    do {
      mw = try decoder.decode(MetaWire.self, from: plain)
    } catch {
      throw CryptoError.malformed("RCRD meta JSON: \(error)")
    }
    guard let salt = Data(base64Encoded: mw.dirSalt) else {
      throw CryptoError.malformed("RCRD meta dirSalt")
    }
    guard let kind = NodeKind(rawValue: mw.kind) else {
      throw CryptoError.malformed("RCRD meta kind \(mw.kind.debugDescription)")
    }
    guard (0..<1_000_000_000).contains(mw.mtime.ns) else {
      throw CryptoError.malformed("RCRD meta mtime")
    }
    var xattrs: [String: Data] = [:]
    for (name, value) in mw.xattrs {
      guard let d = Data(base64Encoded: value) else {
        throw CryptoError.malformed("RCRD meta xattr \(name.debugDescription)")
      }
      xattrs[name] = d
    }
    let meta = RcrdMeta(
      name: mw.name, dirSalt: salt, kind: kind, mode: mw.mode,
      mtime: FileTime(seconds: mw.mtime.s, nanoseconds: mw.mtime.ns), xattrs: xattrs,
      symlinkTarget: mw.symlinkTarget, dataSize: mw.dataSize, moving: mw.moving ?? false,
      arriving: mw.arriving ?? false)
    return DecodedRcrd(
      cloudID: wire.cloudID, dirPrefix: prefix, shareList: shareList, nodeKey: nodeKey,
      meta: meta, burnDate: wire.burnDate.map { Date(timeIntervalSince1970: TimeInterval($0)) })
  }
}

/// Node keys sealed to readers' public keys, remembered both ways for the nodes of the last
/// moments: sealing costs two X25519 multiplications and opening one, and a node's RCRD is
/// written (every attribute or size change) and read (every pull of a change) again and
/// again with the same key. An RCRD written again for a node carries the sealed key it carried
/// before, which tells a reader of the store nothing it did not know: the same node, the same
/// key.
final class WrappedKeyMemo: Sendable {
  static let shared = WrappedKeyMemo()
  /// Sealed box by node key ‖ public key.
  private let sealed = BoundedMap<Data, Data>(capacity: 8192)
  /// Node key by sealed box ‖ the public key it opened with.
  private let opened = BoundedMap<Data, Data>(capacity: 8192)

  /// `secret` sealed to `publicKey` (the box sealed for the same pair before, if remembered).
  func seal(_ secret: Data, to publicKey: Data) throws -> Data {
    let key = secret + publicKey
    if let box = sealed.get(key) { return box }
    let box = try UserKeyPair.seal(secret, to: publicKey)
    sealed.put(key, box)
    opened.put(box + publicKey, secret)
    return box
  }

  /// The secret in `box`, opened with `keyPair` (remembered when this pair opened or sealed
  /// that box before).
  func open(_ box: Data, with keyPair: UserKeyPair) throws -> Data {
    let key = box + keyPair.boxPublicKey
    if let secret = opened.get(key) { return secret }
    let secret = try keyPair.open(sealed: box)
    opened.put(key, secret)
    return secret
  }
}
