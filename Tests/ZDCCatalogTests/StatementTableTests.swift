import Foundation
import GRDB
import Testing
import ZDCCore

@testable import ZDCCatalog

@Suite struct StatementTableTests {
  /// On the writer a `CatalogSQL` is prepared once: every later transaction runs the same
  /// statement, and two texts never share one. A reader connection has no table (its
  /// statements come from GRDB's cache) and still runs the text.
  @Test func aStatementIsPreparedOncePerTextOnTheWriter() throws {
    let catalog = try makeCatalog()
    let count = CatalogSQL("SELECT COUNT(*) FROM nodes WHERE localUserID = ?")
    let one = CatalogSQL("SELECT 1")
    let first = try catalog.write("alice") { tx -> Statement in
      let a = try tx.statement(count)
      #expect(try tx.statement(count) === a)
      #expect(try tx.statement(one) !== a)
      try tx.createNode(path: p("a"))
      return a
    }
    let (again, nodes) = try catalog.write("alice") { tx in
      (try tx.statement(count), try tx.rawInt(count, ["alice"]))
    }
    #expect(again === first)
    // The trunks and "a", counted by the statement prepared in the first transaction.
    #expect(nodes == Int64(Trunk.allCases.count + 1))
    #expect(try catalog.read("alice", onWriter: true) { try $0.statement(count) } === first)
    let onReader = try catalog.read("alice") { tx -> (Bool, Int64?) in
      (tx.writerStatements == nil, try tx.rawInt(count, ["alice"]))
    }
    #expect(onReader.0)
    #expect(onReader.1 == nodes)
  }

  /// Slots are distinct and dense: a table grows to the highest slot it has seen.
  @Test func textsHaveDistinctSlots() {
    let texts = (0..<20).map { CatalogSQL("SELECT \($0)") }
    #expect(Set(texts.map(\.slot)).count == texts.count)
  }
}
