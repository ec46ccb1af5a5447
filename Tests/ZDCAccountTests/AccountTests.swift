import Foundation
import Testing
import ZDCAccount
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCTestSupport

@Suite struct KeystoreTests {
  let bundle = PrivateKeyBundle(userID: SecureRandom.userID(), keyPair: .generate())

  @Test func passphraseAndRecoveryOpenWrongOnesDoNot() throws {
    let rk = try RecoveryKey.generate(userID: bundle.userID)
    let sealed = try Keystore.seal(
      bundle, passphrase: "correct horse", recoveryKey: rk, kdf: .minimum)
    #expect(try Keystore.open(sealed, passphrase: "correct horse") == bundle)
    #expect(try Keystore.open(sealed, recoveryKey: rk) == bundle)
    #expect(throws: CryptoError.wrongPassphrase) { try Keystore.open(sealed, passphrase: "wrong") }
    let other = try RecoveryKey.generate(userID: bundle.userID)
    #expect(throws: CryptoError.wrongPassphrase) { try Keystore.open(sealed, recoveryKey: other) }
    #expect(try Keystore.userID(of: sealed) == bundle.userID)
  }

  @Test func rewrapChangesOnlyThePassphrase() throws {
    let rk = try RecoveryKey.generate(userID: bundle.userID)
    let sealed = try Keystore.seal(bundle, passphrase: "old", recoveryKey: rk, kdf: .minimum)
    let changed = try Keystore.rewrap(sealed, opening: .passphrase("old"), newPassphrase: "new")
    #expect(try Keystore.open(changed, passphrase: "new") == bundle)
    #expect(throws: CryptoError.wrongPassphrase) { try Keystore.open(changed, passphrase: "old") }
    // The recovery key still opens it.
    #expect(try Keystore.open(changed, recoveryKey: rk) == bundle)
    // With the recovery key instead of the passphrase (a forgotten one).
    let reset = try Keystore.rewrap(changed, opening: .recoveryKey(rk), newPassphrase: "third")
    #expect(try Keystore.open(reset, with: .passphrase("third")) == bundle)
    #expect(throws: CryptoError.wrongPassphrase) {
      try Keystore.rewrap(reset, opening: .passphrase("new"), newPassphrase: "x")
    }
    // A keystore without a recovery wrap (a device's) cannot be opened by one.
    let device = try Keystore.seal(bundle, passphrase: "d", recoveryKey: nil, kdf: .minimum)
    #expect(try !Keystore.hasRecoveryWrap(device) && Keystore.hasRecoveryWrap(reset))
    #expect(throws: CryptoError.self) {
      try Keystore.rewrap(device, opening: .recoveryKey(rk), newPassphrase: "x")
    }
  }

  @Test func emptyPassphraseWorks() throws {
    let sealed = try Keystore.seal(bundle, passphrase: "", recoveryKey: nil, kdf: .minimum)
    #expect(try Keystore.open(sealed, passphrase: "") == bundle)
    #expect(throws: (any Error).self) {
      try Keystore.open(sealed, recoveryKey: try RecoveryKey.generate(userID: bundle.userID))
    }
  }

  @Test func noSecretInTheSealedFile() throws {
    let sealed = try Keystore.seal(bundle, passphrase: "pw", recoveryKey: nil, kdf: .minimum)
    #expect(sealed.range(of: bundle.keyPair.boxSecretKey) == nil)
    #expect(sealed.range(of: Data(bundle.keyPair.boxSecretKey.base64EncodedString().utf8)) == nil)
    #expect(sealed.range(of: Data("pw\"".utf8)) == nil)
  }

  @Test func tamperedKeystoreIsRejected() throws {
    let sealed = try Keystore.seal(bundle, passphrase: "pw", recoveryKey: nil, kdf: .minimum)
    var json = try #require(try JSONSerialization.jsonObject(with: sealed) as? [String: Any])
    var b = try #require(json["bundle"] as? [String: Any])
    let ctText = try #require(b["ciphertext"] as? String)
    var ct = try #require(Data(base64Encoded: ctText))
    ct[ct.count / 2] ^= 1
    b["ciphertext"] = ct.base64EncodedString()
    json["bundle"] = b
    let tampered = try JSONSerialization.data(withJSONObject: json)
    #expect(throws: CryptoError.self) { try Keystore.open(tampered, passphrase: "pw") }
    #expect(throws: CryptoError.self) { try Keystore.open(Data("garbage".utf8), passphrase: "pw") }
  }

  @Test func recoveryKeyTextRoundTrip() throws {
    let rk = try RecoveryKey.generate(userID: bundle.userID)
    let text = rk.description
    #expect(text.split(separator: "-").count == 21)
    #expect(try RecoveryKey(text: text) == rk)
    #expect(
      try RecoveryKey(text: " " + text.uppercased().replacingOccurrences(of: "-", with: " ")) == rk)
    #expect(throws: CryptoError.self) { try RecoveryKey(text: "not-a-key") }
  }

  @Test func publicKeyDocumentIsSelfSigned() throws {
    let doc = try PublicKeyDocument(bundle: bundle)
    let data = try doc.encoded()
    #expect(try PublicKeyDocument.decode(data) == doc)
    var forged = doc
    forged.boxPublicKey = UserKeyPair.generate().boxPublicKey
    #expect(throws: CryptoError.self) { try PublicKeyDocument.decode(try forged.encoded()) }
  }
}

@Suite struct AccountTests {
  @Test func createJoinOpen() throws {
    let tmp = try TemporaryDirectory("account")
    let storeDir = tmp.path("store")
    let dev1 = StateDirectory(url: tmp.path("dev1"))
    let (a1, recovery) = try Account.create(
      stateDirectory: dev1, store: .localFolder(path: storeDir.path), passphrase: "pw",
      deviceName: "laptop", storeKDF: .minimum, localKDF: .minimum)
    #expect(dev1.isInitialized)
    // The catalog holds the user with its four trunks.
    let home = try a1.catalog.read(a1.config.userID) { try $0.trunkNode(.home) }
    #expect(home?.dirPrefix == Trunk.home.dirPrefix)
    let mode = try FileManager.default.attributesOfItem(atPath: dev1.url.path)[.posixPermissions]
    #expect((mode as? NSNumber)?.intValue == 0o700)
    let ksMode = try FileManager.default.attributesOfItem(atPath: dev1.keystoreURL.path)[
      .posixPermissions]
    #expect((ksMode as? NSNumber)?.intValue == 0o600)

    // Same user again on this state dir: refused.
    #expect(throws: AccountError.alreadyInitialized(dev1.url.path)) {
      _ = try Account.create(
        stateDirectory: dev1, store: .localFolder(path: storeDir.path), passphrase: "pw",
        storeKDF: .minimum, localKDF: .minimum)
    }

    // Second device joins with the passphrase, third with the recovery key.
    let dev2 = StateDirectory(url: tmp.path("dev2"))
    let a2 = try Account.join(
      stateDirectory: dev2, store: .localFolder(path: storeDir.path),
      credential: .passphrase("pw"), deviceName: "desktop", localKDF: .minimum)
    #expect(a2.config.userID == a1.config.userID)
    #expect(a2.keys == a1.keys)
    #expect(a2.config.deviceID != a1.config.deviceID)

    let dev3 = StateDirectory(url: tmp.path("dev3"))
    let a3 = try Account.join(
      stateDirectory: dev3, store: .localFolder(path: storeDir.path),
      credential: .recoveryKey(recovery), localPassphrase: "newpw", localKDF: .minimum)
    #expect(a3.keys == a1.keys)
    #expect(try Account.open(stateDirectory: dev3, passphrase: "newpw").keys == a1.keys)
    #expect(throws: CryptoError.wrongPassphrase) {
      _ = try Account.open(stateDirectory: dev3, passphrase: "pw")
    }

    // Wrong passphrase cannot join.
    #expect(throws: CryptoError.wrongPassphrase) {
      _ = try Account.join(
        stateDirectory: StateDirectory(url: tmp.path("dev4")),
        store: .localFolder(path: storeDir.path), credential: .passphrase("nope"),
        localKDF: .minimum)
    }

    // The store never holds a private key or the passphrase in the clear.
    let secrets = [
      a1.keys.keyPair.boxSecretKey, a1.keys.keyPair.signSecretKey,
      Data(a1.keys.keyPair.boxSecretKey.base64EncodedString().utf8),
      Data(a1.keys.keyPair.signSecretKey.base64EncodedString().utf8),
      recovery.secret, Data(recovery.secret.base64EncodedString().utf8),
    ]
    #expect(try findPlaintext(secrets, under: storeDir).isEmpty)
    #expect(try findPlaintext(secrets, under: dev1.url).isEmpty)
  }

  @Test func joinWithoutUserInStoreFails() throws {
    let tmp = try TemporaryDirectory("account")
    #expect(throws: AccountError.noUserInStore) {
      _ = try Account.join(
        stateDirectory: StateDirectory(url: tmp.path("dev")),
        store: .localFolder(path: tmp.path("store").path), credential: .passphrase("pw"),
        localKDF: .minimum)
    }
  }

  @Test func stateDirectoryResolution() {
    #expect(
      StateDirectory.resolve(explicit: "/x", environment: ["ZDC_STATE_DIR": "/y"]).url.path == "/x")
    #expect(
      StateDirectory.resolve(explicit: nil, environment: ["ZDC_STATE_DIR": "/y"]).url.path == "/y")
    #expect(
      StateDirectory.resolve(explicit: nil, environment: ["XDG_STATE_HOME": "/s", "HOME": "/h"]).url
        .path == "/s/zdcfs")
    #expect(
      StateDirectory.resolve(explicit: nil, environment: ["HOME": "/h"]).url.path
        == "/h/.local/state/zdcfs")
  }
}

/// The `zdc` binary, driven as a user would.
@Suite struct CLITests {
  let zdc = BuiltProducts.executable("zdc")

  @Test func versionAndHelp() throws {
    let v = try runProcess(zdc, ["--version"])
    #expect(v.status == 0)
    #expect(v.stdout.hasPrefix("zdc "))
    #expect(v.stdout.contains("libfuse 3."))
    let h = try runProcess(zdc, ["--help"])
    #expect(h.status == 0)
    #expect(h.stdout.contains("encrypted"))
    #expect(h.stdout.contains("init"))
  }

  @Test func initJoinAndExitCodes() throws {
    let tmp = try TemporaryDirectory("cli")
    let store = tmp.path("store").path
    let env = ["HOME": tmp.url.path]
    let passFile = tmp.path("pass")
    try "s3cret\n".write(to: passFile, atomically: true, encoding: .utf8)

    let created = try runProcess(
      zdc,
      [
        "init", "--state-dir", tmp.path("d1").path, "--store", store, "--passphrase-file",
        passFile.path, "--kdf", "minimum", "--device-name", "one",
      ], environment: env)
    #expect(created.status == 0, "\(created.stderr)")
    let line = try #require(
      created.stdout.split(separator: "\n").first { $0.hasPrefix("  ") && $0.contains("-") })
    let recovery = try RecoveryKey(text: String(line))

    // Same state dir again: 73 (already exists).
    let again = try runProcess(
      zdc, ["init", "--state-dir", tmp.path("d1").path, "--store", store, "--kdf", "minimum"],
      environment: env.merging(["ZDC_PASSPHRASE": "s3cret"]) { $1 })
    #expect(again.status == 73)
    #expect(again.stderr.contains("already exists"))

    // Join with the passphrase from the environment.
    let joined = try runProcess(
      zdc, ["init", "--join", "--store", store, "--kdf", "minimum"],
      environment: env.merging(["ZDC_PASSPHRASE": "s3cret", "ZDC_STATE_DIR": tmp.path("d2").path]) {
        $1
      })
    #expect(joined.status == 0, "\(joined.stderr)")
    #expect(joined.stdout.contains(recovery.userID))

    // Join with a wrong passphrase: 77.
    let wrong = try runProcess(
      zdc,
      ["init", "--join", "--state-dir", tmp.path("d3").path, "--store", store, "--kdf", "minimum"],
      environment: env.merging(["ZDC_PASSPHRASE": "nope"]) { $1 })
    #expect(wrong.status == 77)
    #expect(wrong.stderr.contains("wrong passphrase"))

    // Join with the recovery key.
    let rkFile = tmp.path("rk")
    try recovery.description.write(to: rkFile, atomically: true, encoding: .utf8)
    let viaRecovery = try runProcess(
      zdc,
      [
        "init", "--join", "--state-dir", tmp.path("d4").path, "--store", store,
        "--recovery-key-file", rkFile.path, "--kdf", "minimum",
      ],
      environment: env.merging(["ZDC_PASSPHRASE": "device4"]) { $1 })
    #expect(viaRecovery.status == 0, "\(viaRecovery.stderr)")

    // No passphrase source and no terminal: a usage error, not a hang.
    let noPass = try runProcess(
      zdc, ["init", "--state-dir", tmp.path("d5").path, "--store", store], environment: env)
    #expect(noPass.status == 64)
    #expect(noPass.stderr.contains("ZDC_PASSPHRASE"))

    // Default state dir and store follow HOME (XDG defaults).
    let defaults = try runProcess(
      zdc, ["init", "--kdf", "minimum"], environment: env.merging(["ZDC_PASSPHRASE": ""]) { $1 })
    #expect(defaults.status == 0, "\(defaults.stderr)")
    #expect(defaults.stderr.contains("empty passphrase"))
    #expect(FileManager.default.fileExists(atPath: tmp.path(".local/state/zdcfs/config.json").path))
    #expect(FileManager.default.fileExists(atPath: tmp.path(".local/share/zdcfs/store/users").path))
  }
}

/// `zdc passwd`, driven as a user would.
@Suite struct PasswdTests {
  let zdc = BuiltProducts.executable("zdc")

  func run(_ args: [String], _ env: [String: String]) throws -> ProcessResult {
    try runProcess(zdc, args, environment: env)
  }

  /// True when this device's keystore opens with `passphrase`.
  func opens(_ dir: URL, _ passphrase: String) throws -> Bool {
    do {
      _ = try Account.open(
        stateDirectory: StateDirectory.resolve(explicit: dir.path), passphrase: passphrase)
      return true
    } catch CryptoError.wrongPassphrase {
      return false
    }
  }

  @Test func changesThePassphraseInTheStoreAndOnThisDevice() throws {
    let tmp = try TemporaryDirectory("passwd")
    let store = tmp.path("store").path
    let d1 = tmp.path("d1")
    let created = try run(
      ["init", "--state-dir", d1.path, "--store", store, "--kdf", "minimum"],
      ["ZDC_PASSPHRASE": "old"])
    try #require(created.status == 0, "\(created.stderr)")
    let line = try #require(
      created.stdout.split(separator: "\n").first { $0.hasPrefix("  ") && $0.contains("-") })
    let rkFile = tmp.path("rk")
    try String(line).write(to: rkFile, atomically: true, encoding: .utf8)
    func join(_ name: String, _ passphrase: String) throws -> Int32 {
      try run(
        [
          "init", "--join", "--state-dir", tmp.path(name).path, "--store", store, "--kdf",
          "minimum",
        ],
        ["ZDC_PASSPHRASE": passphrase]
      ).status
    }

    // A wrong current passphrase changes nothing.
    let wrong = try run(
      ["passwd", "--state-dir", d1.path, "--kdf", "minimum"],
      ["ZDC_PASSPHRASE": "nope", "ZDC_NEW_PASSPHRASE": "new"])
    #expect(wrong.status == 77 && wrong.stderr.contains("wrong passphrase"), "\(wrong.stderr)")
    #expect(try opens(d1, "old"))

    let changed = try run(
      ["passwd", "--state-dir", d1.path, "--kdf", "minimum"],
      ["ZDC_PASSPHRASE": "old", "ZDC_NEW_PASSPHRASE": "new"])
    #expect(changed.status == 0, "\(changed.stderr)")
    #expect(try opens(d1, "new") && !opens(d1, "old"))
    // New devices join with the new passphrase only.
    #expect(try join("d2", "old") == 77)
    #expect(try join("d2", "new") == 0)

    // A forgotten passphrase: reset with the recovery key, which stays valid.
    let reset = try run(
      ["passwd", "--state-dir", d1.path, "--recovery-key-file", rkFile.path, "--kdf", "minimum"],
      ["ZDC_NEW_PASSPHRASE": "third"])
    #expect(reset.status == 0, "\(reset.stderr)")
    #expect(try opens(d1, "third") && !opens(d1, "new"))
    #expect(try join("d3", "third") == 0)
    let viaRecovery = try run(
      [
        "init", "--join", "--state-dir", tmp.path("d4").path, "--store", store,
        "--recovery-key-file", rkFile.path, "--kdf", "minimum",
      ], ["ZDC_PASSPHRASE": "device4"])
    #expect(viaRecovery.status == 0, "\(viaRecovery.stderr)")

    // One device's own passphrase: the store's copy keeps the account's.
    let mine = try run(
      ["passwd", "--device-only", "--state-dir", tmp.path("d2").path, "--kdf", "minimum"],
      ["ZDC_PASSPHRASE": "new", "ZDC_NEW_PASSPHRASE": "mine"])
    #expect(mine.status == 0, "\(mine.stderr)")
    #expect(try opens(tmp.path("d2"), "mine"))
    #expect(try join("d5", "third") == 0)
    // That device's passphrase does not open the store's copy: refused, nothing changed.
    let differs = try run(
      ["passwd", "--state-dir", tmp.path("d2").path, "--kdf", "minimum"],
      ["ZDC_PASSPHRASE": "mine", "ZDC_NEW_PASSPHRASE": "x"])
    #expect(differs.status == 77 && differs.stderr.contains("another passphrase"))
    #expect(try opens(tmp.path("d2"), "mine"))
    #expect(try join("d6", "third") == 0)
  }
}

@Suite struct KeyDerivationTests {
  @Test func deterministicPerPurposeAndSecret() throws {
    let s1 = SecureRandom.bytes(32)
    let s2 = SecureRandom.bytes(32)
    let a = try KeyDerivation.key(for: .changeLog, secret: s1)
    #expect(a.count == 32)
    #expect(a == (try KeyDerivation.key(for: .changeLog, secret: s1)))
    #expect(a != (try KeyDerivation.key(for: .localCache, secret: s1)))
    #expect(a != (try KeyDerivation.key(for: .changeLog, secret: s2)))
    #expect(throws: CryptoError.self) { try KeyDerivation.key(for: .changeLog, secret: Data()) }
  }
}
