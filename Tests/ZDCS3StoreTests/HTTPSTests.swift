import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

/// The store over HTTPS, against moto with a self-signed certificate.
@Suite(.motoServerTLS) struct HTTPSTests {
  @Test func worksOverTLSWhenVerificationIsOff() throws {
    var options = S3TransportOptions()
    options.verifyTLS = false
    let store = try MotoServer.require().makeStore(prefix: "tls", transport: options)
    let e = try store.put(key: "k", body: .data(Data("secret bytes".utf8)), condition: .ifNoneMatch)
    #expect(try store.head(key: "k").eTag == e)
    #expect(try store.get(key: "k", range: ByteRange(7, 12)) == Data("bytes".utf8))
    #expect(try store.listAll(prefix: "").map(\.key) == ["k"])
  }

  @Test func untrustedCertificateIsRefusedWithoutRetrying() throws {
    let server = try MotoServer.require()
    let store = S3Store(configuration: try server.configuration(transport: fastRetries()))
    #expect {
      try store.head(key: "k")
    } throws: { error in
      if case StoreError.unsupported(let m) = error { return m.contains("curl") }
      return false
    }
    #expect(store.requestCount(.headObject) == 1)
  }
}
