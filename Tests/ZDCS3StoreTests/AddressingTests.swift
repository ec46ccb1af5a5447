import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

@testable import ZDCS3Store

/// URLs, Host headers and error mapping, without a server.
@Suite struct AddressingTests {
  let creds = S3Credentials(accessKeyID: "AK", secretAccessKey: "SK")

  func store(
    _ endpoint: String?, _ style: S3AddressingStyle, bucket: String = "bkt", prefix: String = "pre"
  )
    -> S3Store
  {
    S3Store(
      configuration: S3Configuration(
        bucket: bucket, prefix: prefix, endpoint: endpoint.flatMap(URL.init(string:)),
        region: "eu-west-1", addressingStyle: style, credentials: creds))
  }

  @Test func awsDefaults() throws {
    let s = store(nil, .auto)
    let r = s.request(.getObject, "GET", fullKey: try s.fullKey("a b/c"))
    #expect(r.baseURL == "https://bkt.s3.eu-west-1.amazonaws.com")
    #expect(r.host == "bkt.s3.eu-west-1.amazonaws.com")
    #expect(r.encodedPath == "/pre/a%20b/c")
    let list = s.request(.listObjects, "GET", fullKey: nil)
    #expect(list.encodedPath == "/")
    // Dotted bucket names are not safe as TLS host names: path-style.
    let dotted = store(nil, .auto, bucket: "my.bucket")
    let d = dotted.request(.getObject, "GET", fullKey: "k")
    #expect(d.host == "s3.eu-west-1.amazonaws.com" && d.encodedPath == "/my.bucket/k")
  }

  /// The store builds the AWS documentation's GET object example exactly: same host, path,
  /// headers and therefore signature.
  @Test func storeRequestsMatchTheAWSExample() throws {
    let s = S3Store(
      configuration: S3Configuration(
        bucket: "examplebucket", region: "us-east-1",
        credentials: S3Credentials(
          accessKeyID: "AKIAIOSFODNN7EXAMPLE",
          secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")))
    let r = s.request(
      .getObject, "GET", fullKey: try s.fullKey("test.txt"),
      headers: [S3Store.rangeHeader(ByteRange(0, 10))])
    #expect(r.baseURL == "https://examplebucket.s3.us-east-1.amazonaws.com")
    let signed = s.signer.sign(
      method: r.method, encodedPath: r.encodedPath, query: r.query,
      headers: [("host", "examplebucket.s3.amazonaws.com")] + r.headers,
      payloadHash: r.payloadHash, date: Date(timeIntervalSince1970: 1_369_353_600))
    #expect(signed.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
  }

  @Test func customEndpoints() {
    let path = store("http://127.0.0.1:9000", .auto)
    let r = path.request(.putObject, "PUT", fullKey: "pre/k")
    #expect(r.baseURL == "http://127.0.0.1:9000" && r.host == "127.0.0.1:9000")
    #expect(r.encodedPath == "/bkt/pre/k")
    let virt = store("https://storage.example.com:443/base/", .virtualHosted)
    let v = virt.request(.putObject, "PUT", fullKey: "k")
    #expect(v.baseURL == "https://bkt.storage.example.com" && v.encodedPath == "/base/k")
    let list = store("http://minio:9000", .path).request(.listObjects, "GET", fullKey: nil)
    #expect(list.encodedPath == "/bkt")
  }

  @Test func payloadHashes() {
    let s = store(nil, .auto)
    let small = s.request(.putObject, "PUT", fullKey: "k", body: .data(Data("abc".utf8)))
    #expect(small.payloadHash == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    let file = s.request(
      .putObject, "PUT", fullKey: "k", body: .file(URL(fileURLWithPath: "/x"), nil))
    #expect(file.payloadHash == "UNSIGNED-PAYLOAD")
  }

  @Test func keyValidation() {
    let s = store(nil, .auto)
    #expect(throws: StoreError.invalidKey("")) { try s.fullKey("") }
    #expect(throws: StoreError.invalidKey(String(repeating: "k", count: 1100))) {
      try s.fullKey(String(repeating: "k", count: 1100))
    }
  }

  @Test func errorMapping() {
    func map(_ status: Int, _ code: String?) -> StoreError {
      var r = HTTPResponse(status: status, headers: [:], body: Data())
      r.errorCode = code
      return S3Store.mapError(r, key: "k", range: ByteRange(1, 2))
    }
    #expect(map(404, "NoSuchKey") == .notFound(key: "k"))
    #expect(map(404, "NoSuchUpload") == .notFound(key: "k"))
    if case .unavailable = map(404, "NoSuchBucket") {} else { Issue.record("NoSuchBucket") }
    #expect(map(412, "PreconditionFailed") == .preconditionFailed(key: "k"))
    #expect(map(409, "ConditionalRequestConflict") == .preconditionFailed(key: "k"))
    #expect(map(416, "InvalidRange") == .invalidRange(key: "k", range: ByteRange(1, 2)))
    if case .accessDenied = map(403, "AccessDenied") {} else { Issue.record("403") }
    if case .transient = map(503, "SlowDown") {} else { Issue.record("503") }
    if case .transient = map(400, "RequestTimeout") {} else { Issue.record("RequestTimeout") }
    if case .transient = map(429, nil) {} else { Issue.record("429") }
    if case .unsupported = map(400, "InvalidPart") {} else { Issue.record("400") }
    let moved = S3Store.mapError(
      HTTPResponse(status: 301, headers: ["x-amz-bucket-region": "eu-north-1"], body: Data()),
      key: "k", range: nil)
    #expect(moved.description.contains("eu-north-1"))
    #expect(!CurlTransport.isRetryable(HTTPResponse(status: 412, headers: [:], body: Data())))
    #expect(!CurlTransport.isRetryable(HTTPResponse(status: 404, headers: [:], body: Data())))
    #expect(!CurlTransport.isRetryable(HTTPResponse(status: 403, headers: [:], body: Data())))
  }

  @Test func errorBodies() {
    var r = HTTPResponse(
      status: 200, headers: [:],
      body: Data(
        "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>m</Message></Error>".utf8))
    CurlTransport.parseError(&r)
    #expect(r.status == 503 && r.errorCode == "SlowDown" && r.errorMessage == "m")
    var wrapped = HTTPResponse(
      status: 404, headers: [:],
      body: Data("<Response><Errors><Error><Code>NoSuchKey</Code></Error></Errors></Response>".utf8)
    )
    CurlTransport.parseError(&wrapped)
    #expect(wrapped.errorCode == "NoSuchKey")
  }

  @Test func backoffIsJitteredAndCapped() {
    var o = S3TransportOptions()
    o.initialBackoff = 0.2
    o.maxBackoff = 10
    let t = CurlTransport(options: o, logger: .init(label: "t"))
    for attempt in 1...10 {
      let cap = min(10, 0.2 * pow(2, Double(attempt - 1)))
      let d = t.backoff(attempt: attempt)
      #expect(d >= cap / 2 && d <= cap)
    }
  }

  @Test func dates() {
    #expect(S3Date.parseISO8601("2009-10-12T17:50:30.000Z")?.timeIntervalSince1970 == 1_255_369_830)
    #expect(
      S3Date.parseHTTP("Mon, 12 Oct 2009 17:50:30 GMT")?.timeIntervalSince1970 == 1_255_369_830)
    #expect(S3Date.parseISO8601("garbage") == nil)
  }
}
