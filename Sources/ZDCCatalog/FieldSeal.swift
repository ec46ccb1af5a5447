import Foundation
import GRDB
import ZDCCore
import ZDCCrypto
import ZDCSQLite

/// How a catalog stores its sensitive fields — names, symlink targets, node keys, directory
/// salts, extended attributes, data tags (a directory's `.meta` and `.thumb`) and redo journal
/// records — and the keys of its name index: sealed (keyed) with a key derived from the user's
/// private key, or (a catalog opened without a key) as they are.
enum FieldCoding: Sendable {
  /// Fields as they are (a catalog that was never given a key).
  case plain
  /// Fields sealed with this key.
  case sealed(FieldSeal)
  /// A sealed catalog opened without its key: sealed fields cannot be read or written.
  case locked

  /// `value` as stored.
  func seal(_ value: Data) throws -> Data {
    switch self {
    case .plain: return value
    case .sealed(let s): return try s.seal(value)
    case .locked: throw CatalogError.locked
    }
  }

  /// A stored value as it was given.
  func open(_ stored: Data) throws -> Data {
    switch self {
    case .plain: return stored
    case .sealed(let s): return try s.open(stored)
    case .locked: throw CatalogError.locked
    }
  }

  /// The stored key of a name in the `(parentID, nameKey)` index: the normalised name, or, in
  /// a sealed catalog, its keyed digest, a 20-byte BLOB (equal keys still meet; the index holds
  /// no name).
  ///
  /// A case variant's key (``CaseVariant``) starts with its name's: sealed, the digest of the
  /// name's key followed by the variant's suffix, as the plain key is.
  func nameKey(_ key: NameKey) throws -> any DatabaseValueConvertible {
    switch self {
    case .plain: return key.value
    case .sealed(let s):
      guard let (base, suffix) = CaseVariant.splitKey(key.value) else {
        return s.nameKeyDigest(key.value)
      }
      return s.nameKeyDigest(String(base)) + Data(suffix.utf8)
    case .locked: throw CatalogError.locked
    }
  }

  /// The range of stored index keys `[lower, upper)` that holds `nameKey` and the keys of the
  /// case variants of its name.
  func nameKeyRange(of nameKey: NameKey) throws -> (
    lower: any DatabaseValueConvertible, upper: any DatabaseValueConvertible
  ) {
    let key = nameKey.value
    switch self {
    case .plain: return (key, key + "\u{1}")
    case .sealed(let s):
      // A name of a case variant's shape is stored under its split key (see `nameKey(_:)`).
      if let (base, suffix) = CaseVariant.splitKey(key) {
        let stored = s.nameKeyDigest(String(base)) + Data(suffix.utf8)
        return (stored, Self.justAbove(stored))
      }
      let digest = s.nameKeyDigest(key)
      return (digest, Self.justAbove(digest))
    case .locked: throw CatalogError.locked
    }
  }

  /// `key` followed by a 1 byte: above `key` and below any longer key that starts with it and
  /// continues with a byte above 0 (built in one allocation; `Data`'s `+` costs several).
  static func justAbove(_ key: Data) -> Data {
    var out = Data(count: key.count + 1)
    out.withUnsafeMutableBytes { o in
      _ = key.copyBytes(to: o.bindMemory(to: UInt8.self))
      o[key.count] = 1
    }
    return out
  }

  /// The stored index key of `name` (see ``nameKey(_:)``).
  func nameKey(of name: String) throws -> any DatabaseValueConvertible {
    try nameKey(NameKey(name))
  }

  /// A text field (a name, a symlink target) as stored: the text, or sealed.
  func storedText(_ text: String?) throws -> (any DatabaseValueConvertible)? {
    guard let text else { return nil }
    if case .plain = self { return text }
    return try seal(Data(text.utf8))
  }

  /// The text field (see ``storedText(_:)``) in column `index` of a statement's current row,
  /// with every byte (a name may hold a NUL: a case variant's does).
  func text(_ s: SQLiteStatement, _ index: CInt) throws -> String? {
    if case .plain = self { return columnText(s, index) }
    return try Data.fromStatement(s, atUncheckedIndex: index).map {
      String(decoding: try open($0), as: UTF8.self)
    }
  }

  /// A redo journal record as written (a sealed record starts with ``FieldSeal/recordMark``,
  /// which no plain record does: those start with their operation kind).
  func sealRecord(_ record: Data) throws -> Data {
    guard case .sealed(let s) = self else { return record }
    return try s.seal(record, mark: FieldSeal.recordMark)
  }

  /// A redo journal record as it was made (plain records, from before the catalog was sealed,
  /// pass as they are).
  func openRecord(_ record: Data) throws -> Data {
    guard record.first == FieldSeal.recordMark else { return record }
    return try open(record.dropFirst())
  }
}

/// XChaCha20-Poly1305: `version ‖ nonce ‖ ciphertext ‖ tag`. Nonces are a random 16-byte
/// prefix chosen once per process and a 64-bit counter: unique for the key without a system
/// call per value.
///
/// A class: every transaction and every sealed field's closures hold it, and copying a struct
/// of these references cost about 900 instructions per sealed field.
final class FieldSeal: Sendable {
  static let version: UInt8 = 1
  /// The first byte of a sealed journal record.
  static let recordMark: UInt8 = 0xFF
  static let overhead = 1 + AEAD.nonceSize + AEAD.tagSize
  let key: Data
  /// Makes the keys of the name index (see ``FieldCoding/nameKey(_:)``).
  let nameDigest: KeyedDigest
  /// The digests of the names used lately: a file operation asks for the key of one name
  /// several times (the lookup, the uniqueness check, the write).
  private let recentNameKeys = BoundedMap<String, Data>(capacity: 1024)
  private static let nonces = NonceSource()
  /// Seals under `key` with this process's nonces (which share their prefix).
  private let sealer: AEADPrefixedNonces

  init(key: Data) throws {
    guard key.count == AEAD.keySize else {
      throw CatalogError.invalidOperation("a catalog field key has \(AEAD.keySize) bytes")
    }
    self.key = key
    sealer = try AEADPrefixedNonces(key: key, prefix: Self.nonces.prefix)
    let nameKeyKey = try KeyedDigest(key: key, length: 32)
    nameDigest = try KeyedDigest(key: nameKeyKey.digest("zdc.catalog.namekey.v1"))
  }

  /// The index key of a normalised name (``FieldCoding/nameKey(_:)``): its keyed digest.
  func nameKeyDigest(_ key: String) -> Data {
    if let known = recentNameKeys.get(key) { return known }
    let digest = nameDigest.digest(key)
    recentNameKeys.put(key, digest)
    return digest
  }

  /// `plaintext` sealed, after `mark` when given.
  func seal(_ plaintext: Data, mark: UInt8? = nil) throws -> Data {
    let front = mark == nil ? 0 : 1
    var out = Data(count: front + Self.overhead + plaintext.count)
    try out.withUnsafeMutableBytes { o in
      if let mark { o[0] = mark }
      o[front] = Self.version
      let nonce = UnsafeMutableRawBufferPointer(
        rebasing: o[(front + 1)..<(front + 1 + AEAD.nonceSize)])
      Self.nonces.next(into: nonce)
      var version = Self.version
      _ = try plaintext.withUnsafeBytes { p in
        try withUnsafeBytes(of: &version) { ad in
          try sealer.seal(
            p, into: UnsafeMutableRawBufferPointer(rebasing: o[(front + 1 + AEAD.nonceSize)...]),
            nonceSuffix: UnsafeRawBufferPointer(rebasing: nonce[AEADPrefixedNonces.prefixSize...]),
            associatedData: ad)
        }
      }
    }
    return out
  }

  func open(_ stored: Data) throws -> Data {
    guard stored.count >= Self.overhead, stored.first == Self.version else {
      throw CatalogError.corrupt("sealed catalog field")
    }
    var out = Data(count: stored.count - Self.overhead)
    do {
      _ = try out.withUnsafeMutableBytes { o in
        try stored.withUnsafeBytes { s in
          try key.withUnsafeBytes { k in
            try AEAD.open(
              UnsafeRawBufferPointer(rebasing: s[(1 + AEAD.nonceSize)...]), into: o,
              nonce: UnsafeRawBufferPointer(rebasing: s[1..<(1 + AEAD.nonceSize)]),
              associatedData: UnsafeRawBufferPointer(rebasing: s[0..<1]), key: k)
          }
        }
      }
    } catch {
      throw CatalogError.corrupt("sealed catalog field fails authentication")
    }
    return out
  }
}

/// Nonces for ``FieldSeal``: a random prefix and a counter.
private final class NonceSource: @unchecked Sendable {
  // @unchecked: `counter` is guarded by `lock`.
  let prefix = SecureRandom.bytes(AEADPrefixedNonces.prefixSize)
  private let lock = NSLock()
  private var counter: UInt64 = 0

  func next(into nonce: UnsafeMutableRawBufferPointer) {
    var n = lock.withLock { () -> UInt64 in
      counter += 1
      return counter
    }
    prefix.withUnsafeBytes { nonce.copyMemory(from: $0) }
    withUnsafeBytes(of: &n) {
      UnsafeMutableRawBufferPointer(rebasing: nonce[(AEAD.nonceSize - 8)...]).copyMemory(from: $0)
    }
  }
}
