import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

/// A store wrapper that counts the RCRD fetches, and can put another body at an RCRD key just
/// after this device's next put there.
final class RcrdReadCountingStore: ForwardingStore, @unchecked Sendable {
  // Safe: the counter and the hook are only touched under `lock`.
  let inner: any CloudStore
  private let lock = NSLock()
  private var _rcrdReads = 0
  private var afterPut: (key: String, body: () throws -> Void)?

  init(_ inner: any CloudStore) { self.inner = inner }

  var rcrdReads: Int { lock.withLock { _rcrdReads } }

  /// Runs `body` once, right after the next put at `key` lands.
  func afterNextPut(at key: String, _ body: @escaping () throws -> Void) {
    lock.withLock { afterPut = (key, body) }
  }

  private func count(_ key: String) {
    if key.hasSuffix(".rcrd") { lock.withLock { _rcrdReads += 1 } }
  }

  func get(key: String, range: ByteRange?) throws -> Data {
    count(key)
    return try inner.get(key: key, range: range)
  }
  func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo {
    count(key)
    return try inner.get(key: key, range: range, to: file)
  }
  func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo) {
    count(key)
    return try inner.getWithInfo(key: key)
  }
  func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    let eTag = try inner.put(key: key, body: body, condition: condition)
    let hook = lock.withLock { () -> (() throws -> Void)? in
      guard let h = afterPut, h.key == key else { return nil }
      afterPut = nil
      return h.body
    }
    try hook?()
    return eTag
  }
}

@Suite(.serialized) struct OwnRcrdTests {
  /// A store on a local folder, one device ("alpha", started) reaching it through a
  /// `RcrdReadCountingStore`.
  struct Alpha {
    let backing: TestStore
    let counting: RcrdReadCountingStore
    let user: TestUser
    let a: Device

    /// `started: false` leaves the push stopped until the test starts it (so that it uploads
    /// nothing before the test has set up what it watches).
    init(_ label: String, started: Bool = true) throws {
      backing = try StoreKind.local.make(label)
      counting = RcrdReadCountingStore(backing.store)
      user = try TestUser()
      a = try Device("alpha", user: user, store: counting)
      if started { try a.start() }
    }
  }

  /// After a DATA upload the push looks at the RCRD beside it (whose node it is, what size it
  /// describes). When that RCRD is the one this device has just written (the same eTag), what
  /// it says is known: nothing is fetched and decrypted.
  @Test func uploadsDoNotFetchTheRcrdsTheyWrote() throws {
    let f = try Alpha("zdc-own-rcrd")
    let (backing, counting, user, a) = (f.backing, f.counting, f.user, f.a)
    try a.create("docs", kind: .directory)
    try a.create("docs/one.txt", "the first file")
    try a.create("two.txt", "the second file")
    try a.sync()
    #expect(counting.rcrdReads == 0)
    // A new version: DATA, then the RCRD describing its size.
    try a.write("two.txt", "the second file, longer now")
    try a.sync()
    #expect(counting.rcrdReads == 0)

    // Another device sees both files and their sizes.
    let b = try Device("beta", user: user, store: backing.store)
    try b.start()
    try b.sync()
    #expect(try b.tree() == a.tree())
    #expect(try b.node("two.txt")?.dataSize == UInt64("the second file, longer now".utf8.count))
    #expect(try b.cloudContent("docs/one.txt") == Data("the first file".utf8))
  }

  /// When the RCRD beside a DATA upload is no longer the one this device wrote (another
  /// device's landed over it, describing another size), it is fetched and read, and the
  /// node's RCRD goes up again to describe the DATA just uploaded.
  @Test func aForeignRcrdBesideTheDataIsFetched() throws {
    let f = try Alpha("zdc-own-rcrd-foreign", started: false)
    let (backing, counting, user, a) = (f.backing, f.counting, f.user, f.a)
    let node = try a.create("f.txt", "12345")
    let key = try a.catalog.read(user.userID) { tx in try tx.objectLocation(of: node.id)!.rcrdKey }
    // Right after A's RCRD lands, and before its DATA upload looks: an RCRD of the node
    // describing 3 bytes (as another device's edit would) replaces it.
    counting.afterNextPut(at: key) {
      var other = try a.catalog.read(user.userID) { tx in try tx.existingNode(id: node.id) }
      other.dataSize = 3
      let body = try Rcrd.encode(node: other, publicKeys: [user.userID: user.keys.boxPublicKey])
      _ = try backing.store.put(key: key, body: .data(body), condition: .none)
    }
    // Only now: a push running since the create could have put the RCRD before the hook was set.
    try a.start()
    try a.sync()
    #expect(counting.rcrdReads > 0)
    let rcrd = try Rcrd.decode(
      try backing.store.get(key: key, range: nil), userID: user.userID, keyPair: user.keys)
    #expect(rcrd.cloudID == node.cloudID)
    #expect(rcrd.meta.dataSize == 5)
    let b = try Device("beta", user: user, store: backing.store)
    try b.start()
    try b.sync()
    #expect(try b.node("f.txt")?.dataSize == 5)
    #expect(try b.cloudContent("f.txt") == Data("12345".utf8))
  }
}
