import Foundation
import GRDB
import GRDBSQLite
import ZDCSQLite

extension CloudTransaction {
  /// Runs a statement (cached by its SQL) through SQLite's C API, calling `row` for each result
  /// row until it returns false; the statement is reset (idle) afterwards.
  ///
  /// For the short statements every file operation runs: GRDB's generic argument, cursor and
  /// fetch layers cost several times what SQLite itself spends on such a statement.
  ///
  /// Statements that change rows may run here too: GRDB watches executed statements for its
  /// transaction observers, and the catalog's only observer (``CommitHooks``) observes no
  /// database event. Transaction control (BEGIN, COMMIT, SAVEPOINT) must go through GRDB.
  func rawQuery(_ sql: String, _ values: RawValues, row: (SQLiteStatement) throws -> Bool)
    throws
  {
    try db.cachedStatement(sql: sql).runRaw(values, row: row)
  }

  /// The prepared statement of `sql`: from the writer connection's table there, from GRDB's
  /// cache on a reader connection.
  func statement(_ sql: CatalogSQL) throws -> Statement {
    if let writerStatements { return try writerStatements.statement(sql, on: db) }
    return try db.cachedStatement(sql: sql.text)
  }

  /// ``rawQuery(_:_:row:)`` of a ``CatalogSQL`` statement.
  func rawQuery(_ sql: CatalogSQL, _ values: RawValues, row: (SQLiteStatement) throws -> Bool)
    throws
  {
    try statement(sql).runRaw(values, row: row)
  }

  /// Runs a prepared statement that returns no rows (see ``rawQuery(_:_:row:)``).
  func rawExecute(_ statement: Statement, _ values: RawValues) throws {
    try statement.runRaw(values) { _ in false }
  }

  /// ``rawExecute(_:_:)`` of a ``CatalogSQL`` statement.
  func rawExecute(_ sql: CatalogSQL, _ values: RawValues) throws {
    try rawExecute(try statement(sql), values)
  }

  /// The first column of the first row as an integer, or `nil` without rows (or when NULL).
  func rawInt(_ sql: String, _ values: RawValues) throws -> Int64? {
    try rawInt(try db.cachedStatement(sql: sql), values)
  }

  /// ``rawInt(_:_:)`` of a ``CatalogSQL`` statement.
  func rawInt(_ sql: CatalogSQL, _ values: RawValues) throws -> Int64? {
    try rawInt(try statement(sql), values)
  }

  private func rawInt(_ statement: Statement, _ values: RawValues) throws -> Int64? {
    var out: Int64?
    try statement.runRaw(values) { s in
      if sqlite3_column_type(s, 0) != SQLITE_NULL { out = sqlite3_column_int64(s, 0) }
      return false
    }
    return out
  }
}
