import Foundation
import GRDB

extension Catalog {
  /// How the catalog's sensitive fields are stored from now on. With a key, fields a catalog
  /// holds from before it had one are sealed first, in one transaction (opening a catalog that
  /// is sealed already, or without a key, only reads its flag).
  static func sealFields(_ writer: any DatabaseWriter, key: Data?) throws -> FieldCoding {
    let sealed = try writer.read { try isSealed($0) }
    guard let key else { return sealed ? .locked : .plain }
    let seal = try FieldSeal(key: key)
    if sealed { return .sealed(seal) }
    let migrated = try writer.write { db -> Bool in
      // Another process may have sealed it meanwhile.
      guard try !isSealed(db) else { return false }
      // The plaintext the rows held must not stay behind in the pages' free space.
      try db.execute(sql: "PRAGMA secure_delete = ON")
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
      try db.execute(sql: "UPDATE fieldSealing SET sealed = 1 WHERE id = 1")
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

  private static func isSealed(_ db: Database) throws -> Bool {
    try Int.fetchOne(db, sql: "SELECT sealed FROM fieldSealing WHERE id = 1") ?? 0 != 0
  }
}
