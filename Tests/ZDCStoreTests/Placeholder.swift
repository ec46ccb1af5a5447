import Testing

@Test func placeholder_ZDCStoreTests() { #expect(true) }
