public import Foundation
import ZDCCore

/// RFC 3986 percent-encoding as AWS Signature Version 4 requires it.
public enum URIEncoding {
  /// Encodes every byte except the unreserved characters `A-Z a-z 0-9 - . _ ~`; keeps `/`
  /// unencoded when `keepSlash` is true (object paths) and encodes it otherwise (query values).
  public static func encode(_ string: String, keepSlash: Bool) -> String {
    let hex = Array("0123456789ABCDEF".utf8)
    var out = [UInt8]()
    out.reserveCapacity(string.utf8.count)
    for b in string.utf8 {
      switch b {
      case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
        UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
        UInt8(ascii: "_"), UInt8(ascii: "~"):
        out.append(b)
      case UInt8(ascii: "/") where keepSlash:
        out.append(b)
      default:
        out.append(UInt8(ascii: "%"))
        out.append(hex[Int(b >> 4)])
        out.append(hex[Int(b & 0x0f)])
      }
    }
    return String(decoding: out, as: UTF8.self)
  }
}

/// The result of signing one request with AWS Signature Version 4.
public struct SignedRequest: Sendable {
  /// The canonical request that was hashed.
  public var canonicalRequest: String
  /// The string that was signed.
  public var stringToSign: String
  /// The signature, lower-case hex.
  public var signature: String
  /// The value of the `Authorization` header.
  public var authorization: String
  /// Every header to send, including `Authorization`, `x-amz-date`, `x-amz-content-sha256` and
  /// (with temporary credentials) `x-amz-security-token`.
  public var headers: [(name: String, value: String)]
}

/// AWS Signature Version 4 header signing (`AWS4-HMAC-SHA256`).
public struct SigV4Signer: Sendable {
  /// The credentials that sign.
  public var credentials: S3Credentials
  /// The region in the credential scope.
  public var region: String
  /// The service in the credential scope.
  public var service: String

  /// A signer for a region and service (`s3` by default).
  public init(credentials: S3Credentials, region: String, service: String = "s3") {
    self.credentials = credentials
    self.region = region
    self.service = service
  }

  /// The `x-amz-content-sha256` value for a body streamed without hashing.
  public static let unsignedPayload = "UNSIGNED-PAYLOAD"

  /// The hex SHA-256 of a body, for `x-amz-content-sha256`.
  public static func payloadHash(_ body: Data) -> String { Digest.hex(Digest.sha256(body)) }

  /// Signs a request.
  ///
  /// - Parameters:
  ///   - method: HTTP method.
  ///   - encodedPath: the request path exactly as sent, already URI-encoded.
  ///   - query: query parameters, not encoded.
  ///   - headers: headers to sign and send; must include `host`.
  ///   - payloadHash: hex SHA-256 of the body, or ``unsignedPayload``.
  ///   - date: the request time.
  public func sign(
    method: String, encodedPath: String, query: [(String, String)],
    headers: [(String, String)], payloadHash: String, date: Date
  ) -> SignedRequest {
    let (amzDate, day) = Self.timestamps(date)
    var all = headers.map { (name: $0.0.lowercased(), value: Self.trimHeaderValue($0.1)) }
    all.append((name: "x-amz-date", value: amzDate))
    all.append((name: "x-amz-content-sha256", value: payloadHash))
    if let token = credentials.sessionToken, !token.isEmpty {
      all.append((name: "x-amz-security-token", value: token))
    }
    all.sort { $0.name < $1.name }
    let signedHeaders = all.map(\.name).joined(separator: ";")
    let canonicalHeaders = all.map { "\($0.name):\($0.value)\n" }.joined()
    let canonicalRequest = [
      method, encodedPath, Self.canonicalQuery(query), canonicalHeaders, signedHeaders,
      payloadHash,
    ].joined(separator: "\n")
    let scope = "\(day)/\(region)/\(service)/aws4_request"
    let stringToSign = [
      "AWS4-HMAC-SHA256", amzDate, scope, Digest.hex(Digest.sha256(canonicalRequest)),
    ].joined(separator: "\n")
    var key = Digest.hmacSHA256(key: Array("AWS4\(credentials.secretAccessKey)".utf8), day)
    key = Digest.hmacSHA256(key: key, region)
    key = Digest.hmacSHA256(key: key, service)
    key = Digest.hmacSHA256(key: key, "aws4_request")
    let signature = Digest.hex(Digest.hmacSHA256(key: key, stringToSign))
    let authorization =
      "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope), "
      + "SignedHeaders=\(signedHeaders), Signature=\(signature)"
    all.append((name: "authorization", value: authorization))
    return SignedRequest(
      canonicalRequest: canonicalRequest, stringToSign: stringToSign, signature: signature,
      authorization: authorization, headers: all)
  }

  /// The canonical query string: encoded names and values, sorted, `name=value` joined by `&`.
  public static func canonicalQuery(_ query: [(String, String)]) -> String {
    var pairs: [(String, String)] = []
    for (name, value) in query {
      pairs.append(
        (URIEncoding.encode(name, keepSlash: false), URIEncoding.encode(value, keepSlash: false)))
    }
    pairs.sort { a, b in a.0 == b.0 ? a.1 < b.1 : a.0 < b.0 }
    var parts: [String] = []
    for (name, value) in pairs { parts.append(name + "=" + value) }
    return parts.joined(separator: "&")
  }

  static func trimHeaderValue(_ value: String) -> String {
    let parts = value.split(whereSeparator: { $0 == " " || $0 == "\t" })
    return parts.joined(separator: " ")
  }

  /// `yyyyMMdd'T'HHmmss'Z'` and `yyyyMMdd` in UTC.
  static func timestamps(_ date: Date) -> (String, String) {
    let u = Digits.utc(date)
    let day = u.year + u.month + u.day
    let time = u.hour + u.minute + u.second
    return ("\(day)T\(time)Z", day)
  }
}
