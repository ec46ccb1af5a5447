import Foundation
import Glibc
import Testing
import ZDCCore
import ZDCTestSupport

@testable import ZDCDisk

/// The staging commit log's records read back as written — any node id, any version up to
/// 2^56 - 1, exchanges, in order —;
/// what a crash or a power loss leaves after them (a torn record, an older epoch's records,
/// zeros) is not read; emptying it starts a new epoch; its flushes need only its data written
/// once its length is on stable storage; a log in the older text format is still read.
@Suite struct StagingCommitLogTests {
  let written: [StagingCommitLog.Record] = [
    .init(name: String(repeating: "0", count: 32), nodeID: 0, version: 0),
    .init(name: "0123456789abcdef0123456789abcdef", nodeID: 7, version: 1),
    .init(name: "ffffffffffffffffffffffffffffffff", nodeID: 10, version: 99),
    .init(name: "a1b2c3d4e5f60718293a4b5c6d7e8f90", nodeID: .max, version: (1 << 56) - 1),
    .init(name: "00000000000000000000000000000001", nodeID: 1_000_000_007, version: 12),
    .init(name: "00000000000000000000000000000002", nodeID: .min, version: 0),
    .init(
      name: "0123456789abcdef0123456789abcde0", nodeID: 7, version: 1, exchange: true,
      copiedAsNeeded: true),
    .init(name: "ffffffffffffffffffffffffffffffe0", nodeID: 10, version: 99, exchange: true),
  ]

  func append(_ log: StagingCommitLog, _ records: [StagingCommitLog.Record]) throws {
    for r in records {
      try log.append(
        name: r.name, nodeID: r.nodeID, version: r.version, exchange: r.exchange,
        copiedAsNeeded: r.copiedAsNeeded)
    }
  }

  func overwrite(_ path: String, at offset: Int, with bytes: [UInt8]) {
    let fd = open(path, O_WRONLY)
    #expect(fd >= 0)
    _ = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
    close(fd)
  }

  @Test func recordsReadBackAsWritten() throws {
    let tmp = try TemporaryDirectory("commitlog")
    let path = tmp.path("staging.log").path
    let log = try StagingCommitLog(path: path)
    try append(log, written)
    #expect(log.records() == written)
    #expect(log.count == written.count)
    // Nothing of a name or content: the file names, in hex, and numbers.
    let bytes = try Data(contentsOf: URL(fileURLWithPath: path))
    #expect(bytes.count >= 64 * (written.count + 1))
    #expect(try StagingCommitLog(path: path).records() == written)
    // A record a power loss tore (its second half written, its first still zeros) and
    // garbage after it are not read; the next process's records go where the valid ones end.
    let next = 64 * (written.count + 1)
    overwrite(path, at: next + 32, with: [UInt8](repeating: 0x5a, count: 32))
    let reopened = try StagingCommitLog(path: path)
    #expect(reopened.records() == written)
    let more = StagingCommitLog.Record(
      name: "abcdefabcdefabcdefabcdefabcdef01", nodeID: 3, version: 4)
    try append(reopened, [more])
    #expect(try StagingCommitLog(path: path).records() == written + [more])
    // A name of another length is refused, and nothing is written.
    #expect(throws: DiskError.self) { try reopened.append(name: "short", nodeID: 1, version: 1) }
    // So is a version whose top byte the flags take (or a negative one).
    for version in [Int64(1) << 56, -1, .max] {
      #expect(throws: DiskError.self) {
        try reopened.append(name: more.name, nodeID: 1, version: version)
      }
    }
    #expect(try StagingCommitLog(path: path).records() == written + [more])
  }

  @Test func emptyingStartsANewEpoch() throws {
    let tmp = try TemporaryDirectory("commitlog")
    let path = tmp.path("staging.log").path
    let log = try StagingCommitLog(path: path)
    try append(log, written)
    let length = try Data(contentsOf: URL(fileURLWithPath: path)).count
    try log.clear()
    #expect(log.count == 0)
    #expect(log.records().isEmpty)
    // The older records are still in the file, of the older epoch: not read.
    #expect(try StagingCommitLog(path: path).records().isEmpty)
    #expect(try Data(contentsOf: URL(fileURLWithPath: path)).count == length)
    try append(log, [written[2]])
    #expect(try StagingCommitLog(path: path).records() == [written[2]])
    // A damaged header (a power loss tore it) gives way to the first record's epoch.
    overwrite(path, at: 20, with: [1, 2, 3])
    #expect(try StagingCommitLog(path: path).records() == [written[2]])
    try log.clear()
    try log.clear()
    #expect(try StagingCommitLog(path: path).records().isEmpty)
  }

  /// A header and first record both damaged leave no epoch known: nothing is read, and the next
  /// records start an epoch past every one in the file, so that no older record passes for one
  /// of them.
  @Test func aLogWithoutAKnownEpochStartsPastEveryEpochInIt() throws {
    let tmp = try TemporaryDirectory("commitlog")
    let path = tmp.path("staging.log").path
    do {
      let log = try StagingCommitLog(path: path)
      try append(log, Array(written[0..<4]))
      try log.clear()
      try append(log, [written[4]])
      try log.clear()
      try append(log, [written[5]])
    }
    // Header and first record torn; the records of the two older epochs are intact after them.
    overwrite(path, at: 0, with: [UInt8](repeating: 0, count: 128))
    let log = try StagingCommitLog(path: path)
    #expect(log.records().isEmpty)
    try append(log, [written[1]])
    #expect(try StagingCommitLog(path: path).records() == [written[1]])
    try log.clear()
    try append(log, [written[2], written[3]])
    #expect(try StagingCommitLog(path: path).records() == [written[2], written[3]])
  }

  @Test func flushesNeedOnlyTheDataOnceTheLengthIsDurable() throws {
    let tmp = try TemporaryDirectory("commitlog")
    let path = tmp.path("staging.log").path
    let log = try StagingCommitLog(path: path)
    #expect(log.pendingFlush().isEmpty)
    try append(log, [written[0]])
    #expect(!log.mayHaveDurableRecords)
    // The file was made longer (room ahead): the whole file.
    var flush = log.pendingFlush()
    #expect(flush.paths == [path] && flush.dataOnly.isEmpty)
    flush.done()
    #expect(log.mayHaveDurableRecords)
    #expect(log.pendingFlush().isEmpty)
    try append(log, [written[1]])
    flush = log.pendingFlush()
    #expect(flush.paths.isEmpty && flush.dataOnly.count == 1)
    // Emptied meanwhile: that flush records nothing.
    try log.clear()
    flush.done()
    #expect(!log.mayHaveDurableRecords)
    #expect(log.pendingFlush().isEmpty)
    try append(log, [written[2]])
    flush = log.pendingFlush()
    #expect(flush.paths.isEmpty && flush.dataOnly.count == 1)
    flush.done()
    #expect(log.mayHaveDurableRecords)
  }

  /// A log written by the build before this format: text lines, a last one cut short by a
  /// crash not read. Emptying it makes it one of this format.
  @Test func aLogInTheOlderFormatIsRead() throws {
    let tmp = try TemporaryDirectory("commitlog")
    let path = tmp.path("staging.log").path
    let text =
      "0123456789abcdef0123456789abcdef 7 1\n"
      + "a1b2c3d4e5f60718293a4b5c6d7e8f90 9223372036854775807 -3\n"
      + "ffffffffffffffffffffffffffffffff 3 "
    try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    let log = try StagingCommitLog(path: path)
    #expect(
      log.records() == [
        .init(name: "0123456789abcdef0123456789abcdef", nodeID: 7, version: 1),
        .init(name: "a1b2c3d4e5f60718293a4b5c6d7e8f90", nodeID: .max, version: -3),
      ])
    #expect(log.mayHaveDurableRecords)
    try log.clear()
    #expect(log.records().isEmpty)
    #expect(try StagingCommitLog(path: path).records().isEmpty)
    try append(log, [written[1]])
    #expect(try StagingCommitLog(path: path).records() == [written[1]])
  }
}
