import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

/// Catalog errors reach the log, which never holds a plaintext name: their descriptions name no
/// node.
@Suite struct CatalogErrorTests {
  @Test func descriptionsNameNoNode() throws {
    let secret = "secret-name-\(UUID().uuidString)"
    let errors: [CatalogError] = [
      .nameTaken(parentID: 1, name: secret, existingID: 2), .pathNotFound(p("a", secret)),
      .parentNotFound(p(secret, "b")),
    ]
    for e in errors { #expect(!e.description.contains(secret), "\(e)") }
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in _ = try tx.createNode(path: p(secret)) }
    #expect {
      try catalog.write("alice") { tx in _ = try tx.createNode(path: p(secret)) }
    } throws: { error in
      guard case CatalogError.nameTaken = error else { return false }
      return !String(describing: error).contains(secret)
    }
  }
}
