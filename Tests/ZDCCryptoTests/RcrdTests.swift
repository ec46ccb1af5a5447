import Foundation
import Testing
import ZDCCore

@testable import ZDCCrypto

/// A node with every RCRD field set.
func sampleNode(owner: String, name: String = "Quarterly Report.pdf") -> Node {
  Node(
    uuid: "local-only-uuid", localUserID: owner, parentID: 1, name: name, kind: .file,
    shareList: .owner(owner), burnDate: Date(timeIntervalSince1970: 1_900_000_000),
    encryptionKey: Data((0..<32).map { UInt8(0x80 + $0) }),
    dirSalt: Data((0..<20).map { UInt8(0x40 + $0) }),
    dirPrefix: "0123456789ABCDEF0123456789ABCDEF", cloudID: "00112233445566778899aabbccddeeff",
    mode: 0o644, mtime: FileTime(seconds: 1_700_000_000, nanoseconds: 123_456_789),
    xattrs: ["user.comment": Data("hello xattr".utf8), "user.bin": Data([0, 1, 2, 255])],
    symlinkTarget: nil, dataSize: 42)
}

@Suite struct RcrdTests {
  let alice = UserKeyPair.generate()
  let bob = UserKeyPair.generate()
  let aliceID = "alice-user-id"
  let bobID = "bob-user-id"

  func encoded(_ node: Node) throws -> Data {
    try Rcrd.encode(node: node, publicKeys: [aliceID: alice.boxPublicKey, bobID: bob.boxPublicKey])
  }

  /// A node's RCRD written again carries the key it carried (sealing is not done again), and
  /// each reader opens it; another node's key is sealed anew; a remembered box opens only for
  /// the key pair it was sealed to.
  @Test func rcrdsOfOneNodeCarryOneSealedKey() throws {
    var node = sampleNode(owner: aliceID)
    node.encryptionKey = SecureRandom.nodeKey()
    node.shareList.set(ShareItem(permissions: [.read]), for: .user(bobID))
    let first = try encoded(node)
    node.name = "renamed.pdf"
    node.dataSize = 7
    let second = try encoded(node)
    func wrapped(_ blob: Data, _ id: String, _ kp: UserKeyPair) throws -> Data? {
      try Rcrd.decode(blob, userID: id, keyPair: kp).shareList[.user(id)]?.wrappedKey
    }
    for (id, kp) in [(aliceID, alice), (bobID, bob)] {
      let a = try #require(try wrapped(first, id, kp))
      #expect(try wrapped(second, id, kp) == a)
      #expect(try kp.open(sealed: a) == node.encryptionKey)
      #expect(try Rcrd.decode(second, userID: id, keyPair: kp).nodeKey == node.encryptionKey)
      #expect(try Rcrd.decode(second, userID: id, keyPair: kp).meta.name == "renamed.pdf")
    }
    #expect(
      try wrapped(first, aliceID, alice) != wrapped(first, bobID, bob))
    var other = node
    other.encryptionKey = SecureRandom.nodeKey()
    let third = try encoded(other)
    #expect(try wrapped(third, aliceID, alice) != wrapped(first, aliceID, alice))
    #expect(try Rcrd.decode(third, userID: aliceID, keyPair: alice).nodeKey == other.encryptionKey)
    let box = try #require(try wrapped(first, aliceID, alice))
    #expect(throws: CryptoError.self) { try WrappedKeyMemo.shared.open(box, with: self.bob) }
  }

  @Test func roundTrip() throws {
    var node = sampleNode(owner: aliceID)
    node.shareList.set(ShareItem(permissions: [.read]), for: .user(bobID))
    node.shareList.set(ShareItem(permissions: [.write]), for: .user("carol"))
    let blob = try encoded(node)
    for (id, kp) in [(aliceID, alice), (bobID, bob)] {
      let d = try Rcrd.decode(blob, userID: id, keyPair: kp)
      #expect(d.cloudID == node.cloudID)
      #expect(d.dirPrefix == node.dirPrefix)
      #expect(d.nodeKey == node.encryptionKey)
      #expect(d.meta == RcrdMeta(node: node))
      #expect(d.burnDate == node.burnDate)
      #expect(d.shareList.userIDs == [aliceID, bobID, "carol"])
      #expect(d.shareList[.user(bobID)]?.permissions == [.read])
      #expect(d.shareList[.user(bobID)]?.wrappedKey != nil)
      #expect(d.shareList[.user("carol")]?.wrappedKey == nil)
    }
    #expect(throws: RcrdError.noKeyForUser(userID: "carol")) {
      try Rcrd.decode(blob, userID: "carol", keyPair: bob)
    }
    #expect(throws: RcrdError.userNotInKeys(userID: "mallory")) {
      try Rcrd.decode(blob, userID: "mallory", keyPair: bob)
    }
    #expect(throws: CryptoError.self) { try Rcrd.decode(blob, userID: bobID, keyPair: alice) }
  }

  @Test func symlinkAndNoBurnDate() throws {
    var node = sampleNode(owner: aliceID)
    node.kind = .symlink
    node.symlinkTarget = "../target/ü"
    node.burnDate = nil
    node.xattrs = [:]
    let d = try Rcrd.decode(encoded(node), userID: aliceID, keyPair: alice)
    #expect(d.meta.symlinkTarget == "../target/ü")
    #expect(d.meta.kind == .symlink)
    #expect(d.burnDate == nil)
  }

  @Test func missingPublicKeyIsAnError() {
    var node = sampleNode(owner: aliceID)
    node.shareList.set(ShareItem(permissions: [.read]), for: .user("nokey"))
    #expect(throws: RcrdError.missingPublicKey(userID: "nokey")) { try encoded(node) }
  }

  @Test func wireFormatIsSortedAndHidesPlaintext() throws {
    let node = sampleNode(owner: aliceID, name: "SecretName-XYZZY")
    let blob = try encoded(node)
    let text = String(decoding: blob, as: UTF8.self)
    let obj = try #require(try JSONSerialization.jsonObject(with: blob) as? [String: Any])
    #expect(Set(obj.keys) == ["version", "cloudID", "keys", "children", "meta", "burnDate"])
    #expect(obj["version"] as? Int == 1)
    #expect(text.hasPrefix("{\"burnDate\":"))
    for secret in ["SecretName-XYZZY", "hello xattr", "user.comment", "symlink", "dirSalt"] {
      #expect(!contains(blob, secret), "\(secret) leaked")
    }
    #expect(blob.range(of: node.encryptionKey) == nil)
    #expect(!text.contains(node.encryptionKey.base64EncodedString()))
    #expect(!text.contains(node.dirSalt.base64EncodedString()))
  }

  /// Re-encodes a valid record after `edit` changes its JSON object.
  func mutated(_ blob: Data, _ edit: (inout [String: Any]) -> Void) throws -> Data {
    var obj = try #require(try JSONSerialization.jsonObject(with: blob) as? [String: Any])
    edit(&obj)
    return try JSONSerialization.data(withJSONObject: obj)
  }

  @Test func rejectsEveryMalformation() throws {
    let node = sampleNode(owner: aliceID)
    let blob = try encoded(node)
    let good = try Rcrd.decode(mutated(blob) { _ in }, userID: aliceID, keyPair: alice)
    #expect(good.meta.name == node.name)

    #expect(throws: CryptoError.unsupportedVersion(2)) {
      try Rcrd.decode(mutated(blob) { $0["version"] = 2 }, userID: aliceID, keyPair: alice)
    }
    let uid = "UID:\(aliceID)"
    let bad: [(String, (inout [String: Any]) -> Void)] = [
      ("no version", { $0["version"] = nil }),
      ("string version", { $0["version"] = "1" }),
      ("no cloudID", { $0["cloudID"] = nil }),
      ("numeric cloudID", { $0["cloudID"] = 5 }),
      ("empty cloudID", { $0["cloudID"] = "" }),
      ("no keys", { $0["keys"] = nil }),
      ("keys not an object", { $0["keys"] = [1, 2] }),
      ("bad principal", { $0["keys"] = ["alice": ["perms": "rws", "key": "AAAA"]] }),
      ("bad perms", { $0["keys"] = [uid: ["perms": "rwz", "key": "AAAA"]] }),
      ("perms not a string", { $0["keys"] = [uid: ["perms": 7, "key": "AAAA"]] }),
      ("bad key base64", { $0["keys"] = [uid: ["perms": "rws", "key": "***"]] }),
      ("short key", { $0["keys"] = [uid: ["perms": "rws", "key": "AAAA"]] }),
      ("no children", { $0["children"] = nil }),
      ("children without root", { $0["children"] = ["x": ["prefix": "AB"]] }),
      ("prefix not a string", { $0["children"] = ["": ["prefix": 3]] }),
      ("empty prefix", { $0["children"] = ["": ["prefix": ""]] }),
      ("no meta", { $0["meta"] = nil }),
      ("meta not base64", { $0["meta"] = "%%%" }),
      ("meta too short", { $0["meta"] = "AAAA" }),
      (
        "meta truncated",
        { obj in obj["meta"] = (obj["meta"] as? String).map { String($0.dropLast(8)) } }
      ),
      ("meta from another cloudID", { $0["cloudID"] = "ffffffffffffffffffffffffffffffff" }),
      ("burnDate not a number", { $0["burnDate"] = "tomorrow" }),
    ]
    for (what, edit) in bad {
      let m = try mutated(blob, edit)
      #expect(throws: (any Error).self, "\(what)") {
        try Rcrd.decode(m, userID: aliceID, keyPair: alice)
      }
    }
    // Flipping any bit of the sealed meta fails authentication.
    let obj = try #require(try JSONSerialization.jsonObject(with: blob) as? [String: Any])
    let metaString = try #require(obj["meta"] as? String)
    var meta = try #require(Data(base64Encoded: metaString))
    meta[meta.count / 2] ^= 0x10
    let flipped = try mutated(blob) { $0["meta"] = meta.base64EncodedString() }
    #expect(throws: CryptoError.self) { try Rcrd.decode(flipped, userID: aliceID, keyPair: alice) }
    do {
      _ = try Rcrd.decode(flipped, userID: aliceID, keyPair: alice)
    } catch let e as CryptoError {
      guard case .authenticationFailed = e else {
        Issue.record("expected authenticationFailed, got \(e)")
        return
      }
    }
    // Not JSON at all, or truncated JSON: malformed, never a crash.
    for junk in [Data(), Data("[]".utf8), Data("null".utf8), blob.prefix(blob.count / 2)] {
      #expect(throws: CryptoError.self) { try Rcrd.decode(junk, userID: aliceID, keyPair: alice) }
    }
  }

  @Test func rejectsMalformedMetaPlaintext() throws {
    // A record whose meta decrypts but has bad contents.
    let node = sampleNode(owner: aliceID)
    let blob = try encoded(node)
    let metas = [
      #"{"name":"x"}"#,
      #"{"name":"x","dirSalt":"***","kind":"file","mode":1,"mtime":{"s":1,"ns":0},"xattrs":{},"dataSize":0}"#,
      #"{"name":"x","dirSalt":"AAAA","kind":"blob","mode":1,"mtime":{"s":1,"ns":0},"xattrs":{},"dataSize":0}"#,
      #"{"name":"x","dirSalt":"AAAA","kind":"file","mode":1,"mtime":{"s":1,"ns":2000000000},"xattrs":{},"dataSize":0}"#,
      #"{"name":"x","dirSalt":"AAAA","kind":"file","mode":1,"mtime":{"s":1,"ns":0},"xattrs":{"a":"*"},"dataSize":0}"#,
      #"{"name":"x","dirSalt":"AAAA","kind":"file","mode":-1,"mtime":{"s":1,"ns":0},"xattrs":{},"dataSize":0}"#,
    ]
    for m in metas {
      let nonce = SecureRandom.bytes(24)
      let sealed = try AEAD.seal(
        Data(m.utf8), nonce: nonce, associatedData: Rcrd.metaAD(cloudID: node.cloudID),
        key: node.encryptionKey)
      let b = try mutated(blob) { $0["meta"] = (nonce + sealed).base64EncodedString() }
      #expect(throws: CryptoError.self, "\(m)") {
        try Rcrd.decode(b, userID: aliceID, keyPair: alice)
      }
    }
  }
}
