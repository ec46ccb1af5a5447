import Foundation
import Testing
import ZDCAccount
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCTestSupport

/// Known names and content go through the public API (catalog → RCRD/CloudFile → store), and
/// none of it may be found in any stored byte (DESIGN §5).
@Suite struct NoPlaintextTests {
  static let names = [
    "Quarterly Secret Report.txt", "Geheimnis-Ünïcødé-ordner", "diary-of-a-plaintext-detector.md",
    "секретный-файл.doc", "機密ファイル.txt",
  ]
  static let content = Data(
    String(repeating: "PLAINTEXT-CONTENT-that-must-never-reach-the-store. ", count: 3000).utf8)
  static let metadata = Data("PLAINTEXT-METADATA-SECTION".utf8)
  static let thumbnail = Data("PLAINTEXT-THUMBNAIL-SECTION".utf8)
  static let xattrValue = Data("PLAINTEXT-XATTR-VALUE".utf8)
  static let symlinkTarget = "/PLAINTEXT/SYMLINK/TARGET"

  @Test func namesAndContentNeverReachTheStoreInTheClear() throws {
    let tmp = try TemporaryDirectory("noplain")
    let storeDir = tmp.path("store")
    let (account, _) = try Account.create(
      stateDirectory: StateDirectory(url: tmp.path("state")),
      store: .localFolder(path: storeDir.path), passphrase: "pw", storeKDF: .minimum,
      localKDF: .minimum)
    let userID = account.config.userID
    let publicKeys = [userID: account.keys.keyPair.boxPublicKey]

    // A small tree: a directory with files, a symlink, xattrs.
    let nodes: [Node] = try account.catalog.write(userID) { tx in
      var made: [Node] = []
      let dir = try tx.createNode(path: try TreesystemPath([Self.names[1]]), kind: .directory)
      made.append(dir)
      for name in [Self.names[0], Self.names[2], Self.names[3], Self.names[4]] {
        var n = try tx.createNode(path: try TreesystemPath([Self.names[1], name]))
        n.xattrs = ["user.comment": Self.xattrValue]
        n.dataSize = UInt64(Self.content.count)
        made.append(try tx.updateNode(n))
      }
      made.append(
        try tx.createNode(
          path: try TreesystemPath(["link-\(Self.names[0])"]), kind: .symlink,
          symlinkTarget: Self.symlinkTarget))
      return made
    }

    // Upload each node the way the push manager will: RCRD, then DATA.
    for node in nodes {
      let loc = try #require(
        try account.catalog.read(userID) { try $0.objectLocation(of: node.id) })
      _ = try account.store.put(
        key: loc.rcrdKey, body: .data(try Rcrd.encode(node: node, publicKeys: publicKeys)),
        condition: .ifNoneMatch)
      if node.kind == .file {
        var object = Data()
        try CloudFileEncoder(key: node.encryptionKey).encode(
          metadata: Self.metadata, thumbnail: Self.thumbnail, data: .data(Self.content)
        ) { object.append($0) }
        _ = try account.store.put(key: loc.dataKey, body: .data(object), condition: .ifNoneMatch)
      }
    }

    // Everything is really there and decodes back (so the search below is not vacuous).
    let objects = try account.store.listAll(prefix: account.layout.treePrefix)
    #expect(objects.count == nodes.count + 4)
    var decodedNames: Set<String> = []
    for o in objects where o.key.hasSuffix(".rcrd") {
      let rcrd = try Rcrd.decode(
        try account.store.get(key: o.key), userID: userID, keyPair: account.keys.keyPair)
      decodedNames.insert(rcrd.meta.name)
    }
    #expect(decodedNames.isSuperset(of: Self.names))

    // The search: every name (as typed, lower-cased, NFD), contents, sections, xattr, target.
    var needles: [Data] = []
    for n in Self.names {
      needles.append(Data(n.utf8))
      needles.append(Data(n.lowercased().utf8))
      needles.append(Data(n.decomposedStringWithCanonicalMapping.utf8))
      needles.append(Data(n.utf16.flatMap { [UInt8($0 & 0xff), UInt8($0 >> 8)] }))
    }
    needles += [
      Self.content.prefix(40), Self.metadata, Self.thumbnail, Self.xattrValue,
      Data(Self.symlinkTarget.utf8), Data("PLAINTEXT".utf8),
    ]
    let hits = try findPlaintext(needles, under: storeDir)
    #expect(hits.isEmpty, "plaintext in the store: \(hits)")
  }

  /// The search itself finds plaintext when it is there (the check above can fail).
  @Test func theSearchFindsPlaintextWhenPresent() throws {
    let tmp = try TemporaryDirectory("noplain-control")
    try FileManager.default.createDirectory(at: tmp.path("a/b"), withIntermediateDirectories: true)
    try Data("xx PLAINTEXT yy".utf8).write(to: tmp.path("a/b/object"))
    try Data().write(to: tmp.path("a/Quarterly Secret Report.txt"))
    let hits = try findPlaintext(
      [Data("PLAINTEXT".utf8), Data(Self.names[0].utf8)], under: tmp.url)
    #expect(hits.count == 2)
  }
}
