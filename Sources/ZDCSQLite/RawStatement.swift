public import GRDB
import GRDBSQLite

/// SQLite copies a transient text or blob binding before `sqlite3_bind_*` returns.
private let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

/// Statement parameters, as raw statements take them.
public typealias RawValues = [(any DatabaseValueConvertible)?]

extension Statement {
  /// Runs the statement through SQLite's C API with `values` bound, calling `row` for each
  /// result row until it returns false; the statement is reset (idle) afterwards.
  ///
  /// For the short statements every file operation runs: GRDB's generic argument, cursor and
  /// fetch layers cost several times what SQLite itself spends on such a statement.
  ///
  /// Statements that change rows may run here only on databases with no transaction observer
  /// watching database events (GRDB does not see them). Transaction control (BEGIN, COMMIT,
  /// SAVEPOINT) must go through GRDB.
  public func runRaw(_ values: RawValues, row: (SQLiteStatement) throws -> Bool) throws {
    let s = sqliteStatement
    sqlite3_reset(s)
    defer { sqlite3_reset(s) }
    guard values.count == Int(sqlite3_bind_parameter_count(s)) else {
      throw DatabaseError(
        resultCode: .SQLITE_MISUSE,
        message: "\(values.count) values for \(sqlite3_bind_parameter_count(s)) parameters",
        sql: sql)
    }
    for i in values.indices {
      let index = CInt(i + 1)
      let code: CInt
      // Read in place: each `(i, value)` of `enumerated()` copied the boxed value out first.
      switch values[i]?.databaseValue.storage ?? .null {
      case .null: code = sqlite3_bind_null(s, index)
      case .int64(let v): code = sqlite3_bind_int64(s, index, v)
      case .double(let v): code = sqlite3_bind_double(s, index, v)
      case .string(var v):
        // The UTF-8 in place, with its length (no C-string copy, no strlen).
        code = v.withUTF8 { u in
          u.withMemoryRebound(to: CChar.self) {
            guard let p = $0.baseAddress else { return sqlite3_bind_text(s, index, "", 0, nil) }
            return sqlite3_bind_text(s, index, p, CInt($0.count), transient)
          }
        }
      case .blob(let v):
        code = v.withUnsafeBytes {
          sqlite3_bind_blob(s, index, $0.baseAddress, CInt($0.count), transient)
        }
      }
      guard code == SQLITE_OK else { throw Self.rawError(code, s, sql) }
    }
    while true {
      let code = sqlite3_step(s)
      if code == SQLITE_DONE { return }
      guard code == SQLITE_ROW else { throw Self.rawError(code, s, sql) }
      if try !row(s) { return }
    }
  }

  private static func rawError(_ code: CInt, _ s: SQLiteStatement, _ sql: String) -> DatabaseError {
    let message = sqlite3_errmsg(sqlite3_db_handle(s)).map { String(cString: $0) }
    return DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
  }
}

/// Columns of the current row of a raw statement.
public enum RawColumn {
  public static func text(_ s: SQLiteStatement, _ i: CInt) -> String? {
    guard let p = sqlite3_column_text(s, i) else { return nil }
    let bytes = UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(s, i)))
    return String(decoding: bytes, as: UTF8.self)
  }

  public static func int(_ s: SQLiteStatement, _ i: CInt) -> Int64 { sqlite3_column_int64(s, i) }
}

/// The text in column `index` of the current row, with every byte of it (a NUL included, where
/// a C string would stop), or `nil` for NULL.
public func columnText(_ s: SQLiteStatement, _ index: CInt) -> String? {
  guard sqlite3_column_type(s, index) != SQLITE_NULL, let p = sqlite3_column_text(s, index) else {
    return nil
  }
  let count = Int(sqlite3_column_bytes(s, index))
  return String(decoding: UnsafeBufferPointer(start: p, count: count), as: UTF8.self)
}

extension Database {
  /// ``Database/isInsideTransaction``, read from SQLite directly: GRDB's accessors check the
  /// calling queue first, which cost more than the answer on every file operation. For code
  /// already running on the connection's queue.
  public var rawIsInsideTransaction: Bool {
    guard let c = sqliteConnection else { return false }
    return sqlite3_get_autocommit(c) == 0
  }

  /// ``Database/lastInsertedRowID`` (see ``rawIsInsideTransaction``).
  public var rawLastInsertedRowID: Int64 {
    guard let c = sqliteConnection else { return 0 }
    return sqlite3_last_insert_rowid(c)
  }

  /// ``Database/changesCount`` (see ``rawIsInsideTransaction``).
  public var rawChangesCount: Int {
    guard let c = sqliteConnection else { return 0 }
    return Int(sqlite3_changes64(c))
  }

  /// ``Database/totalChangesCount`` (see ``rawIsInsideTransaction``).
  public var rawTotalChangesCount: Int {
    guard let c = sqliteConnection else { return 0 }
    return Int(sqlite3_total_changes64(c))
  }
}
