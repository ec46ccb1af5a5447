import GRDB
import Synchronization

/// The SQL of a statement that file operations run, with a slot of its own in the writer
/// connection's ``StatementTable``.
///
/// GRDB caches prepared statements by their SQL, so every use hashes the whole text (up to a few
/// hundred bytes); a create/stat/rename/unlink iteration runs about forty statements. A slot
/// is found by indexing an array.
final class CatalogSQL: Sendable {
  let text: String
  let slot: Int
  private static let slots = Atomic<Int>(0)

  init(_ text: String) {
    self.text = text
    slot = Self.slots.add(1, ordering: .relaxed).oldValue
  }
}

/// The writer connection's prepared statements by ``CatalogSQL`` slot. Used only on the
/// writer's queue (by the transactions of ``Catalog/write(_:commit:_:)`` and reads on the writer),
/// which serializes every access.
final class StatementTable: @unchecked Sendable {
  private var statements: [Statement?] = []

  /// The statement of `sql` on `db` (the writer connection), prepared at its first use.
  func statement(_ sql: CatalogSQL, on db: Database) throws -> Statement {
    if sql.slot < statements.count, let known = statements[sql.slot] { return known }
    // GRDB's cache prepares it (persistent) and keeps it as well: the same statement.
    let made = try db.cachedStatement(sql: sql.text)
    if sql.slot >= statements.count {
      statements.append(contentsOf: repeatElement(nil, count: sql.slot + 1 - statements.count))
    }
    statements[sql.slot] = made
    return made
  }
}
