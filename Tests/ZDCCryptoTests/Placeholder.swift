import Testing

@Test func placeholder_ZDCCryptoTests() { #expect(true) }
