import CLinux
import Foundation
import Glibc
import Synchronization
import ZDCCore
import ZDCSQLite

/// The staging commit log (see `DiskManager.commitLog`): one record per committed staging
/// version whose row the index may not hold yet — the file's name (random hex: nothing of a
/// node's name or content), the node id, the version —, and one per such version that the next
/// version was then written in place of (an exchange: the version moved to its copy's file,
/// the file it had becoming its `origin`; see `DiskManager.writeInPlace`).
///
/// Layout: a 64-byte header (`ZDCSLOG2`, the log's epoch, an FNV-1a checksum), then 64-byte
/// records (the name's 32 characters, node id, version with the record's flags in its top
/// byte, epoch, checksum), little-endian. Each
/// record is written with one `pwrite(2)` into room made ahead with zeros (``LogRoom``), so it
/// survives a crash of the process as soon as the commit returns, and a flush of new records
/// (an `fsync` of a file in the mount) needs only their data written: the log's length and
/// blocks are on stable storage already. Emptying the log starts a new epoch in its header;
/// the records are then written over from the start. Reading stops at the first record that
/// is not of the header's epoch or whose checksum fails (zeros, an older epoch's record, a
/// record a power loss tore: none of them acknowledged after the records before it).
///
/// A log in the format before it (text lines `{name} {nodeID} {version}`) is read as such; the
/// first emptying rewrites it in this one.
final class StagingCommitLog: @unchecked Sendable {
  // @unchecked: `epoch`, `end`, `fileLength`, `legacy`, `openLog` and `flushPrepared` change
  // only under the disk manager's mutation lock (or in `init`); the flush bookkeeping is in
  // `flushState`.
  let path: String
  private let fd: Int32
  /// The epoch of the records written now.
  private var epoch: UInt64
  /// The highest epoch found in the file (any record, the header): the next emptying goes
  /// past it, so that no older record can pass for one of the new epoch (after a damaged
  /// header made the epoch a record's, or unknown).
  private var highestEpoch: UInt64 = 0
  /// The header must be written before the next record (the file has none, or a damaged one).
  private var headerNeeded = false
  /// Where the next record goes.
  private var end: UInt64
  /// The file's length: header, records and the zeros after them.
  private var fileLength: UInt64
  /// Records of a log in the older text format, until the first emptying.
  private var legacy: [Record]?
  /// The log as a file to flush (another descriptor, made at the first flush).
  private var openLog: OpenLog?
  /// A flush of records of the current epoch was prepared: it may have made them durable
  /// (or may yet, while it runs).
  private var flushPrepared = false
  /// How far the records were flushed (0: none since the log was emptied), the length whose
  /// allocation and size are on stable storage, and the emptyings so far (a flush prepared
  /// before one records nothing).
  private let flushState = Mutex<(flushed: UInt64, durableLength: UInt64, emptyings: Int)>(
    (0, 0, 0))

  static let recordSize = 64
  static let headerSize: UInt64 = 64
  static let nameLength = 32
  private static let magic = Array("ZDCSLOG2".utf8)

  /// A committed staging version, as recorded.
  struct Record: Equatable {
    var name: String
    var nodeID: NodeID
    var version: Int64
    /// An exchange: the version an earlier record of this log named (same node and version)
    /// is now in this file, the earlier record's file its origin.
    var exchange = false
    /// (An exchange.) The copy is made as it is needed (`CopyBeforeWrite`).
    var copiedAsNeeded = false
  }

  /// The record's flags, in the top byte of its version.
  private static let exchangeFlag: UInt64 = 1 << 56
  private static let copiedAsNeededFlag: UInt64 = 1 << 57
  private static let versionMask: UInt64 = (1 << 56) - 1

  init(path: String) throws {
    self.path = path
    fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw DiskError.io("cannot open the staging commit log: errno \(errno)") }
    let bytes = Self.readAll(fd)
    fileLength = UInt64(bytes.count)
    if bytes.isEmpty {
      epoch = 1
      end = Self.headerSize
      // The header goes in with the first record (the file's length changes then anyway).
    } else if Self.isLegacy(bytes) {
      legacy = Self.legacyRecords(bytes)
      epoch = 1
      end = Self.headerSize
    } else {
      let contents = Self.scan(bytes, highest: true)
      highestEpoch = contents.highest
      end = Self.headerSize + UInt64(contents.count * Self.recordSize)
      if let known = contents.epoch {
        epoch = known
      } else {
        // No epoch known: the first record starts one past every epoch in the file, with a
        // header naming it.
        epoch = contents.highest &+ 1
        headerNeeded = true
      }
    }
  }

  deinit { Glibc.close(fd) }

  /// The records of the current epoch, in order.
  func records() -> [Record] {
    if let legacy { return legacy }
    let bytes = Self.readAll(fd)
    return (0..<Self.scan(bytes).count).map { i in
      let at = Int(Self.headerSize) + i * Self.recordSize
      return bytes.withUnsafeBytes { b in
        let word = Self.load(b, at + 40)
        return Record(
          name: String(decoding: b[at..<(at + Self.nameLength)], as: UTF8.self),
          nodeID: NodeID(bitPattern: Self.load(b, at + 32)),
          version: Int64(bitPattern: word & Self.versionMask),
          exchange: word & Self.exchangeFlag != 0,
          copiedAsNeeded: word & Self.copiedAsNeededFlag != 0)
      }
    }
  }

  /// How many records the log holds now.
  var count: Int { legacy?.count ?? Int((end - Self.headerSize) / UInt64(Self.recordSize)) }

  /// Whether records of the current epoch may be durable (a flush of them was prepared since the
  /// log was emptied; it may still run): the index must be on stable storage with their rows
  /// before the log may be emptied. Always so of a log in the older format.
  var mayHaveDurableRecords: Bool { legacy != nil || flushPrepared }

  /// Appends a record: on disk (in the page cache) when it returns. `name` is a staging file's
  /// name (32 hexadecimal digits). An exchange (see ``Record/exchange``) follows the record of
  /// its version in the same epoch.
  func append(
    name: String, nodeID: NodeID, version: Int64, exchange: Bool = false,
    copiedAsNeeded: Bool = false
  ) throws {
    guard name.utf8.count == Self.nameLength else {
      throw DiskError.io("staging file name of unexpected length in the commit log")
    }
    guard version >= 0, UInt64(version) <= Self.versionMask else {
      throw DiskError.io("staging version out of the commit log's range")
    }
    let flags = (exchange ? Self.exchangeFlag : 0) | (copiedAsNeeded ? Self.copiedAsNeededFlag : 0)
    if legacy != nil { try restart() }
    if fileLength < Self.headerSize || headerNeeded {
      try write(header(epoch: epoch), at: 0)
      headerNeeded = false
    }
    if end + UInt64(Self.recordSize) > fileLength {
      let target = LogRoom.target(after: end)
      fileLength = max(fileLength, LogRoom.writeZeros(fd, from: fileLength, to: target))
      guard end + UInt64(Self.recordSize) <= fileLength else { throw DiskError.noSpace }
    }
    // On the stack: a record is written on every close of a file written to.
    try withUnsafeTemporaryAllocation(byteCount: Self.recordSize, alignment: 8) { b in
      var name = name
      name.withUTF8 { u in b.copyMemory(from: UnsafeRawBufferPointer(u)) }
      Self.store(UInt64(bitPattern: nodeID), b, 32)
      Self.store(UInt64(version) | flags, b, 40)
      Self.store(epoch, b, 48)
      Self.store(Self.checksum(UnsafeRawBufferPointer(b)), b, 56)
      try write(UnsafeRawBufferPointer(b), at: end)
    }
    end += UInt64(Self.recordSize)
  }

  /// The flush that makes every record so far durable: nothing when a flush covered them all;
  /// the log's data, when its records lie in room whose allocation and size are on stable
  /// storage (its writeback starts here); else the whole file.
  func pendingFlush() -> PendingFlush {
    guard legacy == nil else { return .none }
    let end = self.end
    let (flushed, durableLength, emptyings) = flushState.withLock {
      ($0.flushed, $0.durableLength, $0.emptyings)
    }
    guard end > max(flushed, Self.headerSize) else { return .none }
    flushPrepared = true
    if openLog == nil { openLog = OpenLog.duplicating(fd) }
    let length = fileLength
    if length <= durableLength, let log = openLog {
      _ = zdc_start_writeback(log.fd)
      return PendingFlush(paths: [], dataOnly: [log]) { [self] in
        didFlush(end, length: nil, emptyings: emptyings)
      }
    }
    return PendingFlush(paths: [path], dataOnly: []) { [self] in
      didFlush(end, length: length, emptyings: emptyings)
    }
  }

  private func didFlush(_ end: UInt64, length: UInt64?, emptyings: Int) {
    flushState.withLock { s in
      if let length { s.durableLength = max(s.durableLength, length) }
      guard s.emptyings == emptyings else { return }
      s.flushed = max(s.flushed, end)
    }
  }

  /// Empties the log (the index holds what it recorded): a new epoch, its records written from
  /// the start. The file keeps its length.
  func clear() throws {
    if legacy != nil {
      try restart()
      return
    }
    guard end > Self.headerSize else {
      flushPrepared = false
      return
    }
    // The new epoch is written before anything changes here: when it cannot be, the records
    // stay (and the next records follow them, in their epoch).
    let next = max(epoch, highestEpoch) &+ 1
    try write(header(epoch: next), at: 0)
    epoch = next
    highestEpoch = next
    end = Self.headerSize
    flushPrepared = false
    flushState.withLock { s in
      s.flushed = 0
      s.emptyings += 1
    }
  }

  /// Replaces a log in the older format (its records adopted) with an empty one in this format.
  private func restart() throws {
    guard ftruncate(fd, 0) == 0 else {
      throw DiskError.io("cannot empty the staging commit log: errno \(errno)")
    }
    legacy = nil
    flushPrepared = false
    fileLength = 0
    end = Self.headerSize
    flushState.withLock { s in
      s.flushed = 0
      s.durableLength = 0
      s.emptyings += 1
    }
  }

  private func header(epoch: UInt64) -> [UInt8] {
    var h = [UInt8](repeating: 0, count: Int(Self.headerSize))
    h.withUnsafeMutableBytes { b in
      Self.magic.withUnsafeBytes { b.copyMemory(from: $0) }
      Self.store(epoch, b, 8)
      Self.store(Self.checksum(UnsafeRawBufferPointer(b)), b, 56)
    }
    return h
  }

  private func write(_ bytes: [UInt8], at offset: UInt64) throws {
    try bytes.withUnsafeBytes { try write($0, at: offset) }
  }

  private func write(_ bytes: UnsafeRawBufferPointer, at offset: UInt64) throws {
    var done = 0
    while done < bytes.count {
      let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done))
      if n < 0 && errno == EINTR { continue }
      guard n > 0 else {
        let code = n < 0 ? errno : EIO
        // A partial record fails its checksum: reading stops there, as at the end.
        if code == ENOSPC || code == EDQUOT { throw DiskError.noSpace }
        throw DiskError.io("cannot write the staging commit log: errno \(code)")
      }
      done += n
    }
    fileLength = max(fileLength, offset + UInt64(bytes.count))
  }

  // MARK: Reading

  private static func readAll(_ fd: Int32) -> [UInt8] {
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    var offset: off_t = 0
    while true {
      let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, offset) }
      if n < 0 && errno == EINTR { continue }
      guard n > 0 else { break }
      bytes += buffer[0..<n]
      offset += off_t(n)
    }
    return bytes
  }

  /// What a log in this format holds: the epoch of its records (`nil` when none is known), how
  /// many valid records of it follow the header, and, with `highest`, the highest epoch of the
  /// header and of any record in the file (else 0). A damaged header (torn by a power loss, or
  /// its magic lost) gives way to the first record's epoch.
  private static func scan(_ bytes: [UInt8], highest wanted: Bool = false) -> (
    epoch: UInt64?, count: Int, highest: UInt64
  ) {
    bytes.withUnsafeBytes { b in
      guard b.count >= Int(headerSize) else { return (nil, 0, 0) }
      let header = UnsafeRawBufferPointer(rebasing: b[0..<Int(headerSize)])
      let headerEpoch =
        header.prefix(magic.count).elementsEqual(magic) && load(header, 56) == checksum(header)
        ? load(header, 8) : nil
      let slots = (b.count - Int(headerSize)) / recordSize
      func slotEpoch(_ i: Int) -> UInt64? {
        let at = Int(headerSize) + i * recordSize
        return recordEpoch(UnsafeRawBufferPointer(rebasing: b[at..<(at + recordSize)]))
      }
      let epoch = headerEpoch ?? (slots > 0 ? slotEpoch(0) : nil)
      var count = 0
      if let epoch {
        while count < slots, slotEpoch(count) == epoch { count += 1 }
      }
      var highest = headerEpoch ?? 0
      if wanted {
        for i in 0..<slots { highest = max(highest, slotEpoch(i) ?? 0) }
      }
      return (epoch, count, highest)
    }
  }

  /// The epoch of a record, or `nil` when it is not a valid one.
  private static func recordEpoch(_ r: UnsafeRawBufferPointer) -> UInt64? {
    guard load(r, 56) == checksum(r), r[0..<nameLength].allSatisfy(isHexDigit) else { return nil }
    return load(r, 48)
  }

  /// Whether `bytes` are a log in the older text format: a first line of 32 hexadecimal digits
  /// and a space.
  private static func isLegacy(_ bytes: [UInt8]) -> Bool {
    bytes.count > nameLength && bytes[nameLength] == UInt8(ascii: " ")
      && bytes[0..<nameLength].allSatisfy(isHexDigit)
  }

  private static func isHexDigit(_ c: UInt8) -> Bool {
    (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66) || (c >= 0x41 && c <= 0x46)
  }

  /// Records of the older text format: `{name} {nodeID} {version}\n` lines; a last line without
  /// its newline was cut short by a crash (never acknowledged).
  private static func legacyRecords(_ bytes: [UInt8]) -> [Record] {
    let end = bytes.lastIndex(of: UInt8(ascii: "\n")).map { $0 + 1 } ?? 0
    var out: [Record] = []
    for line in bytes[0..<end].split(separator: UInt8(ascii: "\n")) {
      let parts = line.split(separator: UInt8(ascii: " "))
      guard parts.count == 3, parts[0].count == nameLength,
        let nodeID = NodeID(String(decoding: parts[1], as: UTF8.self)),
        let version = Int64(String(decoding: parts[2], as: UTF8.self))
      else { continue }
      out.append(
        Record(name: String(decoding: parts[0], as: UTF8.self), nodeID: nodeID, version: version))
    }
    return out
  }

  // MARK: Encoding

  /// The checksum of a header or record (64 bytes): FNV-1a of its first 56, from a basis of
  /// this format's own, so that zeros never pass.
  private static func checksum(_ block: UnsafeRawBufferPointer) -> UInt64 {
    FNV1a.hash(
      UnsafeRawBufferPointer(rebasing: block[0..<56]),
      basis: FNV1a.offsetBasis ^ 0x5a44_4353_4c4f_4732)
  }

  private static func store(_ v: UInt64, _ b: UnsafeMutableRawBufferPointer, _ at: Int) {
    withUnsafeBytes(of: v.littleEndian) {
      b.baseAddress!.advanced(by: at).copyMemory(from: $0.baseAddress!, byteCount: 8)
    }
  }

  private static func load(_ b: UnsafeRawBufferPointer, _ at: Int) -> UInt64 {
    var v: UInt64 = 0
    withUnsafeMutableBytes(of: &v) {
      $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: b[at..<(at + 8)]))
    }
    return UInt64(littleEndian: v)
  }
}
