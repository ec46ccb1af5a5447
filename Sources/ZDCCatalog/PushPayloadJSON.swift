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
    out += "\""
    var plain = true
    for b in s.utf8 where b < 0x20 || b == 0x22 || b == 0x5C || b == 0x2F {
      plain = false
      break
    }
    if plain {
      out += s
    } else {
      for scalar in s.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "/": out += "\\/"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case "\u{08}": out += "\\b"
        case "\u{0C}": out += "\\f"
        default:
          if scalar.value < 0x20 {
            let hex = String(scalar.value, radix: 16)
            out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
          } else {
            out.unicodeScalars.append(scalar)
          }
        }
      }
    }
    out += "\""
  }
}
