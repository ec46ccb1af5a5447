import Foundation
import ZDCCore

/// Reads the catalog's JSON of a ``CloudDataInfo`` (as `JSONEncoder` writes it) without
/// `JSONDecoder`, which costs more than the rest of a node row together: every listed, looked
/// up or deleted node that was ever uploaded carries one. Anything it does not expect (another
/// key, an escape it does not handle, a malformed number) is left to `JSONDecoder`.
enum CloudDataInfoCodec {
  static func decode(_ json: String, _ decoder: JSONDecoder) throws -> CloudDataInfo {
    if let fast = fastDecode(json) { return fast }
    return try decoder.decode(CloudDataInfo.self, from: Data(json.utf8))
  }

  /// The value, or `nil` when the text is not in the shape this parser knows.
  static func fastDecode(_ json: String) -> CloudDataInfo? {
    var json = json
    return json.withUTF8 { bytes -> CloudDataInfo? in
      var p = Parser(bytes: bytes)
      var metadata: UInt64?
      var thumbnail: UInt64?
      var data: UInt64?
      var eTag: String?
      var lastModified: Date?
      guard p.take(UInt8(ascii: "{")) else { return nil }
      if !p.take(UInt8(ascii: "}")) {
        repeat {
          guard let key = p.key(), p.take(UInt8(ascii: ":")) else { return nil }
          switch key {
          case .metadataSize: metadata = p.unsigned()
          case .thumbnailSize: thumbnail = p.unsigned()
          case .dataSize: data = p.unsigned()
          case .eTag: eTag = p.string()
          case .lastModified:
            guard let seconds = p.double() else { return nil }
            lastModified = Date(timeIntervalSinceReferenceDate: seconds)
          }
        } while p.take(UInt8(ascii: ","))
        guard p.take(UInt8(ascii: "}")) else { return nil }
      }
      guard p.atEnd, let metadata, let thumbnail, let data, let eTag else { return nil }
      return CloudDataInfo(
        metadataSize: metadata, thumbnailSize: thumbnail, dataSize: data, eTag: eTag,
        lastModified: lastModified)
    }
  }

  private enum Key: CaseIterable {
    case metadataSize, thumbnailSize, dataSize, eTag, lastModified

    var utf8: [UInt8] { Self.names[self]! }

    static let names: [Key: [UInt8]] = [
      .metadataSize: Array("metadataSize".utf8), .thumbnailSize: Array("thumbnailSize".utf8),
      .dataSize: Array("dataSize".utf8), .eTag: Array("eTag".utf8),
      .lastModified: Array("lastModified".utf8),
    ]
  }

  private struct Parser {
    let bytes: UnsafeBufferPointer<UInt8>
    var i = 0

    var atEnd: Bool { i == bytes.count }

    mutating func take(_ c: UInt8) -> Bool {
      guard i < bytes.count, bytes[i] == c else { return false }
      i += 1
      return true
    }

    /// One of the known keys (a quoted name without escapes).
    mutating func key() -> Key? {
      guard take(UInt8(ascii: "\"")) else { return nil }
      let start = i
      while i < bytes.count, bytes[i] != UInt8(ascii: "\""), bytes[i] != UInt8(ascii: "\\") {
        i += 1
      }
      guard take(UInt8(ascii: "\"")) else { return nil }
      let name = UnsafeBufferPointer(rebasing: bytes[start..<(i - 1)])
      let key: Key?
      switch name.count {
      case 4: key = .eTag
      case 8: key = .dataSize
      case 13: key = .thumbnailSize
      case 12: key = name.first == UInt8(ascii: "m") ? .metadataSize : .lastModified
      default: key = nil
      }
      guard let key, name.elementsEqual(key.utf8) else { return nil }
      return key
    }

    /// A JSON string with the simple escapes (`\"`, `\\`, `\/`, `\n`, `\r`, `\t`, `\b`, `\f`).
    mutating func string() -> String? {
      guard take(UInt8(ascii: "\"")) else { return nil }
      // Most have no escape: the bytes as they are.
      var end = i
      while end < bytes.count, bytes[end] != UInt8(ascii: "\""), bytes[end] != UInt8(ascii: "\\"),
        bytes[end] >= 0x20
      {
        end += 1
      }
      if end < bytes.count, bytes[end] == UInt8(ascii: "\"") {
        defer { i = end + 1 }
        return String(validating: UnsafeBufferPointer(rebasing: bytes[i..<end]), as: UTF8.self)
      }
      var out: [UInt8] = []
      while i < bytes.count {
        let c = bytes[i]
        i += 1
        switch c {
        case UInt8(ascii: "\""): return String(validating: out, as: UTF8.self)
        case UInt8(ascii: "\\"):
          guard i < bytes.count else { return nil }
          let e = bytes[i]
          i += 1
          switch e {
          case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
          case UInt8(ascii: "n"): out.append(0x0A)
          case UInt8(ascii: "r"): out.append(0x0D)
          case UInt8(ascii: "t"): out.append(0x09)
          case UInt8(ascii: "b"): out.append(0x08)
          case UInt8(ascii: "f"): out.append(0x0C)
          default: return nil  // \u and anything else: JSONDecoder's job
          }
        case 0..<0x20: return nil
        default: out.append(c)
        }
      }
      return nil
    }

    /// Decimal digits only (no sign, fraction or exponent), without overflow.
    mutating func unsigned() -> UInt64? {
      let start = i
      var value: UInt64 = 0
      while i < bytes.count, bytes[i] >= UInt8(ascii: "0"), bytes[i] <= UInt8(ascii: "9") {
        let (m, o1) = value.multipliedReportingOverflow(by: 10)
        let (s, o2) = m.addingReportingOverflow(UInt64(bytes[i] - UInt8(ascii: "0")))
        if o1 || o2 { return nil }
        value = s
        i += 1
      }
      guard i > start, i - start == 1 || bytes[start] != UInt8(ascii: "0") else { return nil }
      return value
    }

    /// A JSON number as a `Double` (parsed as Swift parses `Double` text: the shortest
    /// round-trip form `JSONEncoder` writes comes back exactly).
    mutating func double() -> Double? {
      let start = i
      while i < bytes.count {
        switch bytes[i] {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "+"),
          UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"):
          i += 1
        default:
          guard i > start else { return nil }
          return Double(
            String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self))
        }
      }
      return nil
    }
  }
}
