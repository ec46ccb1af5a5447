import Testing

@Test func placeholder_ZDCAccountTests() { #expect(true) }
