import Foundation

/// Push payloads as JSON, byte for byte what `JSONEncoder` with sorted keys writes, without its
/// cost (~70K instructions per payload, most of a delete's enqueue). Decoding stays
/// `JSONDecoder`'s.
enum PushPayloadJSON {
  static func encode(_ p: PushPayload) -> String {
    var out = "{"
    var first = true
    func key(_ k: String) {
      if !first { out += "," }
      first = false
      out += "\""
      out += k
      out += "\":"
    }
    if let prefixes = p.dirPrefixes {
      key("dirPrefixes")
      out += "["
      for (i, s) in prefixes.enumerated() {
        if i > 0 { out += "," }
        string(s, &out)
      }
      out += "]"
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
    out += "}"
    return out
  }

  private static func refs(_ list: [CloudObjectRef], _ out: inout String) {
    out += "["
    for (i, r) in list.enumerated() {
      if i > 0 { out += "," }
      ref(r, &out)
    }
    out += "]"
  }

  private static func ref(_ r: CloudObjectRef, _ out: inout String) {
    out += "{\"cloudID\":"
    string(r.cloudID, &out)
    out += ",\"cloudName\":"
    string(r.cloudName, &out)
    out += ",\"dataKey\":"
    string(r.dataKey, &out)
    out += ",\"dirPrefix\":"
    string(r.dirPrefix, &out)
    if let e = r.eTagData {
      out += ",\"eTagData\":"
      string(e, &out)
    }
    if let e = r.eTagRcrd {
      out += ",\"eTagRcrd\":"
      string(e, &out)
    }
    out += ",\"nodeID\":"
    out += String(r.nodeID)
    out += ",\"rcrdKey\":"
    string(r.rcrdKey, &out)
    out += "}"
  }

  /// A JSON string as `JSONEncoder` escapes it (`/` included).
  private static func string(_ s: String, _ out: inout String) {
    var s = s
    var plain = true
    for b in s.utf8 where b < 0x20 || b == 0x22 || b == 0x5C || b == 0x2F {
      plain = false
      break
    }
    if plain {
      out += "\""
      out += s
      out += "\""
      return
    }
    // Escaped byte by byte (object keys contain slashes: every ref takes this path).
    let escaped = s.withUTF8 { bytes -> String in
      var buf: [UInt8] = []
      buf.reserveCapacity(bytes.count + 16)
      buf.append(0x22)
      for b in bytes {
        switch b {
        case 0x22, 0x5C, 0x2F: buf += [0x5C, b]
        case 0x0A: buf += [0x5C, 0x6E]  // \n
        case 0x0D: buf += [0x5C, 0x72]  // \r
        case 0x09: buf += [0x5C, 0x74]  // \t
        case 0x08: buf += [0x5C, 0x62]  // \b
        case 0x0C: buf += [0x5C, 0x66]  // \f
        case ..<0x20:
          let hex = Array("0123456789abcdef".utf8)
          buf += [0x5C, 0x75, 0x30, 0x30, hex[Int(b >> 4)], hex[Int(b & 0xF)]]
        default: buf.append(b)
        }
      }
      buf.append(0x22)
      return String(decoding: buf, as: UTF8.self)
    }
    out += escaped
  }
}
