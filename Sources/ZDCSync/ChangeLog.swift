public import Foundation
public import ZDCCore
import ZDCCrypto

/// One change a device made to the store, as listed in a change-log object.
public struct ChangeLogEntry: Sendable, Hashable, Codable {
  /// What happened to the node's objects.
  public enum Kind: String, Sendable, Hashable, Codable {
    /// The RCRD and/or DATA at `rcrd`/`data` was written.
    case put
    /// The node's objects moved from `fromRcrd` to `rcrd`/`data`.
    case move
    /// The objects at `rcrd`/`data` were deleted.
    case delete
  }

  /// The node's identity.
  public var cloudID: String
  /// What happened.
  public var kind: Kind
  /// The RCRD key (after the change).
  public var rcrd: String
  /// The DATA key (after the change).
  public var data: String
  /// For a move, the RCRD key before it.
  public var fromRcrd: String?
  /// The RCRD eTag written, if the RCRD was written.
  public var eTagRcrd: String?
  /// The DATA eTag written, if the DATA was written.
  public var eTagData: String?

  public init(
    cloudID: String, kind: Kind, rcrd: String, data: String, fromRcrd: String? = nil,
    eTagRcrd: String? = nil, eTagData: String? = nil
  ) {
    self.cloudID = cloudID
    self.kind = kind
    self.rcrd = rcrd
    self.data = data
    self.fromRcrd = fromRcrd
    self.eTagRcrd = eTagRcrd
    self.eTagData = eTagData
  }
}

/// The change-log object format (version 1): `"ZDCLOG" ‖ u8 version ‖ 24-byte nonce ‖
/// XChaCha20-Poly1305(JSON document)`, keyed by the user's change-log key and bound to the
/// object's name.
public enum ChangeLogCodec {
  /// The format version written and understood.
  public static let version: UInt8 = 1
  static let magic = Data("ZDCLOG".utf8)

  /// The JSON document inside a change-log object.
  struct Document: Codable {
    var v: Int
    var device: String
    var entries: [ChangeLogEntry]
  }

  static func associatedData(name: String) -> Data { Data("zdc.changelog.v1|\(name)".utf8) }

  /// Encrypts a batch of entries for the object named `name` (`{ULID}-{deviceID}`).
  public static func encode(
    _ entries: [ChangeLogEntry], deviceID: String, name: String, key: Data
  ) throws -> Data {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    let plain = try encoder.encode(Document(v: 1, device: deviceID, entries: entries))
    let nonce = SecureRandom.bytes(AEAD.nonceSize)
    let sealed = try AEAD.seal(
      plain, nonce: nonce, associatedData: associatedData(name: name), key: key)
    return magic + Data([version]) + nonce + sealed
  }

  /// Decrypts and decodes a change-log object named `name`.
  public static func decode(_ data: Data, name: String, key: Data) throws -> [ChangeLogEntry] {
    let header = magic.count + 1
    guard data.count >= header + AEAD.nonceSize + AEAD.tagSize, data.prefix(magic.count) == magic
    else { throw CryptoError.malformed("change-log object header") }
    let bytes = Data(data)
    guard bytes[magic.count] == version else {
      throw CryptoError.unsupportedVersion(Int(bytes[magic.count]))
    }
    let nonce = bytes.subdata(in: header..<(header + AEAD.nonceSize))
    let plain = try AEAD.open(
      bytes.subdata(in: (header + AEAD.nonceSize)..<bytes.count), nonce: nonce,
      associatedData: associatedData(name: name), key: key)
    do {
      let doc = try JSONDecoder().decode(Document.self, from: plain)
      guard doc.v == 1 else { throw CryptoError.unsupportedVersion(doc.v) }
      return doc.entries
    } catch let e as CryptoError {
      throw e
    } catch {
      throw CryptoError.malformed("change-log JSON: \(error)")
    }
  }

  /// Splits a change-log key into its ULID and deviceID, or `nil` for other keys.
  public static func parse(key: String, layout: CloudLayout) -> (ulid: String, deviceID: String)? {
    guard key.hasPrefix(layout.changesPrefix) else { return nil }
    let name = key.dropFirst(layout.changesPrefix.count)
    guard name.count > 27, let dash = name.firstIndex(of: "-"),
      name.distance(from: name.startIndex, to: dash) == 26
    else { return nil }
    let ulid = String(name[..<dash])
    guard ULID(ulid) != nil else { return nil }
    return (ulid, String(name[name.index(after: dash)...]))
  }

  /// The key of the compaction marker, next to the change log.
  public static func compactedMarkerKey(_ layout: CloudLayout) -> String {
    "\(layout.treePrefix)changes-compacted"
  }
}

/// Hands out strictly increasing ULIDs (several in one millisecond stay ordered).
final class ULIDGenerator: @unchecked Sendable {
  // Safe: `last` is only touched under `lock`.
  private let lock = NSLock()
  private var last: ULID?

  func next(date: Date = Date()) -> ULID {
    lock.withLock {
      var u = ULID(date: date)
      if let l = last, u <= l {
        // Same millisecond or clock step back: continue from the last one, incremented.
        u = ULID(incrementing: l)
      }
      last = u
      return u
    }
  }
}

extension ULID {
  /// The next ULID after `u` (random part + 1).
  init(incrementing u: ULID) {
    let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)
    var chars = Array(u.string.utf8)
    var i = chars.count - 1
    while i >= 0 {
      let v = alphabet.firstIndex(of: chars[i])!
      if v < 31 {
        chars[i] = alphabet[v + 1]
        break
      }
      chars[i] = alphabet[0]
      i -= 1
    }
    self = ULID(String(decoding: chars, as: UTF8.self))!
  }
}
