import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore
import ZDCCrypto

@Suite struct NodeTests {
  @Test func createByPathHappyPath() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let home = try #require(try tx.trunkNode(.home))
      let foo = try tx.createNode(path: p("foo"), kind: .directory)
      let bar = try tx.createNode(
        path: p("foo", "bar"), mode: 0o600, mtime: FileTime(seconds: 1_700_000_000, nanoseconds: 5)
      )
      #expect(foo.parentID == home.id)
      #expect(foo.mode == 0o755)
      #expect(bar.parentID == foo.id)
      #expect(bar.kind == .file)
      #expect(bar.mode == 0o600)
      #expect(bar.mtime == FileTime(seconds: 1_700_000_000, nanoseconds: 5))
      #expect(bar.localUserID == "alice")
      #expect(bar.encryptionKey.count == 32)
      #expect(bar.dirSalt.count == 20)
      #expect(bar.dirPrefix.count == 32)
      #expect(bar.cloudID.count == 32)
      #expect(!bar.uuid.isEmpty)
      #expect(foo.encryptionKey != bar.encryptionKey)
      #expect(foo.dirSalt != bar.dirSalt)
      #expect(foo.dirPrefix != bar.dirPrefix)
      #expect(foo.cloudID != bar.cloudID)
      #expect(try tx.node(id: bar.id) == bar)
      #expect(try tx.node(path: p("foo", "bar")) == bar)
      #expect(try tx.node(path: p("FOO", "Bar")) == bar)
      #expect(try tx.node(cloudID: bar.cloudID) == bar)
      #expect(try tx.child(of: foo.id, named: "BAR") == bar)
      #expect(try tx.path(of: bar.id) == p("foo", "bar"))
      #expect(try tx.childCount(of: foo.id) == 1)
      #expect(try tx.node(path: p("nope")) == nil)

      // Object keys and the stored cloudName.
      let cloudName = try CloudName.compute(name: "bar", parentDirSalt: foo.dirSalt)
      #expect(try tx.cloudName(of: bar.id) == cloudName)
      let loc = try #require(try tx.objectLocation(of: bar.id))
      #expect(loc.rcrdKey == tx.layout.rcrdKey(dirPrefix: foo.dirPrefix, cloudName: cloudName))
      #expect(loc.dataKey == tx.layout.dataKey(dirPrefix: foo.dirPrefix, cloudName: cloudName))
      #expect(try tx.node(parentDirPrefix: foo.dirPrefix, cloudName: cloudName) == bar)
      let fooName = try CloudName.compute(name: "foo", parentDirSalt: home.dirSalt)
      #expect(try tx.node(parentDirPrefix: Trunk.home.dirPrefix, cloudName: fooName) == foo)

      let link = try tx.createNode(path: p("foo", "ln"), kind: .symlink, symlinkTarget: "bar")
      #expect(try tx.node(id: link.id)?.symlinkTarget == "bar")
    }
  }

  @Test func everyFieldRoundTrips() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let home = try #require(try tx.trunkNode(.home))
      var shares = ShareList.owner("alice")
      shares.set(ShareItem(permissions: [.read], wrappedKey: Data([1, 2, 3])), for: .user("bob"))
      let node = Node(
        uuid: "", localUserID: "", parentID: home.id, name: "full", kind: .file,
        shareList: shares, burnDate: Date(timeIntervalSinceReferenceDate: 123_456.789),
        encryptionKey: Data(), dirSalt: Data(), dirPrefix: "", cloudID: "",
        cloudDataInfo: nil, explicitCloudName: nil,
        anchor: NodeAnchor(userID: "carol", treeID: "t", dirPrefix: "ABC"), pointeeID: nil,
        mode: 0o4755, mtime: FileTime(seconds: -5, nanoseconds: 999_999_999),
        xattrs: ["user.a": Data([0, 255]), "user.b": Data()], symlinkTarget: nil,
        dataSize: UInt64.max)
      let created = try tx.createNode(node)
      #expect(created.id > 0)
      #expect(created.localUserID == "alice")
      #expect(created.encryptionKey.count == 32 && created.dirSalt.count == 20)
      let stored = try #require(try tx.node(id: created.id))
      #expect(stored == created)
      #expect(stored.shareList == shares)
      #expect(stored.xattrs == node.xattrs)
      #expect(stored.dataSize == UInt64.max)
      #expect(stored.mtime == node.mtime)

      let info = CloudDataInfo(
        metadataSize: 1, thumbnailSize: 2, dataSize: 3, eTag: "e",
        lastModified: Date(timeIntervalSinceReferenceDate: 5))
      try tx.setCloudState(
        nodeID: created.id, eTagRcrd: "r",
        lastModifiedRcrd: Date(timeIntervalSinceReferenceDate: 7),
        eTagData: "d", lastModifiedData: Date(timeIntervalSinceReferenceDate: 8),
        cloudDataInfo: info)
      let after = try #require(try tx.node(id: created.id))
      #expect(after.eTagRcrd == "r" && after.eTagData == "d")
      #expect(after.cloudDataInfo == info)
      #expect(after.lastModified == Date(timeIntervalSinceReferenceDate: 8))
    }
  }

  @Test func createNodeValueErrors() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let home = try #require(try tx.trunkNode(.home))
      func make(parent: NodeID?, name: String = "n") -> Node {
        Node(
          uuid: "", localUserID: "", parentID: parent, name: name, kind: .file,
          shareList: .owner("alice"), encryptionKey: Data(), dirSalt: Data(), dirPrefix: "",
          cloudID: "", mode: 0o644, mtime: FileTime(seconds: 0))
      }
      #expect(throws: CatalogError.nodeNotFound(999_999)) {
        try tx.createNode(make(parent: 999_999))
      }
      #expect(throws: CatalogError.self) { try tx.createNode(make(parent: nil)) }
      #expect(throws: CatalogError.self) { try tx.createNode(make(parent: home.id, name: "")) }
      var withID = make(parent: home.id)
      withID.id = 5
      #expect(throws: CatalogError.self) { try tx.createNode(withID) }
      var foreign = make(parent: home.id)
      foreign.localUserID = "mallory"
      #expect(throws: CatalogError.self) { try tx.createNode(foreign) }
      var trunk = make(parent: home.id)
      trunk.kind = .trunk
      #expect(throws: CatalogError.self) { try tx.createNode(trunk) }
      var etag = make(parent: home.id)
      etag.eTagRcrd = "x"
      #expect(throws: CatalogError.self) { try tx.createNode(etag) }
      #expect(try tx.childCount(of: home.id) == 0)
      #expect(try tx.operationCount() == 0)
    }
  }

  @Test func createByPathErrors() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      #expect(throws: CatalogError.parentNotFound(p("missing"))) {
        try tx.createNode(path: p("missing", "x"))
      }
      #expect(throws: CatalogError.parentNotFound(p("a", "b"))) {
        try tx.createNode(path: p("a", "b", "c"))
      }
      #expect(throws: CatalogError.nameTaken(parentID: a.parentID!, name: "a", existingID: a.id)) {
        try tx.createNode(path: p("a"))
      }
      #expect(throws: CatalogError.self) { try tx.createNode(path: TreesystemPath(trunk: .home)) }
      let link = try tx.createNode(path: p("ln"), kind: .symlink, symlinkTarget: "a")
      #expect(throws: CatalogError.notADirectory(link.id)) {
        try tx.createNode(path: p("ln", "x"))
      }
    }
    #expect(throws: CatalogError.invalidOperation("read-only transaction")) {
      try catalog.read("alice") { try $0.createNode(path: p("ro")) }
    }
  }

  /// Documented rule: names compare by `NameKey` = `lowercased()` then NFC.
  @Test func caseInsensitiveCollisions() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let foo = try tx.createNode(path: p("Foo"))
      #expect(throws: CatalogError.self) { try tx.createNode(path: p("foo")) }
      #expect(throws: CatalogError.self) { try tx.createNode(path: p("FOO")) }
      #expect(try tx.node(path: p("fOO"))?.id == foo.id)
      #expect(try tx.node(id: foo.id)?.name == "Foo")  // stored as given

      let nfc = "caf\u{E9}"
      let nfd = "cafe\u{301}"
      let cafe = try tx.createNode(path: p(nfc))
      #expect(throws: CatalogError.self) { try tx.createNode(path: p(nfd)) }
      #expect(throws: CatalogError.self) { try tx.createNode(path: p("CAF\u{C9}")) }
      #expect(try tx.child(of: cafe.parentID!, named: nfd)?.id == cafe.id)

      // "ß".lowercased() is "ß" and "SS".lowercased() is "ss": different keys, both allowed.
      #expect(NameKey("ß") != NameKey("SS"))
      try tx.createNode(path: p("stra\u{DF}e"))
      try tx.createNode(path: p("STRASSE"))
      #expect(throws: CatalogError.self) { try tx.createNode(path: p("strasse")) }
    }
  }

  @Test func idsNeverReusedAndChildrenOrderStable() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let dir = try tx.createNode(path: p("d"), kind: .directory)
      var ids: [NodeID] = []
      for name in ["zeta", "alpha", "Mid", "beta"] {
        ids.append(try tx.createNode(path: p("d", name)).id)
      }
      #expect(try tx.children(of: dir.id).map(\.id) == ids)
      #expect(try tx.children(of: dir.id).map(\.name) == ["zeta", "alpha", "Mid", "beta"])
      #expect(try tx.children(of: dir.id, afterID: ids[1], limit: 1).map(\.id) == [ids[2]])
      // A rename keeps the id and the position.
      try tx.moveNode(ids[0], toParent: dir.id, name: "omega")
      #expect(try tx.children(of: dir.id).map(\.id) == ids)
      let last = ids.last!
      try tx.deleteNode(last)
      let again = try tx.createNode(path: p("d", "beta"))
      #expect(again.id > last)
    }
    // Across transactions and after deleting the highest id too.
    let maxID = try catalog.write("alice") { tx in
      let n = try tx.createNode(path: p("top"))
      try tx.deleteNode(n.id)
      return n.id
    }
    let next = try catalog.write("alice") { try $0.createNode(path: p("top")).id }
    #expect(next > maxID)
  }

  /// A listing on the writer connection hands out (and fills) the shared node cache: what it
  /// lists after changes is what a reader connection, which has no cache, decodes from the rows.
  @Test func listingsThroughTheNodeCacheSeeEveryChange() throws {
    let catalog = try makeCatalog()
    let (dir, ids) = try catalog.write("alice") { tx in
      let dir = try tx.createNode(path: p("d"), kind: .directory)
      return (dir.id, try (0..<5).map { try tx.createNode(path: p("d", "f\($0)")).id })
    }
    func listed(onWriter: Bool) throws -> [Node] {
      try catalog.read("alice", onWriter: onWriter) { try $0.children(of: dir) }
    }
    #expect(try listed(onWriter: true) == listed(onWriter: false))
    try catalog.write("alice") { tx in
      var n = try tx.existingNode(id: ids[0])
      n.mode = 0o600
      n.mtime = FileTime(totalNanoseconds: 42)
      try tx.updateNode(n)
      try tx.moveNode(ids[1], toParent: dir, name: "renamed")
      try tx.commitData(nodeID: ids[2], size: 7, mtime: nil)
      try tx.deleteNode(ids[3])
      try tx.drainQueue()
    }
    let after = try listed(onWriter: true)
    #expect(after == (try listed(onWriter: false)))
    #expect(after.map(\.id) == [ids[0], ids[1], ids[2], ids[4]])
    #expect(after[0].mode == 0o600 && after[1].name == "renamed" && after[2].dataSize == 7)
    #expect(after.allSatisfy { $0.eTagRcrd != nil })
    // Lookups by name and by cloudID read through the same cache.
    for onWriter in [true, false] {
      let (byName, byCloudID) = try catalog.read("alice", onWriter: onWriter) { tx in
        (try tx.child(of: dir, named: "renamed"), try tx.node(cloudID: after[2].cloudID))
      }
      #expect(byName == after[1] && byCloudID == after[2])
    }
  }

  /// `hasChildren` on the writer connection remembers the nodes it found childless (every `stat`
  /// of a file asks): each way a node gains a child, and a rolled-back unit, is seen there as a
  /// reader connection (which remembers nothing) sees it.
  @Test func childlessNodesThatGainChildrenAreSeen() throws {
    let catalog = try makeCatalog()
    let (d, f, g, h, x) = try catalog.write("alice") { tx in
      let d = try tx.createNode(path: p("d"), kind: .directory).id
      return (
        d, try tx.createNode(path: p("d", "f")).id, try tx.createNode(path: p("d", "g")).id,
        try tx.createNode(path: p("d", "h")).id, try tx.createNode(path: p("x")).id
      )
    }
    func has(_ id: NodeID) throws -> [Bool] {
      try [true, false].map { w in try catalog.read("alice", onWriter: w) { try $0.hasChildren(id) }
      }
    }
    for id in [f, g, h, x] { #expect(try has(id) == [false, false]) }
    // A new node under a file node.
    try catalog.write("alice") { tx in _ = try tx.createNode(path: p("d", "f", "c")) }
    #expect(try has(f) == [true, true])
    // A move under one, and away again.
    try catalog.write("alice") { tx in try tx.moveNode(x, toParent: g, name: "x") }
    #expect(try has(g) == [true, true])
    try catalog.write("alice") { tx in try tx.moveNode(x, toParent: h, name: "x") }
    #expect(try has(g) == [false, false])
    #expect(try has(h) == [true, true])
    // A remote version placing a node under one (a pull).
    try catalog.write("alice") { tx in
      var n = try tx.existingNode(id: x)
      n.parentID = g
      try tx.applyRemoteNode(n, cloudName: try tx.cloudName(of: x))
    }
    #expect(try has(g) == [true, true])
    #expect(try has(h) == [false, false])
    // A listing remembers its entries without children; a new child of one is seen.
    let parents = try catalog.read("alice", onWriter: true) { tx in
      try tx.childrenWithChildren(of: d, among: try tx.children(of: d))
    }
    #expect(parents == [f, g])
    try catalog.write("alice") { tx in _ = try tx.createNode(path: p("d", "h", "c")) }
    #expect(try has(h) == [true, true])
    // A unit that fails after a node lost its only child leaves the child where it was.
    struct Failed: Error {}
    #expect(throws: Failed.self) {
      try catalog.write("alice") { tx in
        try tx.moveNode(x, toParent: h, name: "x2")
        #expect(try !tx.hasChildren(g))
        throw Failed()
      }
    }
    #expect(try has(g) == [true, true])
  }

  @Test func updateNode() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      var n = try tx.createNode(path: p("f"))
      n.mode = 0o600
      n.mtime = FileTime(seconds: 42)
      n.xattrs = ["user.x": Data("v".utf8)]
      n.dataSize = 10
      n.kind = .directory
      n.burnDate = Date(timeIntervalSinceReferenceDate: 99)
      let updated = try tx.updateNode(n)
      #expect(try tx.node(id: n.id) == updated)

      var renamed = n
      renamed.name = "g"
      #expect(throws: CatalogError.invalidOperation("updateNode cannot change name")) {
        try tx.updateNode(renamed)
      }
      var reparented = n
      reparented.parentID = try tx.trunkNode(.prefs)!.id
      #expect(throws: CatalogError.invalidOperation("updateNode cannot change parentID")) {
        try tx.updateNode(reparented)
      }
      var etag = n
      etag.eTagRcrd = "x"
      #expect(throws: CatalogError.self) { try tx.updateNode(etag) }
      var missing = n
      missing.id = 987_654
      #expect(throws: CatalogError.nodeNotFound(987_654)) { try tx.updateNode(missing) }
      var trunk = try tx.trunkNode(.home)!
      trunk.mode = 0o700
      try tx.updateNode(trunk)  // allowed, but enqueues nothing
      #expect(try tx.pendingOperations(forNodeID: trunk.id).isEmpty)
    }
  }

  @Test func moveAndRename() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let b = try tx.createNode(path: p("a", "b"), kind: .directory)
      let c = try tx.createNode(path: p("a", "b", "c"))
      let x = try tx.createNode(path: p("x"), kind: .directory)
      try tx.createNode(path: p("x", "taken"))

      let moved = try tx.moveNode(b.id, toParent: x.id, name: "B2")
      #expect(moved.parentID == x.id && moved.name == "B2")
      #expect(try tx.path(of: c.id) == p("x", "B2", "c"))
      #expect(try tx.node(path: p("a", "b")) == nil)
      let cloudName = try CloudName.compute(name: "b2", parentDirSalt: x.dirSalt)
      #expect(try tx.cloudName(of: b.id) == cloudName)
      // Case-only rename of itself is allowed.
      try tx.moveNode(b.id, toParent: x.id, name: "b2")
      #expect(try tx.node(id: b.id)?.name == "b2")

      #expect(
        throws: CatalogError.nameTaken(
          parentID: x.id, name: "TAKEN", existingID: try tx.node(path: p("x", "taken"))!.id)
      ) {
        try tx.moveNode(c.id, toParent: x.id, name: "TAKEN")
      }
      #expect(throws: CatalogError.cycle(nodeID: x.id, newParentID: c.id)) {
        try tx.moveNode(x.id, toParent: c.id, name: "loop")
      }
      #expect(throws: CatalogError.cycle(nodeID: x.id, newParentID: x.id)) {
        try tx.moveNode(x.id, toParent: x.id, name: "self")
      }
      let home = try #require(try tx.trunkNode(.home))
      #expect(throws: CatalogError.self) { try tx.moveNode(home.id, toParent: a.id, name: "h") }
      #expect(throws: CatalogError.nodeNotFound(424_242)) {
        try tx.moveNode(a.id, toParent: 424_242, name: "z")
      }
      #expect(throws: CatalogError.self) { try tx.moveNode(a.id, toParent: x.id, name: "") }
      #expect(try tx.path(of: a.id) == p("a"))
      // Across trunks of the same user.
      let prefs = try #require(try tx.trunkNode(.prefs))
      try tx.moveNode(a.id, toParent: prefs.id, name: "a")
      #expect(try tx.path(of: a.id) == TreesystemPath(["a"], trunk: .prefs))
    }
  }

  @Test func deleteSubtreeAndTrunkRefused() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let b = try tx.createNode(path: p("a", "b"), kind: .directory)
      let c = try tx.createNode(path: p("a", "b", "c"))
      let keep = try tx.createNode(path: p("keep"))
      try tx.deleteNode(a.id)
      for id in [a.id, b.id, c.id] { #expect(try tx.node(id: id) == nil) }
      #expect(try tx.node(id: keep.id) != nil)
      #expect(throws: CatalogError.nodeNotFound(a.id)) { try tx.deleteNode(a.id) }
      #expect(throws: CatalogError.self) { try tx.deleteNode(try tx.trunkNode(.home)!.id) }
    }
  }

  @Test func twoUsersSeparateTrees() throws {
    let catalog = try makeCatalog(userID: "alice")
    try catalog.createLocalUser(makeUser("bob", treeID: "other.tree"))
    let a = try catalog.write("alice") { try $0.createNode(path: p("shared name")) }
    let b = try catalog.write("bob") { try $0.createNode(path: p("Shared Name")) }
    #expect(a.id != b.id)
    try catalog.read("alice") { (tx: CloudTransaction) throws in
      #expect(try tx.node(path: p("shared name"))?.id == a.id)
      #expect(try tx.node(id: b.id) == nil)  // invisible across users
      #expect(try tx.children(of: tx.trunkNode(.home)!.id).map(\.id) == [a.id])
      #expect(try tx.operationCount() == 1)
      #expect(try tx.objectLocation(of: a.id)!.rcrdKey.hasPrefix("alice/com.example.zdcfs/"))
    }
    let aliceHome = try catalog.read("alice") { try $0.trunkNode(.home)!.id }
    try catalog.read("bob") { (tx: CloudTransaction) throws in
      #expect(try tx.node(path: p("shared name"))?.id == b.id)
      #expect(try tx.node(id: a.id) == nil)
      #expect(try tx.objectLocation(of: b.id)!.rcrdKey.hasPrefix("bob/other.tree/"))
      #expect(try tx.trunkNode(.home)!.id != aliceHome)
    }
    #expect(throws: CatalogError.self) {
      try catalog.write("bob") { tx in try tx.moveNode(b.id, toParent: a.parentID!, name: "x") }
    }
  }
}
