import Foundation
import GRDB
import GRDBSQLite

/// SQLite copies a transient text or blob binding before `sqlite3_bind_*` returns.
private let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

/// Statement parameters, as the catalog's raw statements take them.
typealias RawValues = [(any DatabaseValueConvertible)?]

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
    try run(try db.cachedStatement(sql: sql), values, row: row)
  }

  /// Runs a prepared statement that returns no rows (see ``rawQuery(_:_:row:)``).
  func rawExecute(_ statement: Statement, _ values: RawValues) throws {
    try run(statement, values) { _ in false }
  }

  /// The first column of the first row as an integer, or `nil` without rows (or when NULL).
  func rawInt(_ sql: String, _ values: RawValues) throws -> Int64? {
    var out: Int64?
    try rawQuery(sql, values) { s in
      if sqlite3_column_type(s, 0) != SQLITE_NULL { out = sqlite3_column_int64(s, 0) }
      return false
    }
    return out
  }

  private func run(
    _ statement: Statement, _ values: RawValues, row: (SQLiteStatement) throws -> Bool
  ) throws {
    let s = statement.sqliteStatement
    sqlite3_reset(s)
    defer { sqlite3_reset(s) }
    guard values.count == Int(sqlite3_bind_parameter_count(s)) else {
      throw DatabaseError(
        resultCode: .SQLITE_MISUSE,
        message: "\(values.count) values for \(sqlite3_bind_parameter_count(s)) parameters",
        sql: statement.sql)
    }
    for (i, value) in values.enumerated() {
      let index = CInt(i + 1)
      let code: CInt
      switch value?.databaseValue.storage ?? .null {
      case .null: code = sqlite3_bind_null(s, index)
      case .int64(let v): code = sqlite3_bind_int64(s, index, v)
      case .double(let v): code = sqlite3_bind_double(s, index, v)
      case .string(let v): code = sqlite3_bind_text(s, index, v, -1, transient)
      case .blob(let v):
        code = v.withUnsafeBytes {
          sqlite3_bind_blob(s, index, $0.baseAddress, CInt($0.count), transient)
        }
      }
      guard code == SQLITE_OK else { throw Self.rawError(code, s, statement.sql) }
    }
    while true {
      let code = sqlite3_step(s)
      if code == SQLITE_DONE { return }
      guard code == SQLITE_ROW else { throw Self.rawError(code, s, statement.sql) }
      if try !row(s) { return }
    }
  }

  private static func rawError(_ code: CInt, _ s: SQLiteStatement, _ sql: String) -> DatabaseError {
    let message = sqlite3_errmsg(sqlite3_db_handle(s)).map { String(cString: $0) }
    return DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
  }
}

/// Columns of the current row of a raw statement.
enum RawColumn {
  static func text(_ s: SQLiteStatement, _ i: CInt) -> String? {
    guard let p = sqlite3_column_text(s, i) else { return nil }
    let bytes = UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(s, i)))
    return String(decoding: bytes, as: UTF8.self)
  }

  static func int(_ s: SQLiteStatement, _ i: CInt) -> Int64 { sqlite3_column_int64(s, i) }
}
