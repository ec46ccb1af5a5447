import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

/// A store wrapper that can hold the next put of a key with a given suffix until released, to
/// script an interleaving of push operations that otherwise depends on timing.
final class GatedStore: ForwardingStore, @unchecked Sendable {
  // Safe: `armed` is only touched under `lock`; the semaphores are thread-safe.
  let inner: any CloudStore
  private let lock = NSLock()
  private var armed: String?
  private let arrived = DispatchSemaphore(value: 0)
  private let released = DispatchSemaphore(value: 0)

  init(_ inner: any CloudStore) { self.inner = inner }

  /// Holds the next put of a key ending with `suffix` (once).
  func holdNextPut(ofKeysEndingWith suffix: String) { lock.withLock { armed = suffix } }
  /// Waits until the held put has arrived.
  func waitForHeldPut(timeout: TimeInterval = 20) -> Bool {
    arrived.wait(timeout: .now() + timeout) == .success
  }
  /// Lets the held put go on.
  func release() { released.signal() }

  func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    let hold = lock.withLock { () -> Bool in
      guard let s = armed, key.hasSuffix(s) else { return false }
      armed = nil
      return true
    }
    if hold {
      arrived.signal()
      _ = released.wait(timeout: .now() + 30)
    }
    return try inner.put(key: key, body: body, condition: condition)
  }
}

/// Scripted interleavings that made two devices diverge.
@Suite(.serialized, .motoServer) struct ConvergenceTests {
  /// A data conflict found by a DATA upload while the same node's RCRD upload (the local edit's
  /// attributes) was still running beside it. The conflict used to drop that in-flight RCRD
  /// upload; its write then landed in the store but was neither recorded nor logged, so the other
  /// device kept an old RCRD eTag, took the RCRD for a remote edit when it deleted the node,
  /// skipped the delete, and no pull ever brought the node back: it had lost the node that the
  /// store and the first device still held (randomized seed 1).
  @Test(arguments: StoreKind.all)
  func dataConflictBesideAnRcrdUploadInFlightConverges(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-conv-rcrd")
    let store = backing.store
    let gated = GatedStore(store)
    let user = try TestUser()
    let alpha = try Device("alpha", user: user, store: gated)
    let beta = try Device("beta", user: user, store: store)
    try alpha.start()
    try beta.start()
    try alpha.create("s1.txt", "original")
    try alpha.sync()
    try beta.sync()

    // Beta's edit lands first; alpha edits before hearing of it.
    try beta.write("s1.txt", "beta edit")
    try beta.sync()
    // Alpha's RCRD upload is held while its DATA upload meets beta's edit (a data conflict).
    gated.holdNextPut(ofKeysEndingWith: ".rcrd")
    try alpha.write("s1.txt", "alpha edit")
    #expect(gated.waitForHeldPut())
    let deadline = Date().addingTimeInterval(20)
    while !alpha.delegate.conflicts.contains(where: { $0.0 == .data }), Date() < deadline {
      Thread.sleep(forTimeInterval: 0.01)
    }
    #expect(alpha.delegate.conflicts.contains { $0.0 == .data && $0.1 == "s1.txt" })
    // Now the RCRD upload goes on (its write lands after the conflict was resolved).
    gated.release()
    try alpha.sync()
    try beta.sync()

    // Both devices know the RCRD that is in the store.
    let s1 = try beta.path("s1.txt")
    let rcrdKey = try #require(
      try beta.catalog.read(user.userID) { tx -> String? in
        guard let n = try tx.node(path: s1) else { return nil }
        return try tx.objectLocation(of: n.id)?.rcrdKey
      })
    let stored = try store.head(key: rcrdKey).eTag
    #expect(try beta.node("s1.txt")?.eTagRcrd == stored)
    #expect(try alpha.node("s1.txt")?.eTagRcrd == stored)

    // Beta deletes the node: the delete applies everywhere (it is not mistaken for a remote
    // edit), and alpha's version survives as the conflicted copy.
    try beta.delete("s1.txt")
    try beta.sync()
    try alpha.sync()
    try beta.sync()
    let ta = try alpha.tree()
    let tb = try beta.tree()
    #expect(ta == tb)
    #expect(ta["/s1.txt"] == nil)
    let copy = ta.keys.first { $0.hasPrefix("/s1 (conflicted copy ") }
    #expect(copy != nil)
    if let copy { #expect(ta[copy] == "file:alpha edit") }
    let rcrds = try store.listAll(prefix: "\(user.userID)/").filter { $0.key.hasSuffix(".rcrd") }
    #expect(rcrds.count == ta.count)
    #expect(try alpha.operationCount() == 0)
    #expect(try beta.operationCount() == 0)
  }

  /// Known issue (the one the faulty randomized test records, here on a clean store): two
  /// devices move one node at about the same time. Both pass the move's origin check before
  /// either has written, both write the RCRD at their own target, and the second finds the
  /// origin already gone (which counts as deleted). Each device then applies the other's move
  /// from the change log (it has no move outstanding any more): the node's RCRD stays at both
  /// targets, each device shows it at the other's target, and the target whose DATA copy came
  /// after the other device deleted the origin's DATA has none.
  @Test(arguments: StoreKind.all)
  func concurrentMovesOfOneNodeConverge(_ kind: StoreKind) throws {
    let backing = try kind.make("zdc-sync-conv-move")
    let store = backing.store
    let gated = GatedStore(store)
    let user = try TestUser()
    let alpha = try Device("alpha", user: user, store: gated)
    let beta = try Device("beta", user: user, store: store)
    try alpha.start()
    try beta.start()
    try alpha.create("f.txt", "content")
    try alpha.sync()
    try beta.sync()
    // Alpha's move has passed its origin check; its RCRD put at the target is held while beta
    // moves the node elsewhere, completely.
    gated.holdNextPut(ofKeysEndingWith: ".rcrd")
    try alpha.move("f.txt", to: "a.txt")
    #expect(gated.waitForHeldPut())
    try beta.move("f.txt", to: "b.txt")
    try beta.sync()
    gated.release()
    try alpha.sync()
    try beta.sync()
    try alpha.sync()
    try beta.sync()
    let ta = try alpha.tree()
    let tb = try beta.tree()
    withKnownIssue("concurrent moves of one node leave it at both targets") {
      #expect(ta == tb)
      let rcrds = try store.listAll(prefix: "\(user.userID)/").filter {
        $0.key.hasSuffix(".rcrd")
      }
      #expect(rcrds.count == 1)
      #expect(ta.values.allSatisfy { $0 == "file:content" })
    }
  }
}
