import GRDB
public import ZDCCore
import ZDCSQLite

/// Tags (small values attached to a node) and links (a node ↔ one of the app's keys).
/// Both disappear with their node.
extension CloudTransaction {
  /// Sets (or with `nil`, removes) the tag `identifier` of a node.
  public func setTag(_ value: TagValue?, forNodeID nodeID: NodeID, identifier: String) throws {
    // Removing a tag the node does not have changes nothing: there is nothing to journal.
    _ = try journaled(
      { try setTagUnjournaled(value, forNodeID: nodeID, identifier: identifier) },
      { changed in changed ? .setTag(nodeID, identifier: identifier, value: value) : nil })
  }

  /// Returns whether the catalog changed.
  private func setTagUnjournaled(_ value: TagValue?, forNodeID nodeID: NodeID, identifier: String)
    throws -> Bool
  {
    try requireWritable()
    _ = try existingNode(id: nodeID)
    if let value {
      sharedNodes?.clothed(nodeID)
      let dbValue: any DatabaseValueConvertible
      switch value {
      case .string(let s): dbValue = s
      case .int(let i): dbValue = i
      case .data(let d): dbValue = try fields.seal(d)
      }
      try rawExecute(Self.setTagSQL, [nodeID, identifier, dbValue])
    } else {
      // A node without tags (most renames clear a conflict tag a new node never had).
      if try isBare(nodeID) { return false }
      try rawExecute(Self.removeTagSQL, [nodeID, identifier])
    }
    try check("setTag.afterWrite")
    return value != nil || connection.rawChangesCount > 0
  }
  private static let setTagSQL = CatalogSQL(
    "INSERT OR REPLACE INTO nodeTags (nodeID, identifier, value) VALUES (?, ?, ?)")
  private static let removeTagSQL = CatalogSQL(
    "DELETE FROM nodeTags WHERE nodeID = ? AND identifier = ?")

  /// The tag `identifier` of a node, or `nil`.
  public func tag(forNodeID nodeID: NodeID, identifier: String) throws -> TagValue? {
    // A directory's listing and removal ask for its sections' tags, which most nodes lack.
    if try isBare(nodeID) { return nil }
    var value: DatabaseValue?
    try rawQuery(Self.tagSQL, [nodeID, identifier, userID]) { s in
      value = DatabaseValue(sqliteStatement: s, index: 0)
      return false
    }
    return try value.flatMap(tagValue)
  }
  private static let tagSQL = CatalogSQL(
    """
    SELECT t.value FROM nodeTags t JOIN nodes n ON n.id = t.nodeID
    WHERE t.nodeID = ? AND t.identifier = ? AND n.localUserID = ?
    """)

  /// Every tag of a node, by identifier.
  public func tags(forNodeID nodeID: NodeID) throws -> [String: TagValue] {
    let stmt = try db.cachedStatement(
      sql: """
        SELECT t.identifier, t.value FROM nodeTags t JOIN nodes n ON n.id = t.nodeID
        WHERE t.nodeID = ? AND n.localUserID = ?
        """)
    var out: [String: TagValue] = [:]
    for row in try Row.fetchAll(stmt, arguments: [nodeID, userID]) {
      if let v = try tagValue(row[1]) { out[row[0]] = v }
    }
    return out
  }

  /// The nodes of this user that carry the tag `identifier` (any value), by id.
  public func nodeIDs(withTag identifier: String) throws -> [NodeID] {
    let stmt = try db.cachedStatement(
      sql: """
        SELECT t.nodeID FROM nodeTags t JOIN nodes n ON n.id = t.nodeID
        WHERE t.identifier = ? AND n.localUserID = ? ORDER BY t.nodeID
        """)
    return try NodeID.fetchAll(stmt, arguments: [identifier, userID])
  }

  private func tagValue(_ value: DatabaseValue) throws -> TagValue? {
    switch value.storage {
    case .string(let s): return .string(s)
    case .int64(let i): return .int(i)
    case .blob(let d): return .data(try fields.open(d))
    case .double(let d): return .int(Int64(d))
    case .null: return nil
    }
  }

  /// Links a node to a key in one of the app's collections. A node links to at most one key and
  /// a key to at most one node; linking the same pair again does nothing.
  public func linkNodeID(_ nodeID: NodeID, toKey key: String, inCollection collection: String)
    throws
  {
    try requireWritable()
    _ = try existingNode(id: nodeID)
    if let current = try linkedCollectionAndKey(forNodeID: nodeID) {
      if current.collection == collection && current.key == key { return }
      throw CatalogError.alreadyLinked(nodeID: nodeID, collection: collection, key: key)
    }
    if try linkedNodeID(forKey: key, inCollection: collection) != nil {
      throw CatalogError.alreadyLinked(nodeID: nodeID, collection: collection, key: key)
    }
    sharedNodes?.clothed(nodeID)
    let stmt = try db.cachedStatement(
      sql: "INSERT INTO nodeLinks (nodeID, localUserID, collection, key) VALUES (?, ?, ?, ?)")
    try rawExecute(stmt, [nodeID, userID, collection, key])
    try check("linkNode.afterWrite")
  }

  /// Removes a node's link, if any.
  public func unlinkNodeID(_ nodeID: NodeID) throws {
    try requireWritable()
    let stmt = try db.cachedStatement(
      sql: "DELETE FROM nodeLinks WHERE nodeID = ? AND localUserID = ?")
    try rawExecute(stmt, [nodeID, userID])
  }

  /// The collection and key a node is linked to, or `nil`.
  public func linkedCollectionAndKey(forNodeID nodeID: NodeID) throws -> (
    collection: String, key: String
  )? {
    let stmt = try db.cachedStatement(
      sql: "SELECT collection, key FROM nodeLinks WHERE nodeID = ? AND localUserID = ?")
    guard let row = try Row.fetchOne(stmt, arguments: [nodeID, userID]) else { return nil }
    return (row[0], row[1])
  }

  /// The node linked to a key, or `nil`.
  public func linkedNodeID(forKey key: String, inCollection collection: String) throws -> NodeID? {
    let stmt = try db.cachedStatement(
      sql: "SELECT nodeID FROM nodeLinks WHERE localUserID = ? AND collection = ? AND key = ?")
    return try NodeID.fetchOne(stmt, arguments: [userID, collection, key])
  }
}
