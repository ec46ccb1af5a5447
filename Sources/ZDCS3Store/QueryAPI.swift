public import Foundation
import Logging

/// Calls to the AWS query APIs (IAM, STS): a form POST signed with SigV4. Tests use it to
/// set up users, roles and temporary credentials on a local S3-compatible server.
@_spi(Testing) public enum QueryAPI {
  /// What a query API answered.
  public struct Answer: Sendable {
    /// The HTTP status.
    public var status: Int
    /// The raw body.
    public var body: Data
    /// The body parsed, when it is well-formed XML.
    public var document: XMLElement?
    /// True for a 2xx status.
    public var isSuccess: Bool { (200..<300).contains(status) }
  }

  /// Posts `params` (plus `Version`) to `baseURL` (`http://host:port`), signed for `service`
  /// in `us-east-1` with `credentials`; one attempt.
  public static func call(
    baseURL: String, service: String, version: String, credentials: S3Credentials,
    _ params: [(String, String)]
  ) throws -> Answer {
    let form = (params + [("Version", version)])
      .map { "\($0.0)=\(URIEncoding.encode($0.1, keepSlash: false))" }
      .joined(separator: "&")
    let body = Data(form.utf8)
    let host = String(baseURL.drop { $0 != "/" }.drop { $0 == "/" })
    let request = HTTPRequest(
      kind: .createBucket, method: "POST", host: host, baseURL: baseURL, encodedPath: "/",
      body: .data(body), payloadHash: SigV4Signer.payloadHash(body),
      contentType: "application/x-www-form-urlencoded")
    let signer = SigV4Signer(credentials: credentials, region: "us-east-1", service: service)
    var options = S3TransportOptions()
    options.maxAttempts = 1
    let transport = CurlTransport(options: options, logger: Logger(label: "zdc.query"))
    let response = try transport.perform(request) { r, date in
      signer.sign(
        method: r.method, encodedPath: r.encodedPath, query: [],
        headers: [("host", r.host), ("content-type", r.contentType ?? "")],
        payloadHash: r.payloadHash, date: date
      ).headers
    }
    return Answer(
      status: response.status, body: response.body, document: XMLElement.parse(response.body))
  }
}
