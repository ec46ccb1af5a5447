import Foundation

/// Push payloads as JSON, byte for byte what `JSONEncoder` with sorted keys writes, without its
/// cost (~70K instructions per payload, most of a delete's enqueue). Decoding stays
/// `JSONDecoder`'s.
enum PushPayloadJSON {
  static func encode(_ p: PushPayload) -> String {
    var out: [UInt8] = []
    out.reserveCapacity(64 + 320 * ((p.objects?.count ?? 0) + (p.written?.count ?? 0)))
    out.append(UInt8(ascii: "{"))
    var first = true
    func key(_ k: StaticString) {
      if !first { out.append(UInt8(ascii: ",")) }
      first = false
      out.append(UInt8(ascii: "\""))
      raw(k, &out)
      raw("\":", &out)
    }
    if let prefixes = p.dirPrefixes {
      key("dirPrefixes")
      out.append(UInt8(ascii: "["))
      for (i, s) in prefixes.enumerated() {
        if i > 0 { out.append(UInt8(ascii: ",")) }
        string(s, &out)
      }
      out.append(UInt8(ascii: "]"))
    }
    if let objects = p.objects {
      key("objects")
      refs(objects, &out)
    }
    if let origin = p.origin {
      key("origin")
      ref(origin, &out)
    }
    if let written = p.written {
      key("written")
      refs(written, &out)
    }
    out.append(UInt8(ascii: "}"))
    return String(decoding: out, as: UTF8.self)
  }

  private static func raw(_ s: StaticString, _ out: inout [UInt8]) {
    s.withUTF8Buffer { out.append(contentsOf: $0) }
  }

  private static func refs(_ list: [CloudObjectRef], _ out: inout [UInt8]) {
    out.append(UInt8(ascii: "["))
    for (i, r) in list.enumerated() {
      if i > 0 { out.append(UInt8(ascii: ",")) }
      ref(r, &out)
    }
    out.append(UInt8(ascii: "]"))
  }

  private static func ref(_ r: CloudObjectRef, _ out: inout [UInt8]) {
    raw("{\"cloudID\":", &out)
    string(r.cloudID, &out)
    raw(",\"cloudName\":", &out)
    string(r.cloudName, &out)
    raw(",\"dataKey\":", &out)
    string(r.dataKey, &out)
    raw(",\"dirPrefix\":", &out)
    string(r.dirPrefix, &out)
    if let e = r.eTagData {
      raw(",\"eTagData\":", &out)
      string(e, &out)
    }
    if let e = r.eTagRcrd {
      raw(",\"eTagRcrd\":", &out)
      string(e, &out)
    }
    raw(",\"nodeID\":", &out)
    out.append(contentsOf: String(r.nodeID).utf8)
    raw(",\"rcrdKey\":", &out)
    string(r.rcrdKey, &out)
    out.append(UInt8(ascii: "}"))
  }

  /// A JSON string as `JSONEncoder` escapes it (`/` included: object keys contain slashes).
  private static func string(_ s: String, _ out: inout [UInt8]) {
    var s = s
    s.withUTF8 { bytes in
      out.append(UInt8(ascii: "\""))
      for b in bytes {
        // The byte after a backslash, for the bytes escaped with one.
        let escaped: UInt8? =
          switch b {
          case 0x22, 0x5C, 0x2F: b
          case 0x0A: 0x6E  // \n
          case 0x0D: 0x72  // \r
          case 0x09: 0x74  // \t
          case 0x08: 0x62  // \b
          case 0x0C: 0x66  // \f
          default: nil
          }
        if let escaped {
          out.append(0x5C)
          out.append(escaped)
        } else if b < 0x20 {
          raw("\\u00", &out)
          out.append(hexDigit(b >> 4))
          out.append(hexDigit(b & 0xF))
        } else {
          out.append(b)
        }
      }
      out.append(UInt8(ascii: "\""))
    }
  }

  private static func hexDigit(_ v: UInt8) -> UInt8 { v < 10 ? 0x30 + v : 0x57 + v }
}
