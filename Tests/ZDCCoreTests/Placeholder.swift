import Testing

@Test func placeholder_ZDCCoreTests() { #expect(true) }
