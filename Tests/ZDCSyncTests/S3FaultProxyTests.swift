import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

/// Two devices on S3 through a loopback proxy that breaks HTTP requests the way networks and
/// servers do.
@Suite(.serialized, .motoServer) struct S3FaultProxyTests {
  /// While the proxy resets connections, answers 500s and 503s, delays, truncates bodies and
  /// loses answers, both devices keep editing (uploads, a multipart one among them) and
  /// pulling; once the faults stop, everything is uploaded and downloaded, both devices hold
  /// the same tree and bytes, and the bucket holds one RCRD per node.
  @Test func devicesConvergeOnceResets503sDelaysAndTruncatedBodiesStop() throws {
    let server = try MotoServer.require()
    let direct = try server.makeStore(transport: fastRetries())
    let proxy = try FaultProxy(upstreamPort: server.port)
    defer { proxy.stop() }
    var config = direct.configuration
    config.endpoint = URL(string: proxy.endpoint)
    config.transport = fastRetries(attempts: 3)
    let faulty = S3Store(configuration: config)
    let user = try TestUser()
    let a = try Device("alpha", user: user, store: faulty) { push, _ in
      push.multipartThreshold = 6 << 20
      push.partSize = 5 << 20
    }
    let b = try Device("beta", user: user, store: faulty)
    try a.start()
    try b.start()
    try a.create("base", kind: .directory)
    for i in 0..<5 { try a.create("base/f\(i).txt", "initial \(i)") }
    try a.sync()
    try b.sync()

    proxy.injectRandomly(
      [
        .reset, .status(503, code: "SlowDown"), .status(500, code: "InternalError"),
        .delay(0.05), .truncate, .loseAnswer,
      ], rate: 0.2, seed: 17)
    let big = randomData(13 << 20, seed: 23)
    try a.create("big.bin")
    try a.write("big.bin", big)
    for i in 0..<5 { try a.write("base/f\(i).txt", "alpha \(i)") }
    for i in 0..<10 { try a.create("base/new-\(i).txt", "new \(i)") }
    try a.move("base/f4.txt", to: "moved.txt")
    try a.delete("base/f3.txt")
    try b.create("from-b", kind: .directory)
    try b.create("from-b/x.txt", "x from beta")
    for _ in 0..<4 {
      _ = try? a.engine.pull.pull()
      _ = try? b.engine.pull.pull()
      Thread.sleep(forTimeInterval: 0.3)
    }
    #expect(proxy.faultsServed > 0)
    proxy.clearFaults()
    for _ in 0..<2 {
      try a.sync(120)
      try b.sync(120)
    }

    let ta = try a.tree(withContent: false)
    #expect(ta == (try b.tree(withContent: false)))
    #expect(ta["/base/f3.txt"] == nil)
    #expect(ta["/moved.txt"] == "file")
    #expect(!ta.keys.contains { $0.contains("conflicted copy") || $0.contains(" 2") })
    for d in [a, b] {
      #expect(try d.cloudContent("big.bin") == big, "\(d.name)")
      #expect(try d.cloudContent("base/f0.txt") == Data("alpha 0".utf8))
      #expect(try d.cloudContent("base/new-9.txt") == Data("new 9".utf8))
      #expect(try d.cloudContent("from-b/x.txt") == Data("x from beta".utf8))
      #expect(try d.operationCount() == 0)
    }
    let rcrds = try direct.listAll(prefix: "\(user.userID)/").filter { $0.key.hasSuffix(".rcrd") }
    #expect(rcrds.count == ta.count)
    print("S3 fault proxy: \(proxy.faultsServed) faults injected")
    a.engine.stop()
    b.engine.stop()
  }
}
