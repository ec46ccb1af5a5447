import Foundation
import GRDB
import ZDCSQLite

extension Catalog {
  /// The sealing level a catalog opened with a key reaches (`fieldSealing.sealed`): 0, plain;
  /// 1, node keys, extended attributes, data tags and journal records sealed; 2, also names,
  /// symlink targets and directory salts sealed and the name index keyed.
  static let fieldSealingLevel = 2

  /// How the catalog's sensitive fields are stored from now on. With a key, fields a catalog
  /// holds from before it had one (or from a lower level) are sealed first, in one transaction
  /// (opening a catalog that is sealed already, or without a key, only reads its level).
  /// `level` below ``fieldSealingLevel`` is for tests that make an older catalog.
  static func sealFields(
    _ writer: any DatabaseWriter, key: Data?, level: Int = fieldSealingLevel
  ) throws -> FieldCoding {
    let current = try writer.read { try sealingLevel($0) }
    guard let key else { return current > 0 ? .locked : .plain }
    let seal = try FieldSeal(key: key)
    if current >= level { return .sealed(seal) }
    let migrated = try writer.write { db -> Bool in
      // Another process may have sealed it meanwhile.
      let from = try sealingLevel(db)
      guard from < level else { return false }
      // The plaintext the rows held must not stay behind in the pages' free space.
      try db.execute(sql: "PRAGMA secure_delete = ON")
      if from < 1 { try sealKeysAttributesAndTags(db, seal) }
      if from < 2, level >= 2 { try sealNames(db, seal) }
      try db.execute(sql: "UPDATE fieldSealing SET sealed = ? WHERE id = 1", arguments: [level])
      return true
    }
    if migrated {
      // Nor in the write-ahead log's older page images.
      try writer.writeWithoutTransaction { db in
        try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        try db.execute(sql: "PRAGMA secure_delete = OFF")
      }
    }
    return .sealed(seal)
  }

  /// Level 1: node keys, extended attributes and data tags (the `.meta` and `.thumb` sections).
  private static func sealKeysAttributesAndTags(_ db: Database, _ seal: FieldSeal) throws {
    for row in try Row.fetchAll(db, sql: "SELECT id, encryptionKey, xattrs FROM nodes") {
      let id: Int64 = row[0]
      let nodeKey: Data = row[1] ?? Data()
      let xattrs: String? = row[2]
      try db.execute(
        sql: "UPDATE nodes SET encryptionKey = ?, xattrs = ? WHERE id = ?",
        arguments: [
          try seal.seal(nodeKey), try xattrs.map { try seal.seal(Data($0.utf8)) }, id,
        ])
    }
    let tags = try Row.fetchAll(
      db, sql: "SELECT nodeID, identifier, value FROM nodeTags WHERE typeof(value) = 'blob'")
    for row in tags {
      let nodeID: Int64 = row[0]
      let identifier: String = row[1]
      let value: Data = row[2]
      try db.execute(
        sql: "UPDATE nodeTags SET value = ? WHERE nodeID = ? AND identifier = ?",
        arguments: [try seal.seal(value), nodeID, identifier])
    }
  }

  /// Level 2: names, symlink targets and directory salts sealed; the name index keyed. (A
  /// dirSalt left readable would let whoever reads the catalog test guessed names against the
  /// cloudNames.)
  private static func sealNames(_ db: Database, _ seal: FieldSeal) throws {
    let coding = FieldCoding.sealed(seal)
    // Keyed index keys are BLOBs, which never equal the TEXT keys still beside them in the
    // unique index while the rows are rewritten.
    // Read with every byte (a name may hold a NUL), then rewritten.
    var rows: [(id: Int64, name: String, target: String?, dirSalt: Data)] = []
    try db.cachedStatement(sql: "SELECT id, name, symlinkTarget, dirSalt FROM nodes").runRaw([]) {
      s in
      rows.append(
        (
          Int64.fromStatement(s, atUncheckedIndex: 0) ?? 0, columnText(s, 1) ?? "",
          columnText(s, 2), Data.fromStatement(s, atUncheckedIndex: 3) ?? Data()
        ))
      return true
    }
    for (id, name, target, dirSalt) in rows {
      try db.execute(
        sql: "UPDATE nodes SET name = ?, nameKey = ?, symlinkTarget = ?, dirSalt = ? WHERE id = ?",
        arguments: [
          try coding.storedText(name), try coding.nameKey(of: name),
          try coding.storedText(target), try seal.seal(dirSalt), id,
        ])
    }
  }

  private static func sealingLevel(_ db: Database) throws -> Int {
    try Int.fetchOne(db, sql: "SELECT sealed FROM fieldSealing WHERE id = 1") ?? 0
  }
}
