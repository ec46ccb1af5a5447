public import Foundation
import GRDB
public import ZDCCore
import ZDCCrypto
import ZDCSQLite

/// One transaction on one local user's treesystem: node queries and changes, the push
/// operations the changes enqueue, tags and links.
///
/// Obtained from ``Catalog/write(_:_:)`` or ``Catalog/read(_:_:)``; valid only inside that
/// closure. Every query sees only the transaction's local user's nodes. In a read transaction,
/// mutations throw ``CatalogError/invalidOperation(_:)``.
///
/// Names compare as `NameKey` does: Unicode `lowercased()`, then NFC. So `Foo`/`foo` and the NFC
/// and NFD spellings of `é` collide, while `ß` and `SS` do not (`"SS".lowercased()` is `"ss"`).
public final class CloudTransaction {
  /// The connection, as it is: statements get it through ``db``.
  let connection: Database
  /// The connection, with the held new nodes inserted first (see ``HeldRows``): every
  /// statement gets the database through here, so none misses a held node.
  var db: Database {
    get throws {
      if let heldRows, heldRows.mustInsert { try insertHeldRows() }
      return connection
    }
  }
  /// The local user whose treesystem this transaction sees.
  public let userID: String
  /// Where that user's objects live in a store.
  public let layout: CloudLayout
  /// True for a read-only transaction.
  public let isReadOnly: Bool
  let failpoint: String?
  /// How sensitive fields are stored (see `Catalog.Options.fieldKey`).
  let fields: FieldCoding
  let shareLists: ShareListCache
  /// The writer connection's node cache (`nil` on a reader connection).
  let sharedNodes: NodeCache?
  /// The writer connection's prepared statements (`nil` on a reader connection).
  let writerStatements: StatementTable?
  /// The writer connection's deferred first uploads (`nil` on a reader connection).
  let deferredUploads: DeferredUploads?
  /// True when new nodes' first uploads may wait for the batch's commit (a journaled unit).
  var defersFirstUploads = false
  /// The writer connection's held new nodes (`nil` on a reader connection).
  let heldRows: HeldRows?
  lazy var encoder: JSONEncoder = {
    let e = JSONEncoder()
    e.outputFormatting = .sortedKeys
    return e
  }()
  lazy var decoder = JSONDecoder()

  init(
    db: Database, layout: CloudLayout, readOnly: Bool, failpoint: String?,
    shareLists: ShareListCache, nodes: NodeCache?, statements: StatementTable?,
    deferred: DeferredUploads?, held: HeldRows?, fields: FieldCoding
  ) {
    self.fields = fields
    self.connection = db
    self.heldRows = held
    self.userID = layout.userID
    self.layout = layout
    self.isReadOnly = readOnly
    self.failpoint = failpoint
    self.shareLists = shareLists
    self.sharedNodes = nodes
    self.writerStatements = statements
    self.deferredUploads = deferred
  }

  /// Runs `body` once this transaction has committed (never if it rolls back), so that work
  /// outside the catalog — moving files, notifying — never becomes visible before the catalog
  /// change it goes with. In a read-only transaction, `body` runs right away.
  public func afterCommit(_ body: @escaping @Sendable () -> Void) {
    guard !isReadOnly, connection.rawIsInsideTransaction else {
      body()
      return
    }
    commitHooks.append(body)
  }

  /// Hooks of ``afterCommit(_:)``, handed to the database once this unit of work succeeded
  /// (it may be one savepoint of a larger transaction: they run when that one commits).
  var commitHooks: [@Sendable () -> Void] = []

  /// The layout of a local user's tree, read from the database.
  static func layout(userID: String, db: Database) throws -> CloudLayout {
    let stmt = try db.cachedStatement(sql: "SELECT treeID FROM localUsers WHERE id = ?")
    guard let treeID = try String.fetchOne(stmt, arguments: [userID]) else {
      throw CatalogError.userNotFound(userID)
    }
    return CloudLayout(userID: userID, treeID: treeID)
  }

  func requireWritable() throws {
    if isReadOnly { throw CatalogError.invalidOperation("read-only transaction") }
    // A change the journal does not describe: the unit of work must commit before it returns.
    if journalRecords != nil, journalDepth == 0 { needsCommit = true }
  }

  /// The journal records of this unit of work, or `nil` when it is not journaled (see
  /// ``RedoJournal``).
  var journalRecords: [Data]?
  /// Nesting of journaled mutations (only the outermost one is recorded).
  var journalDepth = 0
  /// True when a journaled unit of work made a change its records do not describe.
  var needsCommit = false

  func check(_ point: String) throws {
    if let failpoint, failpoint == point { throw CatalogError.injectedFailure(point) }
  }

  // MARK: Row coding

  static let nodeColumns = """
    id, uuid, localUserID, parentID, name, kind, trunk, shareList, burnDate, encryptionKey, \
    dirSalt, dirPrefix, cloudID, eTagRcrd, eTagData, lastModifiedRcrd, lastModifiedData, \
    cloudDataInfo, explicitCloudName, anchor, pointeeID, mode, mtime, xattrs, symlinkTarget, \
    dataSize
    """

  static let nodeByID = CatalogSQL(
    "SELECT \(nodeColumns) FROM nodes WHERE id = ? AND localUserID = ?")
  static let childByName = CatalogSQL(
    "SELECT \(nodeColumns) FROM nodes WHERE parentID = ? AND nameKey = ? AND localUserID = ?")
  static let childrenSharingName = CatalogSQL(
    """
    SELECT \(nodeColumns) FROM nodes
    WHERE parentID = ? AND nameKey >= ? AND nameKey < ? AND localUserID = ? ORDER BY id
    """)
  @_spi(Testing) public static let childrenSQL = """
    SELECT \(nodeColumns) FROM nodes
    WHERE parentID = ? AND id > ? AND localUserID = ? ORDER BY id LIMIT ?
    """

  /// Decodes the node at the current row of a statement selecting ``nodeColumns``, reading the
  /// columns straight from SQLite (no `Row`: this is the getattr/lookup/readdir path).
  func decodeNode(_ s: SQLiteStatement) throws -> Node {
    func text(_ i: CInt) -> String? { String.fromStatement(s, atUncheckedIndex: i) }
    func int(_ i: CInt) -> Int64? { Int64.fromStatement(s, atUncheckedIndex: i) }
    func real(_ i: CInt) -> Double? { Double.fromStatement(s, atUncheckedIndex: i) }
    func blob(_ i: CInt) -> Data { Data.fromStatement(s, atUncheckedIndex: i) ?? Data() }
    func date(_ i: CInt) -> Date? { real(i).map(Date.init(timeIntervalSinceReferenceDate:)) }
    // Names and symlink targets are text, or sealed blobs (see `FieldCoding.storedText`).
    func sealedText(_ i: CInt) throws -> String? { try fields.text(s, i) }
    guard let id = int(0), let uuid = text(1), let localUserID = text(2),
      let name = try sealedText(4),
      let kindRaw = text(5), let kind = NodeKind(rawValue: kindRaw), let shareJSON = text(7),
      let dirPrefix = text(11), let cloudID = text(12), let mode = int(21), let mtime = int(22),
      let dataSize = int(25)
    else { throw CatalogError.corrupt("node row") }
    let shareList = try decodeShareList(shareJSON)
    var xattrs: [String: Data] = [:]
    if case .plain = fields {
      if let json = text(23) {
        xattrs = try decoder.decode([String: Data].self, from: Data(json.utf8))
      }
    } else if let sealed = Data.fromStatement(s, atUncheckedIndex: 23) {
      xattrs = try decoder.decode([String: Data].self, from: try fields.open(sealed))
    }
    return Node(
      id: id, uuid: uuid, localUserID: localUserID, parentID: int(3), name: name, kind: kind,
      trunk: text(6).flatMap(Trunk.init(rawValue:)), shareList: shareList, burnDate: date(8),
      encryptionKey: try fields.open(blob(9)), dirSalt: try fields.open(blob(10)),
      dirPrefix: dirPrefix,
      cloudID: cloudID,
      eTagRcrd: text(13), eTagData: text(14), lastModifiedRcrd: date(15),
      lastModifiedData: date(16),
      cloudDataInfo: try text(17).map { try CloudDataInfoCodec.decode($0, decoder) },
      explicitCloudName: text(18),
      anchor: try text(19).map { try decoder.decode(NodeAnchor.self, from: Data($0.utf8)) },
      pointeeID: int(20), mode: UInt32(truncatingIfNeeded: mode),
      mtime: FileTime(totalNanoseconds: mtime), xattrs: xattrs,
      symlinkTarget: try sealedText(24),
      dataSize: UInt64(bitPattern: dataSize))
  }

  /// The first node a statement returns: from the shared cache, or decoded straight from the
  /// statement's columns (see ``cachedOrDecodedNode(_:)``).
  func fetchNode(_ sql: String, _ values: RawValues) throws -> Node? {
    try fetchNode(try db.cachedStatement(sql: sql), values)
  }

  /// ``fetchNode(_:_:)`` of a ``CatalogSQL`` statement.
  func fetchNode(_ sql: CatalogSQL, _ values: RawValues) throws -> Node? {
    try fetchNode(try statement(sql), values)
  }

  private func fetchNode(_ statement: Statement, _ values: RawValues) throws -> Node? {
    var node: Node?
    try statement.runRaw(values) { s in
      node = try cachedOrDecodedNode(s)
      return false
    }
    return node
  }

  /// A share list from its JSON (decodings are cached, like encodings).
  func decodeShareList(_ json: String) throws -> ShareList {
    if let cached = shareLists.decoded(json) { return cached }
    let list = try decoder.decode(ShareList.self, from: Data(json.utf8))
    shareLists.remember(list, json: json)
    return list
  }

  /// A share list's JSON; most nodes share a few lists, so the encoding is cached.
  func shareListJSON(_ list: ShareList) throws -> String {
    if let cached = shareLists.encoded(list) { return cached }
    let encoded = try json(list)
    shareLists.remember(list, json: encoded)
    return encoded
  }

  func json<T: Encodable>(_ value: T) throws -> String {
    String(decoding: try encoder.encode(value), as: UTF8.self)
  }

  private func attributeArguments(_ node: Node) throws -> [(any DatabaseValueConvertible)?] {
    [
      node.kind.rawValue, try shareListJSON(node.shareList),
      node.burnDate?.timeIntervalSinceReferenceDate, try node.anchor.map { try json($0) },
      node.pointeeID, Int64(node.mode), node.mtime.totalNanoseconds,
      try storedXattrs(node.xattrs), try fields.storedText(node.symlinkTarget),
      Int64(bitPattern: node.dataSize),
    ]
  }

  /// A node's extended attributes as stored: JSON, sealed when the catalog seals its fields
  /// (`nil` for none).
  func storedXattrs(_ xattrs: [String: Data]) throws -> (any DatabaseValueConvertible)? {
    guard !xattrs.isEmpty else { return nil }
    let encoded = try json(xattrs)
    if case .plain = fields { return encoded }
    return try fields.seal(Data(encoded.utf8))
  }

  /// Inserts a node's row; with `id`, under that row id (journal replay, a held node), else the
  /// next one. With `cached`, the node cache's sets are left alone: they know the node already
  /// (a held node's, as it is now).
  func insertNodeRow(_ node: Node, cloudName: String, id: NodeID? = nil, cached: Bool = false)
    throws -> NodeID
  {
    let key = node.nameKey
    let args: [(any DatabaseValueConvertible)?] = [
      node.uuid, node.localUserID, node.parentID, try fields.storedText(node.name),
      node.kind.rawValue,
      node.trunk?.rawValue, try shareListJSON(node.shareList),
      node.burnDate?.timeIntervalSinceReferenceDate, try fields.seal(node.encryptionKey),
      try fields.seal(node.dirSalt), node.dirPrefix, node.cloudID, node.eTagRcrd, node.eTagData,
      node.lastModifiedRcrd?.timeIntervalSinceReferenceDate,
      node.lastModifiedData?.timeIntervalSinceReferenceDate,
      try node.cloudDataInfo.map { try json($0) }, node.explicitCloudName,
      try node.anchor.map { try json($0) }, node.pointeeID, Int64(node.mode),
      node.mtime.totalNanoseconds, try storedXattrs(node.xattrs),
      try fields.storedText(node.symlinkTarget), Int64(bitPattern: node.dataSize),
      try fields.nameKey(key), cloudName, id,
    ]
    try rawExecute(Self.insertRowSQL, args)
    let inserted = connection.rawLastInsertedRowID
    if !cached {
      sharedNodes?.inserted(inserted, kind: node.kind, under: node.parentID, named: key)
    }
    return inserted
  }

  private static let insertRowSQL = CatalogSQL(
    """
    INSERT INTO nodes (uuid, localUserID, parentID, name, kind, trunk, shareList, burnDate,
      encryptionKey, dirSalt, dirPrefix, cloudID, eTagRcrd, eTagData, lastModifiedRcrd,
      lastModifiedData, cloudDataInfo, explicitCloudName, anchor, pointeeID, mode, mtime,
      xattrs, symlinkTarget, dataSize, nameKey, cloudName, id)
    VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
    """)

  func insertTrunk(_ trunk: Trunk) throws -> Node {
    var node = Node(
      uuid: SecureRandom.uuid(), localUserID: userID, parentID: nil, name: trunk.rawValue,
      kind: .trunk, trunk: trunk, shareList: .owner(userID), encryptionKey: SecureRandom.nodeKey(),
      dirSalt: SecureRandom.dirSalt(), dirPrefix: trunk.dirPrefix,
      cloudID: SecureRandom.cloudID(), mode: 0o755, mtime: FileTime(Date()))
    node.id = try insertNodeRow(node, cloudName: trunk.rawValue)
    return node
  }

  // MARK: Lookups

  /// The node with this id, or `nil`.
  public func node(id: NodeID) throws -> Node? {
    if let held = heldNode(id) { return held }
    if let sharedNodes, let cached = sharedNodes.get(id), cached.localUserID == userID {
      #if DEBUG
        // Tests check that every change of a row dropped its cached node.
        var stored: Node?
        try debugCheck {
          try statement(Self.nodeByID).runRaw([id, userID]) { s in
            stored = try decodeNode(s)
            return false
          }
        }
        precondition(stored == cached, "stale cached node \(id)")
      #endif
      return cached
    }
    // A read-only transaction sees no change: nodes read once are kept for its duration.
    if isReadOnly, let cached = readCache[id] { return cached }
    let node = try fetchNode(Self.nodeByID, [id, userID])
    if isReadOnly { readCache[id] = node }
    return node
  }

  /// Runs a debug build's check of a cache against the rows alone: the held nodes stay held
  /// (they are in the caches; inserting them for a check would change what the tests test).
  func debugCheck<T>(_ body: () throws -> T) throws -> T {
    guard let heldRows else { return try body() }
    return try heldRows.suspended(body)
  }

  /// Drops a node from the shared cache: called by every statement that changes its row.
  func rowChanged(_ id: NodeID) { sharedNodes?.remove(id) }

  /// True when the node is known to have no tag and no link (see `NodeCache.isBare`).
  func isBare(_ id: NodeID) throws -> Bool {
    guard let sharedNodes, sharedNodes.isBare(id) else { return false }
    #if DEBUG
      // Tests check that every statement giving a node a tag or a link told the cache.
      let clothed = try debugCheck {
        try Bool.fetchOne(
          db,
          sql: """
            SELECT EXISTS (SELECT 1 FROM nodeTags WHERE nodeID = ?1)
              OR EXISTS (SELECT 1 FROM nodeLinks WHERE nodeID = ?1)
            """, arguments: [id])
      }
      precondition(clothed == false, "node \(id) has tags or links")
    #endif
    return true
  }

  /// Drops every cached node: after a statement that may change many rows.
  func rowsChanged() { sharedNodes?.removeAll() }

  /// Nodes a read-only transaction has read (see ``node(id:)``).
  private var readCache: [NodeID: Node?] = [:]

  /// The node with this id; throws ``CatalogError/nodeNotFound(_:)`` when missing.
  public func existingNode(id: NodeID) throws -> Node {
    guard let node = try node(id: id) else { throw CatalogError.nodeNotFound(id) }
    return node
  }

  /// The node with this cloudID, or `nil`.
  public func node(cloudID: String) throws -> Node? {
    try fetchNode(
      "SELECT \(Self.nodeColumns) FROM nodes WHERE cloudID = ? AND localUserID = ? LIMIT 1",
      [cloudID, userID])
  }

  /// The node stored under a parent with `parentDirPrefix` as `cloudName`, or `nil`
  /// (pull side: object key → node).
  public func node(parentDirPrefix: String, cloudName: String) throws -> Node? {
    try fetchNode(
      """
      SELECT \(Self.nodeColumns) FROM nodes
      WHERE parentID IN (SELECT id FROM nodes WHERE dirPrefix = ? AND localUserID = ?)
        AND cloudName = ? LIMIT 1
      """, [parentDirPrefix, userID, cloudName])
  }

  /// The trunk node of one of the user's trunks.
  public func trunkNode(_ trunk: Trunk) throws -> Node? {
    try fetchNode(
      """
      SELECT \(Self.nodeColumns) FROM nodes
      WHERE localUserID = ? AND trunk = ? AND parentID IS NULL
      """, [userID, trunk.rawValue])
  }

  /// The child of `parentID` whose name has the same `NameKey` as `name`, or `nil`.
  public func child(of parentID: NodeID, named name: String) throws -> Node? {
    try fetchNode(Self.childByName, [parentID, try fields.nameKey(of: name), userID])
  }

  /// The children of `parentID` whose name equals `name` up to case, and those kept under the
  /// case variant of such a name (see ``CaseVariant``), in ascending id order.
  public func children(of parentID: NodeID, sharingNameWith name: String) throws -> [Node] {
    let key = NameKey(name)
    if let sharedNodes, sharedNodes.hasNoChild(of: parentID, matching: key) {
      #if DEBUG
        // Tests check that every statement naming a node told the cache.
        let stored = try debugCheck { try queryChildren(of: parentID, sharingKey: key) }
        precondition(stored.isEmpty, "stale child names of \(parentID)")
      #endif
      return []
    }
    return try queryChildren(of: parentID, sharingKey: key)
  }

  private func queryChildren(of parentID: NodeID, sharingKey key: NameKey) throws -> [Node] {
    let (lower, upper) = try fields.nameKeyRange(of: key)
    var out: [Node] = []
    try rawQuery(Self.childrenSharingName, [parentID, lower, upper, userID]) { st in
      out.append(try cachedOrDecodedNode(st))
      return true
    }
    return out
  }

  /// The node at the current row of a statement selecting ``nodeColumns``: from the shared
  /// cache when there (a node of the cache equals its row, see ``NodeCache``: no need to decode
  /// it), else decoded and cached.
  private func cachedOrDecodedNode(_ st: SQLiteStatement) throws -> Node {
    if let sharedNodes, let id = Int64.fromStatement(st, atUncheckedIndex: 0),
      let cached = sharedNodes.get(id)
    {
      #if DEBUG
        // Tests check that every change of a row dropped its cached node.
        let stored = try decodeNode(st)
        precondition(stored == cached, "stale cached node \(id)")
      #endif
      return cached
    }
    let node = try decodeNode(st)
    sharedNodes?.put(node)
    return node
  }

  /// The children of `parentID` in ascending id order (stable: readdir offsets may be ids),
  /// optionally only those with an id above `afterID`, at most `limit`.
  public func children(of parentID: NodeID, afterID: NodeID = 0, limit: Int = -1) throws -> [Node] {
    var out: [Node] = []
    // Through the shared cache: a listing's nodes are decoded once, and what follows it (an
    // `rm -r`'s unlinks, a `stat` of each entry) finds them there.
    try rawQuery(Self.childrenSQL, [parentID, afterID, userID, limit]) { st in
      out.append(try cachedOrDecodedNode(st))
      return true
    }
    // The whole directory (on the writer, between its statements): its names are all known.
    if afterID == 0, limit < 0 || out.count < limit, let sharedNodes {
      sharedNodes.listed(parentID) { out.map(\.nameKey) }
    }
    return out
  }

  /// Which of `children` (children of `parentID` in ascending id order, as
  /// ``children(of:afterID:limit:)`` returns them) have children of their own: one query for a
  /// page of a directory listing.
  public func childrenWithChildren(of parentID: NodeID, among children: [Node]) throws
    -> Set<NodeID>
  {
    guard let first = children.first?.id, let last = children.last?.id else { return [] }
    var parents = Set<NodeID>()
    try rawQuery(Self.childrenWithChildrenSQL, [parentID, first, last, userID]) { s in
      parents.insert(RawColumn.int(s, 0))
      return true
    }
    // What an `rm -r` asks next of each entry it unlinks.
    sharedNodes?.noteChildless(children.lazy.map(\.id).filter { !parents.contains($0) })
    return parents
  }
  private static let childrenWithChildrenSQL = CatalogSQL(
    """
    SELECT p.id FROM nodes p
    WHERE p.parentID = ? AND p.id BETWEEN ? AND ? AND p.localUserID = ?
      AND EXISTS (SELECT 1 FROM nodes c WHERE c.parentID = p.id)
    """)

  /// True when `parentID` has at least one child.
  public func hasChildren(_ parentID: NodeID) throws -> Bool {
    // A held directory's children are all held (see `HeldRows.hasChild(of:)`).
    if let heldRows, heldNode(parentID) != nil { return heldRows.hasChild(of: parentID) }
    if let sharedNodes, sharedNodes.isChildless(parentID) {
      #if DEBUG
        // Tests check that every statement giving a node a child dropped it from the set.
        let stale = try debugCheck { try rawInt(Self.anyChild, [parentID]) } != nil
        precondition(!stale, "node \(parentID) has children")
      #endif
      return false
    }
    let found = try rawInt(Self.anyChild, [parentID]) != nil
    if !found { sharedNodes?.noteChildless(parentID) }
    return found
  }
  private static let anyChild = CatalogSQL("SELECT 1 FROM nodes WHERE parentID = ? LIMIT 1")

  /// The number of children of `parentID`.
  public func childCount(of parentID: NodeID) throws -> Int {
    Int(try rawInt(Self.childCountSQL, [parentID, userID]) ?? 0)
  }
  private static let childCountSQL = CatalogSQL(
    "SELECT COUNT(*) FROM nodes WHERE parentID = ? AND localUserID = ?")

  /// The node at a path, or `nil`.
  public func node(path: TreesystemPath) throws -> Node? {
    guard var node = try trunkNode(path.trunk) else { return nil }
    for name in path.components {
      guard let next = try child(of: node.id, named: name) else { return nil }
      node = next
    }
    return node
  }

  /// The path of a node (names as stored).
  public func path(of id: NodeID) throws -> TreesystemPath {
    let sql = "SELECT parentID, name, trunk FROM nodes WHERE id = ? AND localUserID = ?"
    var names: [String] = []
    var current = id
    var steps = 0
    while true {
      var row: (parent: NodeID?, name: String?, trunk: String?)?
      try rawQuery(sql, [current, userID]) { s in
        row = (Int64.fromStatement(s, atUncheckedIndex: 0), try fields.text(s, 1), columnText(s, 2))
        return false
      }
      guard let row else { throw CatalogError.nodeNotFound(current) }
      if let parent = row.parent {
        guard let name = row.name else { throw CatalogError.corrupt("node name") }
        names.append(name)
        current = parent
      } else {
        guard let trunk = row.trunk.flatMap(Trunk.init(rawValue:)) else {
          throw CatalogError.corrupt("root node \(current) is not a trunk")
        }
        return try TreesystemPath(names.reversed(), trunk: trunk)
      }
      steps += 1
      if steps > 1_000_000 { throw CatalogError.corrupt("parent loop at node \(id)") }
    }
  }

  /// The cloudName of a node's objects (under its parent's dirPrefix); a trunk's raw value.
  public func cloudName(of id: NodeID) throws -> String {
    let stmt = try db.cachedStatement(
      sql: "SELECT cloudName FROM nodes WHERE id = ? AND localUserID = ?")
    guard let name = try String.fetchOne(stmt, arguments: [id, userID]) else {
      throw CatalogError.nodeNotFound(id)
    }
    return name
  }

  /// Where a node's RCRD and DATA objects live now, with their last known eTags; `nil` for a
  /// trunk (trunks have no objects).
  public func objectLocation(of id: NodeID) throws -> CloudObjectRef? {
    var ref: CloudObjectRef?
    try rawQuery(Self.objectLocationSQL, [id, userID]) { s in
      guard let cloudID = RawColumn.text(s, 0), let cloudName = RawColumn.text(s, 1),
        let dirPrefix = RawColumn.text(s, 4)
      else { throw CatalogError.corrupt("node \(id): no cloud name") }
      ref = objectRef(
        nodeID: id, cloudID: cloudID, dirPrefix: dirPrefix, cloudName: cloudName,
        eTagRcrd: RawColumn.text(s, 2), eTagData: RawColumn.text(s, 3))
      return false
    }
    if ref == nil, try node(id: id) == nil { throw CatalogError.nodeNotFound(id) }
    return ref
  }

  private static let objectLocationSQL = CatalogSQL(
    """
    SELECT n.cloudID, n.cloudName, n.eTagRcrd, n.eTagData, p.dirPrefix
    FROM nodes n JOIN nodes p ON p.id = n.parentID
    WHERE n.id = ? AND n.localUserID = ?
    """)

  func objectRef(
    nodeID: NodeID, cloudID: String, dirPrefix: String, cloudName: String, eTagRcrd: String?,
    eTagData: String?
  ) -> CloudObjectRef {
    CloudObjectRef(
      nodeID: nodeID, cloudID: cloudID, dirPrefix: dirPrefix, cloudName: cloudName,
      rcrdKey: layout.rcrdKey(dirPrefix: dirPrefix, cloudName: cloudName),
      dataKey: layout.dataKey(dirPrefix: dirPrefix, cloudName: cloudName), eTagRcrd: eTagRcrd,
      eTagData: eTagData)
  }

  // MARK: Creating

  /// Creates a node at `path` (its parent must exist) with fresh random keys, dirSalt,
  /// dirPrefix, cloudID and uuid, and enqueues its upload.
  ///
  /// `mode` defaults to 0o755 for directories and symlinks and 0o644 for files; `mtime` to now.
  @discardableResult
  public func createNode(
    path: TreesystemPath, kind: NodeKind = .file, mode: UInt32? = nil, mtime: FileTime? = nil,
    symlinkTarget: String? = nil
  ) throws -> Node {
    try journaled(
      {
        try createNodeUnjournaled(
          path: path, kind: kind, mode: mode, mtime: mtime, symlinkTarget: symlinkTarget)
      }, { .create($0) })
  }

  private func createNodeUnjournaled(
    path: TreesystemPath, kind: NodeKind, mode: UInt32?, mtime: FileTime?, symlinkTarget: String?
  ) throws -> Node {
    try requireWritable()
    guard let name = path.name, let parentPath = path.parent else {
      throw CatalogError.invalidOperation("trunks are created with their local user")
    }
    guard let parent = try node(path: parentPath) else {
      throw CatalogError.parentNotFound(parentPath)
    }
    let node = Node(
      uuid: SecureRandom.uuid(), localUserID: userID, parentID: parent.id, name: name, kind: kind,
      shareList: .owner(userID), encryptionKey: SecureRandom.nodeKey(),
      dirSalt: SecureRandom.dirSalt(), dirPrefix: SecureRandom.dirPrefix(),
      cloudID: SecureRandom.cloudID(),
      mode: mode ?? (kind == .file ? 0o644 : 0o755), mtime: mtime ?? FileTime(Date()),
      symlinkTarget: symlinkTarget)
    return try insertNew(node, parent: parent)
  }

  /// Creates a node from a value whose `parentID` and `name` are set, filling in any missing
  /// random field (empty `uuid`, `encryptionKey`, `dirSalt`, `dirPrefix`, `cloudID`) and an
  /// empty `localUserID`, and enqueues its upload. Returns the stored node.
  @discardableResult
  public func createNode(_ node: Node) throws -> Node {
    guard node.id == 0 else {
      throw CatalogError.invalidOperation("createNode needs a node with id 0")
    }
    return try journaled({ try createNode(node, id: nil) }, { .create($0) })
  }

  /// ``createNode(_:)``, with the row id `id` when given (journal replay).
  func createNode(_ node: Node, id: NodeID?) throws -> Node {
    try requireWritable()
    guard let parentID = node.parentID else {
      throw CatalogError.invalidOperation("a new node needs a parentID")
    }
    guard node.kind != .trunk, node.trunk == nil else {
      throw CatalogError.invalidOperation("trunks are created with their local user")
    }
    guard node.localUserID.isEmpty || node.localUserID == userID else {
      throw CatalogError.invalidOperation("node belongs to another local user")
    }
    guard node.eTagRcrd == nil, node.eTagData == nil else {
      throw CatalogError.invalidOperation("a new local node has no eTags")
    }
    let parent = try existingNode(id: parentID)
    var n = node
    n.localUserID = userID
    if n.uuid.isEmpty { n.uuid = SecureRandom.uuid() }
    if n.encryptionKey.isEmpty { n.encryptionKey = SecureRandom.nodeKey() }
    if n.dirSalt.isEmpty { n.dirSalt = SecureRandom.dirSalt() }
    if n.dirPrefix.isEmpty { n.dirPrefix = SecureRandom.dirPrefix() }
    if n.cloudID.isEmpty { n.cloudID = SecureRandom.cloudID() }
    n.id = id ?? 0
    return try insertNew(n, parent: parent)
  }

  private func validateName(_ name: String) throws {
    if name.isEmpty { throw CatalogError.invalidOperation("empty name") }
  }

  private func insertNew(_ node: Node, parent: Node) throws -> Node {
    try validateName(node.name)
    if parent.kind == .symlink { throw CatalogError.notADirectory(parent.id) }
    let cloudName =
      try node.explicitCloudName
      ?? CloudName.compute(name: node.name, parentDirSalt: parent.dirSalt)
    var stored = node
    if let held = try hold(node, parent: parent, cloudName: cloudName) { return held }
    do {
      stored.id = try insertNodeRow(node, cloudName: cloudName, id: node.id == 0 ? nil : node.id)
    } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
      // A name taken is refused by the `(parentID, nameKey)` index (the failed statement
      // changed nothing): asked only then, not before every insert.
      if let existing = try existingChildID(of: parent.id, nameKey: node.nameKey) {
        throw CatalogError.nameTaken(parentID: parent.id, name: node.name, existingID: existing)
      }
      throw error
    }
    sharedNodes?.put(stored)
    try check("createNode.afterInsert")
    // In a batch, queued when the batch commits unless the node is gone by then.
    if deferFirstUpload(stored.id) { return stored }
    var deps: [Int64] = []
    if let parentUpload = try firstUploadOperation(of: parent) { deps.append(parentUpload) }
    _ = try insertOperation(
      kind: .putRcrd, nodeID: stored.id, cloudID: stored.cloudID, payload: nil, dependsOn: deps)
    return stored
  }

  /// Holds a new file or directory instead of inserting its row (see ``HeldRows``) when its
  /// unit may defer its first upload, its parent is a directory and the parent's cached child
  /// names show its name free (the name index is not there to refuse it). Returns the node
  /// held, or `nil`.
  private func hold(_ node: Node, parent: Node, cloudName: String) throws -> Node? {
    guard let heldRows, let sharedNodes, defersFirstUploads, deferredUploads != nil,
      node.id == 0, node.kind == .file || node.kind == .directory,
      heldNode(parent.id) == nil || parent.kind == .directory
    else { return nil }
    let key = node.nameKey
    guard sharedNodes.hasNoChild(of: parent.id, matching: key) else { return nil }
    var held = node
    held.id = try heldRows.nextID { try nodeSequence() }
    heldRows.set(held.id, .init(node: held, cloudName: cloudName))
    sharedNodes.inserted(held.id, kind: held.kind, under: parent.id, named: key)
    sharedNodes.put(held)
    try check("createNode.afterInsert")
    _ = deferFirstUpload(held.id)
    return held
  }

  /// Stores a held node's change (`true`), or does nothing (`false`: the node has a row).
  func changeHeld(_ node: Node, cloudName: String? = nil) -> Bool {
    guard let heldRows, let held = heldRows.held(node.id), isDeferred(node.id) else {
      return false
    }
    heldRows.set(node.id, .init(node: node, cloudName: cloudName ?? held.cloudName))
    return true
  }

  func existingChildID(of parentID: NodeID, nameKey: NameKey) throws -> NodeID? {
    try rawInt(
      "SELECT id FROM nodes WHERE parentID = ? AND nameKey = ?",
      [parentID, try fields.nameKey(nameKey)])
  }

  // MARK: Updating

  /// Stores a local change of a node's attributes (kind, mode, mtime, xattrs, symlinkTarget,
  /// dataSize, burnDate, shareList, anchor, pointeeID) and enqueues an RCRD upload, unless one is
  /// already pending. Identity, placement and cloud-state fields must be unchanged: use
  /// ``moveNode(_:toParent:name:)`` and ``setCloudState(nodeID:eTagRcrd:lastModifiedRcrd:eTagData:lastModifiedData:cloudDataInfo:)``.
  @discardableResult
  public func updateNode(_ node: Node) throws -> Node {
    try journaled({ try updateNodeUnjournaled(node) }, { .update($0) })
  }

  private func updateNodeUnjournaled(_ node: Node) throws -> Node {
    try requireWritable()
    let stored = try existingNode(id: node.id)
    // Plain comparisons (key paths here cost more than the update itself).
    var changed: String?
    func differ<T: Equatable>(_ field: String, _ a: T, _ b: T) {
      if changed == nil && a != b { changed = field }
    }
    differ("uuid", node.uuid, stored.uuid)
    differ("localUserID", node.localUserID, stored.localUserID)
    differ("parentID", node.parentID, stored.parentID)
    differ("name", Array(node.name.utf8), Array(stored.name.utf8))
    differ("trunk", node.trunk, stored.trunk)
    differ("encryptionKey", node.encryptionKey, stored.encryptionKey)
    differ("dirSalt", node.dirSalt, stored.dirSalt)
    differ("dirPrefix", node.dirPrefix, stored.dirPrefix)
    differ("cloudID", node.cloudID, stored.cloudID)
    differ("eTagRcrd", node.eTagRcrd, stored.eTagRcrd)
    differ("eTagData", node.eTagData, stored.eTagData)
    differ("lastModifiedRcrd", node.lastModifiedRcrd, stored.lastModifiedRcrd)
    differ("lastModifiedData", node.lastModifiedData, stored.lastModifiedData)
    differ("cloudDataInfo", node.cloudDataInfo, stored.cloudDataInfo)
    differ("explicitCloudName", node.explicitCloudName, stored.explicitCloudName)
    if let field = changed {
      throw CatalogError.invalidOperation("updateNode cannot change \(field)")
    }
    if (node.kind == .trunk) != (stored.kind == .trunk) {
      throw CatalogError.invalidOperation("updateNode cannot change a node to or from a trunk")
    }
    if node == stored { return stored }
    if !changeHeld(node) {
      let stmt = try db.cachedStatement(
        sql: """
          UPDATE nodes SET kind = ?, shareList = ?, burnDate = ?, anchor = ?, pointeeID = ?,
            mode = ?, mtime = ?, xattrs = ?, symlinkTarget = ?, dataSize = ?
          WHERE id = ?
          """)
      try rawExecute(stmt, try attributeArguments(node) + [node.id])
    }
    sharedNodes?.put(node)
    try check("updateNode.afterUpdate")
    // A node whose first upload is deferred uploads what it has when that is queued.
    if node.trunk == nil, !isDeferred(node.id) { try enqueuePutRcrd(node) }
    return node
  }

  /// Records what is known of a node's objects in the cloud (after an upload or a download).
  /// Enqueues nothing.
  public func setCloudState(
    nodeID: NodeID, eTagRcrd: String?, lastModifiedRcrd: Date?, eTagData: String?,
    lastModifiedData: Date?, cloudDataInfo: CloudDataInfo? = nil
  ) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: """
        UPDATE nodes SET eTagRcrd = ?, lastModifiedRcrd = ?, eTagData = ?, lastModifiedData = ?,
          cloudDataInfo = ?
        WHERE id = ? AND localUserID = ?
        """)
    try rawExecute(
      stmt,
      [
        eTagRcrd, lastModifiedRcrd?.timeIntervalSinceReferenceDate, eTagData,
        lastModifiedData?.timeIntervalSinceReferenceDate, try cloudDataInfo.map { try json($0) },
        nodeID, userID,
      ])
    rowChanged(nodeID)
    if connection.rawChangesCount == 0 { throw CatalogError.nodeNotFound(nodeID) }
  }

  // MARK: Moving

  /// Renames and/or moves a node (with its subtree) and enqueues the move of its objects.
  ///
  /// Refuses trunks, a missing or foreign parent, a symlink parent, a new parent inside the
  /// node's own subtree, and a name taken (by another node) in the new parent.
  @discardableResult
  public func moveNode(_ id: NodeID, toParent newParentID: NodeID, name newName: String) throws
    -> Node
  {
    try journaled(
      { try moveNodeUnjournaled(id, toParent: newParentID, name: newName) },
      { _ in .move(id, parent: newParentID, name: newName) })
  }

  private func moveNodeUnjournaled(
    _ id: NodeID, toParent newParentID: NodeID, name newName: String
  ) throws -> Node {
    try requireWritable()
    try validateName(newName)
    let node = try existingNode(id: id)
    guard node.trunk == nil, let oldParentID = node.parentID else {
      throw CatalogError.invalidOperation("trunks cannot be moved or renamed")
    }
    let newParent = try existingNode(id: newParentID)
    if newParent.kind == .symlink { throw CatalogError.notADirectory(newParentID) }
    if let moved = try moveHeld(node, to: newParent, name: newName) { return moved }
    // (A rename in place cannot make a cycle.)
    if newParentID != oldParentID, try isAncestor(id, of: newParentID) {
      throw CatalogError.cycle(nodeID: id, newParentID: newParentID)
    }
    if oldParentID == newParentID, Array(newName.utf8) == Array(node.name.utf8) { return node }
    let newKey = NameKey(newName)
    let sameParent = newParentID == oldParentID
    // A never-uploaded node renamed in place moves no object: where its objects would have
    // been is not needed (see `renameJoinsFirstUpload`). Nor does a node whose first upload is
    // deferred, wherever it goes: that upload waits for the parent it has when it is queued.
    let deferred = isDeferred(id)
    let ops =
      !deferred && Self.renameMayJoinFirstUpload(node, sameParent: sameParent)
      ? try outstandingOperations(ofNode: id) : nil
    let joinsFirstUpload =
      deferred
      || ops.map { Self.renameJoinsFirstUpload(node, sameParent: sameParent, ops: $0) } ?? false
    let old = joinsFirstUpload ? nil : try objectLocation(of: id)!
    let newCloudName = try CloudName.compute(name: newName, parentDirSalt: newParent.dirSalt)
    do {
      let named: [(any DatabaseValueConvertible)?] = [
        try fields.storedText(newName), try fields.nameKey(newKey), newCloudName, id,
      ]
      // Without `parentID` in the statement, SQLite leaves the index on it alone.
      try rawExecute(
        sameParent ? Self.renameRowSQL : Self.moveRowSQL,
        sameParent ? named : [newParentID] + named)
    } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
      // A name taken by another node is refused by the name index (see `insertNew`).
      if let existing = try existingChildID(of: newParentID, nameKey: newKey), existing != id {
        throw CatalogError.nameTaken(parentID: newParentID, name: newName, existingID: existing)
      }
      throw error
    }
    rowChanged(id)
    sharedNodes?.placed(under: newParentID, named: newKey)
    try check("moveNode.afterUpdate")
    var moved = node
    moved.parentID = newParentID
    moved.name = newName
    moved.explicitCloudName = nil
    sharedNodes?.put(moved)
    if let old {
      try enqueueMove(
        moved, from: old, newParent: newParent, sameParent: sameParent, operations: ops)
    }
    return moved
  }

  /// Renames or moves a held node (see ``HeldRows``) when the new parent's cached child names
  /// show the name free (a directory only in place: no cycle to look for); `nil` when it is
  /// not held or that is not known.
  private func moveHeld(_ node: Node, to newParent: Node, name newName: String) throws -> Node? {
    guard let sharedNodes, heldNode(node.id) != nil, newParent.id != node.id,
      node.kind == .file || newParent.id == node.parentID,
      heldNode(newParent.id) == nil || newParent.kind == .directory
    else { return nil }
    if newParent.id == node.parentID, Array(newName.utf8) == Array(node.name.utf8) { return node }
    let newKey = NameKey(newName)
    guard sharedNodes.hasNoChild(of: newParent.id, matching: newKey) else { return nil }
    var moved = node
    moved.parentID = newParent.id
    moved.name = newName
    moved.explicitCloudName = nil
    let cloudName = try CloudName.compute(name: newName, parentDirSalt: newParent.dirSalt)
    guard changeHeld(moved, cloudName: cloudName) else { return nil }
    rowChanged(node.id)
    sharedNodes.placed(under: newParent.id, named: newKey)
    try check("moveNode.afterUpdate")
    sharedNodes.put(moved)
    return moved
  }

  private static let renameRowSQL = CatalogSQL(
    "UPDATE nodes SET name = ?, nameKey = ?, cloudName = ?, explicitCloudName = NULL WHERE id = ?")
  private static let moveRowSQL = CatalogSQL(
    """
    UPDATE nodes SET parentID = ?, name = ?, nameKey = ?, cloudName = ?, explicitCloudName = NULL
    WHERE id = ?
    """)

  /// True when `ancestor` is `id` or one of its ancestors.
  func isAncestor(_ ancestor: NodeID, of id: NodeID) throws -> Bool {
    let stmt = try db.cachedStatement(sql: "SELECT parentID FROM nodes WHERE id = ?")
    var current: NodeID? = id
    var steps = 0
    while let c = current {
      if c == ancestor { return true }
      current = try NodeID?.fetchOne(stmt, arguments: [c]) ?? nil
      steps += 1
      if steps > 1_000_000 { throw CatalogError.corrupt("parent loop at node \(id)") }
    }
    return false
  }

  // MARK: Deleting

  struct SubtreeEntry {
    var id: NodeID
    var depth: Int
    var cloudID: String
    var dirPrefix: String
    var cloudName: String
    var eTagRcrd: String?
    var eTagData: String?
    var parentDirPrefix: String?
  }

  /// The subtree rooted at `id`, root first, in breadth-first order; `childless` when the
  /// caller has just found `id` without children in this transaction.
  func subtree(of id: NodeID, childless: Bool = false) throws -> [SubtreeEntry] {
    var out: [SubtreeEntry] = []
    let read: (SQLiteStatement) throws -> Bool = { s in
      out.append(try Self.subtreeEntry(s))
      return true
    }
    if try childless || !hasChildren(id) {
      // A leaf (most deletes): one row, without the recursive query's temporary tables.
      try rawQuery(Self.leafEntrySQL, [id], row: read)
      return out
    }
    try rawQuery(
      """
      WITH RECURSIVE sub(id, depth) AS (
        SELECT id, 0 FROM nodes WHERE id = ?
        UNION ALL
        SELECT n.id, sub.depth + 1 FROM nodes n JOIN sub ON n.parentID = sub.id
      )
      SELECT n.id, sub.depth, n.cloudID, n.dirPrefix, n.cloudName, n.eTagRcrd, n.eTagData,
        p.dirPrefix
      FROM sub JOIN nodes n ON n.id = sub.id LEFT JOIN nodes p ON p.id = n.parentID
      ORDER BY sub.depth, n.id
      """, [id], row: read)
    return out
  }

  private static let leafEntrySQL = CatalogSQL(
    """
    SELECT n.id, 0, n.cloudID, n.dirPrefix, n.cloudName, n.eTagRcrd, n.eTagData, p.dirPrefix
    FROM nodes n LEFT JOIN nodes p ON p.id = n.parentID WHERE n.id = ?
    """)

  private static func subtreeEntry(_ s: SQLiteStatement) throws -> SubtreeEntry {
    let id = RawColumn.int(s, 0)
    guard let cloudID = RawColumn.text(s, 2), let dirPrefix = RawColumn.text(s, 3),
      let cloudName = RawColumn.text(s, 4)
    else { throw CatalogError.corrupt("node \(id): no cloud identity") }
    return SubtreeEntry(
      id: id, depth: Int(RawColumn.int(s, 1)), cloudID: cloudID, dirPrefix: dirPrefix,
      cloudName: cloudName, eTagRcrd: RawColumn.text(s, 5), eTagData: RawColumn.text(s, 6),
      parentDirPrefix: RawColumn.text(s, 7))
  }

  /// Deletes the rows of a subtree with their tags and links, deepest first (the catalog runs
  /// without foreign-key actions: see ``Catalog``).
  func deleteRows(_ entries: [SubtreeEntry]) throws {
    let stmt = try statement(Self.deleteRowSQL)
    let tags = try statement(Self.deleteTagsSQL)
    let links = try statement(Self.deleteLinksSQL)
    for e in entries.reversed() {
      if try !isBare(e.id) {
        try rawExecute(tags, [e.id])
        try rawExecute(links, [e.id])
      }
      try rawExecute(stmt, [e.id])
      sharedNodes?.deleted(e.id)
      try dropDeferred(e.id)
    }
  }

  private static let deleteRowSQL = CatalogSQL("DELETE FROM nodes WHERE id = ?")
  private static let deleteTagsSQL = CatalogSQL("DELETE FROM nodeTags WHERE nodeID = ?")
  private static let deleteLinksSQL = CatalogSQL("DELETE FROM nodeLinks WHERE nodeID = ?")

  func deleteRows(subtreeOf id: NodeID) throws { try deleteRows(try subtree(of: id)) }

  /// Deletes a node and its whole subtree, with their tags and links.
  ///
  /// Pending operations of the subtree are dropped; if any of it is (or may be, because an
  /// upload is in flight) in the cloud, one `deleteLeaf` or `deleteNode` operation is enqueued
  /// listing every object key to delete.
  /// `childless` tells that the caller has found the node without children in this
  /// transaction (the check is then not made again).
  public func deleteNode(_ id: NodeID, childless: Bool = false) throws {
    try journaled({ try deleteNodeUnjournaled(id, childless: childless) }, { .delete(id) })
  }

  private func deleteNodeUnjournaled(_ id: NodeID, childless: Bool = false) throws {
    try requireWritable()
    let node = try existingNode(id: id)
    guard node.trunk == nil else { throw CatalogError.invalidOperation("trunks cannot be deleted") }
    if let heldRows, heldRows.contains(id), isDeferred(id), !heldRows.hasChild(of: id) {
      // Held (see `HeldRows`): no row, child, tag, link or operation; nothing in the cloud.
      heldRows.set(id, nil)
      sharedNodes?.deleted(id)
      try dropDeferred(id)
      try check("deleteNode.afterDelete")
      return
    }
    let entries = try subtree(of: id, childless: childless)
    let plan = try planDelete(entries)
    try deleteRows(entries)
    try check("deleteNode.afterDelete")
    try enqueueDelete(root: node, plan: plan)
  }
}
