import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

/// `zdc init` on an S3 store (a local moto_server), driven as a user would.
@Suite(.motoServer) struct S3InitTests {
  let zdc = BuiltProducts.executable("zdc")

  /// A secret that must never be written anywhere (moto accepts any credentials).
  let secret = "zdc-secret-\(UUID().uuidString)"

  func env(_ tmp: TemporaryDirectory, _ extra: [String: String] = [:]) -> [String: String] {
    [
      "HOME": tmp.url.path, "ZDC_PASSPHRASE": "s3 passphrase", "AWS_ACCESS_KEY_ID": "testing",
      "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
      "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": "", "AWS_REGION": "",
      "AWS_DEFAULT_REGION": "",
    ].merging(extra) { $1 }
  }

  func bucketName() -> String { "zdc-init-\(UUID().uuidString.lowercased().prefix(12))" }

  @Test func initAndJoinRecordTheBucketButNoSecret() throws {
    let server = try MotoServer.require()
    let tmp = try TemporaryDirectory("s3-init")
    let bucket = bucketName()
    let created = try runProcess(
      zdc,
      [
        "init", "--kdf", "minimum", "--state-dir", tmp.path("a").path, "--store",
        "s3://\(bucket)/my/prefix", "--endpoint", server.endpoint, "--region", "eu-west-3",
        "--path-style", "--create-bucket", "--device-name", "one",
      ], environment: env(tmp))
    #expect(created.status == 0, "\(created.stderr)")
    #expect(created.stdout.contains("Store: s3://\(bucket)/my/prefix/ at \(server.endpoint)"))

    // The config records where the bucket is, never a credential.
    let config =
      try JSONSerialization.jsonObject(
        with: Data(contentsOf: tmp.path("a/config.json"))) as? [String: Any]
    let s3 = try #require((config?["store"] as? [String: Any])?["s3"] as? [String: Any])
    #expect(s3["bucket"] as? String == bucket)
    #expect(s3["prefix"] as? String == "my/prefix/")
    #expect(s3["endpoint"] as? String == server.endpoint)
    #expect(s3["region"] as? String == "eu-west-3")
    #expect(s3["addressing"] as? String == "path")
    let leaks = try findPlaintext(
      [Data(secret.utf8), Data("testing".utf8)], under: tmp.path("a"))
    #expect(leaks.isEmpty, "\(leaks)")
    #expect(!created.stdout.contains(secret) && !created.stderr.contains(secret))

    // Every object lives under the prefix; the probe left nothing behind.
    var whole = try server.configuration()
    whole.bucket = bucket
    whole.region = "eu-west-3"
    let raw = S3Store(configuration: whole)
    let keys = try raw.listAll(prefix: "").map(\.key)
    #expect(!keys.isEmpty)
    #expect(keys.allSatisfy { $0.hasPrefix("my/prefix/") }, "\(keys)")
    #expect(!keys.contains { $0.contains("zdc-probe") }, "\(keys)")

    // Another device joins with credentials from a profile and the endpoint from the
    // environment, the AWS way.
    let aws = tmp.path(".aws")
    try FileManager.default.createDirectory(at: aws, withIntermediateDirectories: true)
    try "[work]\naws_access_key_id = testing\naws_secret_access_key = \(secret)\n"
      .write(to: aws.appendingPathComponent("credentials"), atomically: true, encoding: .utf8)
    try "[profile work]\nregion = eu-west-3\n"
      .write(to: aws.appendingPathComponent("config"), atomically: true, encoding: .utf8)
    let joined = try runProcess(
      zdc,
      [
        "init", "--join", "--kdf", "minimum", "--state-dir", tmp.path("b").path, "--store",
        "s3://\(bucket)/my/prefix",
      ],
      environment: env(
        tmp,
        [
          "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": "work",
          "AWS_ENDPOINT_URL": server.endpoint,
        ]))
    #expect(joined.status == 0, "\(joined.stderr)")
    #expect(joined.stdout.contains("Joined user"))
    #expect(try findPlaintext([Data(secret.utf8)], under: tmp.path("b")).isEmpty)
    // The endpoint was recorded: without AWS_ENDPOINT_URL the store is still found.
    let b =
      try JSONSerialization.jsonObject(
        with: Data(contentsOf: tmp.path("b/config.json"))) as? [String: Any]
    let bs3 = try #require((b?["store"] as? [String: Any])?["s3"] as? [String: Any])
    #expect(bs3["endpoint"] as? String == server.endpoint)
    #expect(bs3["region"] as? String == "eu-west-3")
  }

  @Test func storesIgnoringConditionalWritesAreRefusedUnlessAccepted() throws {
    let server = try MotoServer.require()
    let proxy = try FaultProxy(upstreamPort: server.port)
    defer { proxy.stop() }
    proxy.stripConditionalHeaders(true)
    let tmp = try TemporaryDirectory("s3-init")
    let bucket = bucketName()
    let refused = try runProcess(
      zdc,
      [
        "init", "--kdf", "minimum", "--state-dir", tmp.path("a").path, "--store",
        "s3://\(bucket)", "--endpoint", proxy.endpoint, "--create-bucket",
      ], environment: env(tmp))
    #expect(refused.status == 76, "\(refused.stderr)")
    #expect(refused.stderr.contains("does not honour conditional writes"), "\(refused.stderr)")
    #expect(refused.stderr.contains("--allow-unconditional-writes"))
    #expect(!FileManager.default.fileExists(atPath: tmp.path("a/config.json").path))

    let accepted = try runProcess(
      zdc,
      [
        "init", "--kdf", "minimum", "--state-dir", tmp.path("a").path, "--store",
        "s3://\(bucket)", "--endpoint", proxy.endpoint, "--allow-unconditional-writes",
      ], environment: env(tmp))
    #expect(accepted.status == 0, "\(accepted.stderr)")
    #expect(accepted.stderr.contains("warning: the store"), "\(accepted.stderr)")
    let config = try String(contentsOf: tmp.path("a/config.json"), encoding: .utf8)
    #expect(config.contains("\"unconditionalWritesAccepted\" : true"), "\(config)")

    // The same bucket without the header-dropping proxy passes the probe.
    let direct = try runProcess(
      zdc,
      [
        "init", "--join", "--kdf", "minimum", "--state-dir", tmp.path("b").path, "--store",
        "s3://\(bucket)", "--endpoint", server.endpoint,
      ], environment: env(tmp))
    #expect(direct.status == 0, "\(direct.stderr)")
    #expect(!direct.stderr.contains("warning"), "\(direct.stderr)")
  }

  @Test func clearMessagesForMissingBucketDeadEndpointAndNoCredentials() throws {
    let server = try MotoServer.require()
    let tmp = try TemporaryDirectory("s3-init")
    func initOn(_ store: String, _ extra: [String] = [], env e: [String: String] = [:]) throws
      -> ProcessResult
    {
      try runProcess(
        zdc,
        ["init", "--kdf", "minimum", "--state-dir", tmp.path("x").path, "--store", store] + extra,
        environment: env(tmp, e))
    }
    let missing = try initOn("s3://\(bucketName())/p", ["--endpoint", server.endpoint])
    #expect(missing.status == 69, "\(missing.stderr)")
    #expect(missing.stderr.contains("does not exist"), "\(missing.stderr)")
    #expect(missing.stderr.contains("--create-bucket"))

    let down = try initOn(
      "s3://\(bucketName())", ["--endpoint", "http://127.0.0.1:\(try freeLoopbackPort())"])
    #expect(down.status == 69, "\(down.stderr)")
    #expect(down.stderr.contains("cannot reach the store"), "\(down.stderr)")
    #expect(!down.stderr.contains("notice"), "retry notices on the terminal: \(down.stderr)")

    let noCredentials = try initOn(
      "s3://\(bucketName())", ["--endpoint", server.endpoint],
      env: ["AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""])
    #expect(noCredentials.status == 77, "\(noCredentials.stderr)")
    #expect(noCredentials.stderr.contains("no AWS credentials"), "\(noCredentials.stderr)")

    let bad = try initOn("s3://", ["--endpoint", server.endpoint])
    #expect(bad.status == 64, "\(bad.stderr)")
    let misplaced = try runProcess(
      zdc,
      [
        "init", "--kdf", "minimum", "--state-dir", tmp.path("x").path, "--store",
        tmp.path("folder").path, "--endpoint", server.endpoint,
      ], environment: env(tmp))
    #expect(misplaced.status == 64, "\(misplaced.stderr)")
    #expect(!FileManager.default.fileExists(atPath: tmp.path("x/config.json").path))
  }
}

/// `zdc init` against a moto_server that checks signatures and permissions.
@Suite(.motoServerAuthenticated) struct S3InitAccessTests {
  let zdc = BuiltProducts.executable("zdc")

  @Test func refusedCredentialsExitWith77() throws {
    let server = try MotoServer.require()
    let store = try server.makeStore()
    let tmp = try TemporaryDirectory("s3-init-auth")
    let r = try runProcess(
      zdc,
      [
        "init", "--kdf", "minimum", "--state-dir", tmp.path("a").path, "--store",
        "s3://\(store.configuration.bucket)", "--endpoint", server.endpoint,
      ],
      environment: [
        "HOME": tmp.url.path, "ZDC_PASSPHRASE": "pw",
        "AWS_ACCESS_KEY_ID": server.credentials.accessKeyID,
        "AWS_SECRET_ACCESS_KEY": "wrong-\(server.credentials.secretAccessKey)",
      ])
    #expect(r.status == 77, "\(r.stderr)")
    #expect(r.stderr.contains("refused access"), "\(r.stderr)")
    #expect(!r.stderr.contains(server.credentials.secretAccessKey))
    // The right credentials work.
    let ok = try runProcess(
      zdc,
      [
        "init", "--kdf", "minimum", "--state-dir", tmp.path("a").path, "--store",
        "s3://\(store.configuration.bucket)", "--endpoint", server.endpoint,
      ],
      environment: [
        "HOME": tmp.url.path, "ZDC_PASSPHRASE": "pw",
        "AWS_ACCESS_KEY_ID": server.credentials.accessKeyID,
        "AWS_SECRET_ACCESS_KEY": server.credentials.secretAccessKey,
      ])
    #expect(ok.status == 0, "\(ok.stderr)")
  }
}
