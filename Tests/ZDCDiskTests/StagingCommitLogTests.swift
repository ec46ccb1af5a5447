import Foundation
import Glibc
import Testing
import ZDCCore
import ZDCTestSupport

@testable import ZDCDisk

/// The staging commit log's records read back as written — any node id and version, in order —
/// and a record cut short by a crash is not read.
@Suite struct StagingCommitLogTests {
  @Test func recordsReadBackAsWritten() throws {
    let tmp = try TemporaryDirectory("commitlog")
    let path = tmp.path("staging.log").path
    let log = try StagingCommitLog(path: path)
    let written: [(String, NodeID, Int64)] = [
      (String(repeating: "0", count: 32), 0, 0),
      ("0123456789abcdef0123456789abcdef", 7, 1),
      ("ffffffffffffffffffffffffffffffff", 10, 99),
      ("a1b2c3d4e5f60718293a4b5c6d7e8f90", .max, .max),
      ("00000000000000000000000000000001", 1_000_000_007, -12),
      ("00000000000000000000000000000002", .min, .min),
    ]
    for (name, node, version) in written {
      try log.append(name: name, nodeID: node, version: version)
    }
    let text = try String(contentsOfFile: path, encoding: .utf8)
    #expect(
      text.hasPrefix("00000000000000000000000000000000 0 0\n0123456789abcdef0123456789abcdef 7 1\n")
    )
    #expect(text.contains(" 9223372036854775807 9223372036854775807\n"))
    #expect(text.hasSuffix(" -9223372036854775808 -9223372036854775808\n"))
    let read = log.records()
    #expect(read.map(\.name) == written.map(\.0))
    #expect(read.map(\.nodeID) == written.map(\.1))
    #expect(read.map(\.version) == written.map(\.2))
    // A record the crash cut short (no newline) is not read; the next process's records are.
    let fd = open(path, O_WRONLY | O_APPEND)
    #expect(fd >= 0)
    _ = "ffffffffffffffffffffffffffffffff 3 ".withCString { write(fd, $0, strlen($0)) }
    close(fd)
    #expect(try StagingCommitLog(path: path).records().count == written.count)
  }
}
