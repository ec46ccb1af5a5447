import Foundation
import Testing
import ZDCS3Store
import ZDCTestSupport

@Suite struct SigV4Tests {
  let credentials = S3Credentials(
    accessKeyID: "AKIAIOSFODNN7EXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
  )
  // 20130524T000000Z
  let date = Date(timeIntervalSince1970: 1_369_353_600)
  let emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

  /// The GET object example of the AWS S3 documentation ("Signature Calculations for the
  /// Authorization Header"): GET /test.txt with `Range: bytes=0-9`.
  @Test func awsDocumentationGetObjectExample() {
    let signer = SigV4Signer(credentials: credentials, region: "us-east-1")
    let signed = signer.sign(
      method: "GET", encodedPath: "/test.txt", query: [],
      headers: [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9")],
      payloadHash: emptyHash, date: date)
    #expect(
      signed.canonicalRequest == """
        GET
        /test.txt

        host:examplebucket.s3.amazonaws.com
        range:bytes=0-9
        x-amz-content-sha256:\(emptyHash)
        x-amz-date:20130524T000000Z

        host;range;x-amz-content-sha256;x-amz-date
        \(emptyHash)
        """)
    #expect(signed.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    #expect(
      signed.authorization
        == "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    #expect(SigV4Signer.payloadHash(Data()) == emptyHash)
  }

  @Test func sessionTokenIsSignedAndSent() {
    var c = credentials
    c.sessionToken = "token/with+chars"
    let signed = SigV4Signer(credentials: c, region: "eu-west-1").sign(
      method: "PUT", encodedPath: "/k", query: [], headers: [("host", "h")],
      payloadHash: SigV4Signer.unsignedPayload, date: date)
    #expect(
      signed.headers.contains { $0.name == "x-amz-security-token" && $0.value == c.sessionToken })
    #expect(
      signed.authorization.contains(
        "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token"))
    #expect(signed.authorization.contains("/20130524/eu-west-1/s3/aws4_request"))
    #expect(signed.canonicalRequest.hasSuffix("\nUNSIGNED-PAYLOAD"))
  }

  @Test func uriEncoding() {
    #expect(URIEncoding.encode("a b/c+d~e_f-g.h", keepSlash: true) == "a%20b/c%2Bd~e_f-g.h")
    #expect(URIEncoding.encode("a/b=c&d", keepSlash: false) == "a%2Fb%3Dc%26d")
    #expect(URIEncoding.encode("é*", keepSlash: true) == "%C3%A9%2A")
    #expect(
      SigV4Signer.canonicalQuery([("prefix", "a/b c"), ("list-type", "2"), ("uploads", "")])
        == "list-type=2&prefix=a%2Fb%20c&uploads=")
  }

  @Test func headerValuesAreTrimmedAndLowercased() {
    let signed = SigV4Signer(credentials: credentials, region: "us-east-1").sign(
      method: "GET", encodedPath: "/", query: [],
      headers: [("Host", "h"), ("X-Amz-Meta-A", "  a   b  ")], payloadHash: emptyHash, date: date)
    #expect(signed.canonicalRequest.contains("\nx-amz-meta-a:a b\n"))
  }

  @Test func credentialsNeverPrintSecrets() {
    let c = S3Credentials(accessKeyID: "AKID", secretAccessKey: "SECRETKEY", sessionToken: "TOKEN")
    let config = S3Configuration(bucket: "b", credentials: c)
    for text in [c.description, "\(c)", String(reflecting: c), config.description] {
      #expect(!text.contains("SECRETKEY"))
      #expect(!text.contains("TOKEN"))
    }
    #expect(config.description.contains("AKID"))
  }
}
