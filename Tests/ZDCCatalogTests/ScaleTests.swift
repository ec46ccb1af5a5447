import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

@Suite struct ScaleTests {
  /// 10,000 nodes in one transaction (a root, 99 directories × 100 files), then the subtree deleted after
  /// it was "uploaded". Prints the times; asserts only the results.
  @Test func tenThousandNodes() throws {
    let catalog = try makeCatalog()
    let clock = ContinuousClock()
    var rootID: NodeID = 0
    let create = try clock.measure {
      rootID = try catalog.write("alice") { tx in
        let root = try tx.createNode(path: p("big"), kind: .directory)
        for d in 0..<99 {
          let dir = try tx.createNode(path: p("big", "dir\(d)"), kind: .directory)
          for f in 0..<100 {
            var node = dir
            node.id = 0
            node.uuid = ""
            node.encryptionKey = Data()
            node.dirSalt = Data()
            node.dirPrefix = ""
            node.cloudID = ""
            node.kind = .file
            node.parentID = dir.id
            node.name = "file \(f).txt"
            try tx.createNode(node)
          }
        }
        return root.id
      }
    }
    let count = try catalog.read("alice") { tx in
      try tx.children(of: rootID).reduce(0) { $0 + 1 + (try tx.childCount(of: $1.id)) } + 1
    }
    #expect(count == 10_000)
    #expect(try catalog.read("alice") { try $0.operationCount() } == 10_000)

    var readdir = Duration.zero
    var lookups = Duration.zero
    try catalog.read("alice") { tx in
      let dirs = try tx.children(of: rootID)
      readdir = try clock.measure {
        for dir in dirs { _ = try tx.children(of: dir.id) }
      }
      lookups = try clock.measure {
        for dir in dirs {
          for f in 0..<100 { _ = try tx.child(of: dir.id, named: "FILE \(f).TXT") }
        }
      }
    }

    let drain = try clock.measure { try catalog.write("alice") { try $0.drainQueue() } }
    let delete = try clock.measure { try catalog.write("alice") { try $0.deleteNode(rootID) } }
    try catalog.read("alice") { tx in
      let ops = try tx.allOperations()
      #expect(ops.map(\.kind) == [.deleteNode])
      #expect(ops.first?.payload.objects?.count == 10_000)
      #expect(try tx.node(id: rootID) == nil)
      #expect(try tx.childCount(of: tx.trunkNode(.home)!.id) == 0)
    }
    print(
      "10k nodes: create \(create), readdir 99 dirs \(readdir), 9900 lookups \(lookups),"
        + " drain \(drain), delete subtree \(delete)")
  }

  /// A 2,000-deep chain deletes without hitting SQLite's cascade recursion limit.
  @Test func deepChainDelete() throws {
    let catalog = try makeCatalog()
    let top = try catalog.write("alice") { tx in
      var parent = try tx.createNode(path: p("deep"), kind: .directory)
      let top = parent.id
      for i in 0..<2_000 {
        var n = parent
        n.id = 0
        n.uuid = ""
        n.encryptionKey = Data()
        n.dirSalt = Data()
        n.dirPrefix = ""
        n.cloudID = ""
        n.parentID = parent.id
        n.name = "d\(i)"
        parent = try tx.createNode(n)
      }
      #expect(try tx.path(of: parent.id).components.count == 2_001)
      return top
    }
    try catalog.write("alice") { try $0.deleteNode(top) }
    #expect(try catalog.read("alice") { try $0.operationCount() } == 0)
  }
}
