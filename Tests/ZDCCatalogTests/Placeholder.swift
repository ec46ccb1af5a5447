import Testing

@Test func placeholder_ZDCCatalogTests() { #expect(true) }
