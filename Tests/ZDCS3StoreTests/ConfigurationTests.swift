import Foundation
import Testing
import ZDCS3Store
import ZDCTestSupport

@Suite struct ConfigurationTests {
  @Test func parsesStoreURLs() throws {
    let a = try S3Configuration.parseStoreURL("s3://my-bucket/some/prefix")
    #expect(a.bucket == "my-bucket" && a.prefix == "some/prefix/")
    let b = try S3Configuration.parseStoreURL("s3://bucket")
    #expect(b.bucket == "bucket" && b.prefix == "")
    let c = try S3Configuration.parseStoreURL("S3://bucket//p//")
    #expect(c.prefix == "p/")
    #expect(throws: S3ConfigurationError.self) { try S3Configuration.parseStoreURL("http://x/y") }
    #expect(throws: S3ConfigurationError.self) { try S3Configuration.parseStoreURL("s3:///p") }
  }

  @Test func resolvesFromEnvironment() throws {
    let home = try TempDir()
    defer { home.cleanup() }
    let env = [
      "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "secret-env",
      "AWS_SESSION_TOKEN": "tok", "AWS_REGION": "eu-central-1",
      "AWS_DEFAULT_REGION": "us-west-2", "AWS_ENDPOINT_URL": "http://generic:1",
      "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000", "HOME": home.url.path,
    ]
    let c = try S3Configuration.resolve(storeURL: "s3://b/p", environment: env)
    #expect(c.bucket == "b" && c.prefix == "p/")
    #expect(
      c.credentials
        == S3Credentials(accessKeyID: "AKENV", secretAccessKey: "secret-env", sessionToken: "tok"))
    #expect(c.region == "eu-central-1")
    #expect(c.endpoint?.absoluteString == "http://127.0.0.1:9000")
    #expect(c.addressingStyle == .auto)

    var env2 = env
    env2["AWS_REGION"] = nil
    env2["AWS_ENDPOINT_URL_S3"] = nil
    let d = try S3Configuration.resolve(storeURL: "s3://b", environment: env2)
    #expect(d.region == "us-west-2")
    #expect(d.endpoint?.absoluteString == "http://generic:1")

    // Explicit arguments win.
    let e = try S3Configuration.resolve(
      storeURL: "s3://b", endpoint: "https://s3.example.com", region: "ap-south-1",
      addressingStyle: .virtualHosted, environment: env)
    #expect(e.endpoint?.absoluteString == "https://s3.example.com" && e.region == "ap-south-1")
    #expect(e.addressingStyle == .virtualHosted)
    #expect(throws: S3ConfigurationError.self) {
      try S3Configuration.resolve(storeURL: "s3://b", endpoint: "ftp://x", environment: env)
    }
  }

  @Test func resolvesFromProfileFiles() throws {
    let home = try TempDir()
    defer { home.cleanup() }
    let aws = home.url.appendingPathComponent(".aws")
    try FileManager.default.createDirectory(at: aws, withIntermediateDirectories: true)
    try """
    # comment
    [default]
    aws_access_key_id = AKDEFAULT
    aws_secret_access_key = secret-default

    [work]
    aws_access_key_id=AKWORK
    aws_secret_access_key=secret-work
    aws_session_token = worktoken
    """.write(to: aws.appendingPathComponent("credentials"), atomically: true, encoding: .utf8)
    try """
    [default]
    region = eu-west-3

    [profile work]
    region = ca-central-1
    endpoint_url = http://127.0.0.1:4566
    s3 =
      addressing_style = path

    [profile keys-in-config]
    aws_access_key_id = AKCONFIG
    aws_secret_access_key = secret-config
    """.write(to: aws.appendingPathComponent("config"), atomically: true, encoding: .utf8)

    let base = ["HOME": home.url.path]
    let d = try S3Configuration.resolve(storeURL: "s3://b", environment: base)
    #expect(d.credentials.accessKeyID == "AKDEFAULT" && d.credentials.sessionToken == nil)
    #expect(d.region == "eu-west-3" && d.endpoint == nil)

    let w = try S3Configuration.resolve(
      storeURL: "s3://b", environment: base.merging(["AWS_PROFILE": "work"]) { $1 })
    #expect(
      w.credentials
        == S3Credentials(
          accessKeyID: "AKWORK", secretAccessKey: "secret-work", sessionToken: "worktoken"))
    #expect(w.region == "ca-central-1")
    #expect(w.endpoint?.absoluteString == "http://127.0.0.1:4566")
    #expect(w.addressingStyle == .path)

    let k = try S3Configuration.resolve(
      storeURL: "s3://b", profile: "keys-in-config", environment: base)
    #expect(k.credentials.accessKeyID == "AKCONFIG")
    #expect(k.region == "us-east-1")

    // Environment credentials beat the files; a missing profile is an error.
    let e = try S3Configuration.resolve(
      storeURL: "s3://b",
      environment: base.merging(["AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "s"]) { $1 }
    )
    #expect(e.credentials.accessKeyID == "AKENV")
    #expect(throws: S3ConfigurationError.missingCredentials(profile: "nope")) {
      try S3Configuration.resolve(storeURL: "s3://b", profile: "nope", environment: base)
    }
  }

  @Test func descriptionHidesSecrets() throws {
    let c = try S3Configuration.resolve(
      storeURL: "s3://bkt/pre", endpoint: "http://127.0.0.1:1",
      environment: [
        "AWS_ACCESS_KEY_ID": "AKVISIBLE", "AWS_SECRET_ACCESS_KEY": "TOPSECRET",
        "AWS_SESSION_TOKEN": "SESSIONSECRET", "HOME": "/nonexistent",
      ])
    var dumped = ""
    dump(c, to: &dumped)
    for text in [c.description, String(reflecting: c), dumped] {
      #expect(!text.contains("TOPSECRET") && !text.contains("SESSIONSECRET"))
    }
    #expect(c.description.contains("AKVISIBLE") && c.description.contains("s3://bkt/pre/"))
  }
}
