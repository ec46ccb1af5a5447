public import Foundation

#if canImport(FoundationXML)
  import FoundationXML
#endif

/// A parsed XML element: name, text content and child elements (namespaces dropped).
@_spi(Testing) public struct XMLElement: Sendable {
  /// The element's name, without its namespace prefix.
  public var name: String
  /// The text content.
  public var text: String = ""
  /// The child elements, in document order.
  public var children: [XMLElement] = []

  /// The first child with this name.
  public func child(_ name: String) -> XMLElement? { children.first { $0.name == name } }
  /// Every child with this name.
  public func all(_ name: String) -> [XMLElement] { children.filter { $0.name == name } }
  /// The text of the first child with this name.
  public func value(_ name: String) -> String? { child(name)?.text }

  /// Parses a document; `nil` if it is not well-formed XML.
  public static func parse(_ data: Data) -> XMLElement? {
    let delegate = TreeBuilder()
    let parser = XMLParser(data: data)
    parser.shouldProcessNamespaces = false
    parser.shouldResolveExternalEntities = false
    parser.delegate = delegate
    guard parser.parse(), delegate.failed == false else { return nil }
    return delegate.root
  }

  /// Serialises text for an XML element body.
  static func escape(_ s: String) -> String {
    var out = ""
    out.reserveCapacity(s.count)
    for c in s {
      switch c {
      case "&": out += "&amp;"
      case "<": out += "&lt;"
      case ">": out += "&gt;"
      case "\"": out += "&quot;"
      case "'": out += "&apos;"
      default: out.append(c)
      }
    }
    return out
  }
}

private final class TreeBuilder: NSObject, XMLParserDelegate {
  var stack: [XMLElement] = []
  var root: XMLElement?
  var failed = false

  func parser(
    _ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?,
    qualifiedName qName: String?, attributes attributeDict: [String: String] = [:]
  ) {
    let local = elementName.split(separator: ":").last.map(String.init) ?? elementName
    stack.append(XMLElement(name: local))
  }

  func parser(
    _ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?,
    qualifiedName qName: String?
  ) {
    guard let done = stack.popLast() else {
      failed = true
      return
    }
    if stack.isEmpty {
      root = done
    } else {
      stack[stack.count - 1].children.append(done)
    }
  }

  func parser(_ parser: XMLParser, foundCharacters string: String) {
    guard !stack.isEmpty else { return }
    stack[stack.count - 1].text += string
  }

  func parser(_ parser: XMLParser, foundCDATA CDATABlock: Data) {
    guard !stack.isEmpty else { return }
    stack[stack.count - 1].text += String(decoding: CDATABlock, as: UTF8.self)
  }

  func parser(_ parser: XMLParser, parseErrorOccurred parseError: any Error) {
    failed = true
  }
}

/// Date formats S3 uses.
enum S3Date {
  /// `2009-10-12T17:50:30.000Z` (fraction optional).
  static func parseISO8601(_ s: String) -> Date? {
    let b = Array(s.utf8)
    guard b.count >= 20 else { return nil }
    func num(_ from: Int, _ len: Int) -> Int? {
      var v = 0
      for i in from..<from + len {
        guard b[i] >= 48, b[i] <= 57 else { return nil }
        v = v * 10 + Int(b[i] - 48)
      }
      return v
    }
    guard let y = num(0, 4), let mo = num(5, 2), let d = num(8, 2), let h = num(11, 2),
      let mi = num(14, 2), let se = num(17, 2)
    else { return nil }
    var frac = 0.0
    var i = 19
    if i < b.count, b[i] == UInt8(ascii: ".") {
      i += 1
      var scale = 0.1
      while i < b.count, b[i] >= 48, b[i] <= 57 {
        frac += Double(b[i] - 48) * scale
        scale /= 10
        i += 1
      }
    }
    return make(y, mo, d, h, mi, se).map { $0.addingTimeInterval(frac) }
  }

  /// `Wed, 12 Oct 2009 17:50:00 GMT` (RFC 7231 IMF-fixdate).
  static func parseHTTP(_ s: String) -> Date? {
    let parts = s.split(separator: " ")
    guard parts.count >= 5 else { return nil }
    let months = [
      "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    guard let d = Int(parts[1]), let mo = months.firstIndex(of: String(parts[2])),
      let y = Int(parts[3])
    else { return nil }
    let t = parts[4].split(separator: ":").compactMap { Int($0) }
    guard t.count == 3 else { return nil }
    return make(y, mo + 1, d, t[0], t[1], t[2])
  }

  private static func make(_ y: Int, _ mo: Int, _ d: Int, _ h: Int, _ mi: Int, _ s: Int) -> Date? {
    var tm = tm()
    tm.tm_year = Int32(y - 1900)
    tm.tm_mon = Int32(mo - 1)
    tm.tm_mday = Int32(d)
    tm.tm_hour = Int32(h)
    tm.tm_min = Int32(mi)
    tm.tm_sec = Int32(s)
    let t = timegm(&tm)
    guard t != -1 else { return nil }
    return Date(timeIntervalSince1970: TimeInterval(t))
  }
}
