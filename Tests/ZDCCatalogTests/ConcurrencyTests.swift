import Dispatch
import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

@Suite struct ConcurrencyTests {
  /// Readers on other threads see consistent snapshots while a writer commits.
  @Test func readersDuringWrites() throws {
    let catalog = try makeCatalog()
    let dirID = try catalog.write("alice") { try $0.createNode(path: p("d"), kind: .directory).id }
    let failures = LockedCounter()
    DispatchQueue.concurrentPerform(iterations: 4) { worker in
      do {
        if worker == 0 {
          for i in 0..<200 {
            try catalog.write("alice") { tx in
              try tx.createNode(path: p("d", "n\(i)"))
              try tx.queueDataUpload(nodeID: tx.node(path: p("d", "n\(i)"))!.id)
            }
          }
        } else {
          var last = 0
          for _ in 0..<200 {
            let (children, ops) = try catalog.read("alice") { tx in
              (try tx.childCount(of: dirID), try tx.operationCount())
            }
            // Node and operations commit together: 1 (dir) + 2 per child.
            if ops != 1 + 2 * children || children < last { failures.add() }
            last = children
          }
        }
      } catch {
        failures.add()
      }
    }
    #expect(failures.value == 0)
    #expect(try catalog.read("alice") { try $0.childCount(of: dirID) } == 200)
  }

  /// A second connection pool on the same file (another process, in effect) sees committed data.
  @Test func secondOpenerSeesCommits() throws {
    let key = SecureRandom.bytes(32)
    let first = try makeCatalog(key: key)
    let path = try #require(first.path)
    let second = try Catalog(path: path, options: .init(fieldKey: key))
    let id = try first.write("alice") { try $0.createNode(path: p("x")).id }
    #expect(try second.read("alice") { try $0.node(id: id)?.name } == "x")
    try second.write("alice") { try $0.createNode(path: p("y")) }
    #expect(try first.read("alice") { try $0.node(path: p("y")) } != nil)
  }
}

final class LockedCounter: @unchecked Sendable {
  private let lock = NSLock()
  private var count = 0
  func add() { lock.withLock { count += 1 } }
  var value: Int { lock.withLock { count } }
}
