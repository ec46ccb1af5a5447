import CLinux
import Foundation
import Logging
import Synchronization
import ZDCCore
import ZDCSQLite

#if canImport(Glibc)
  import Glibc
#endif

/// The catalog's redo journal: the changes of ``Catalog/Commit/soon`` writes that are not
/// committed yet, appended (one `write(2)` per unit of work) before the write returns.
///
/// A batch of `.soon` writes lives in an open SQLite transaction until it commits; a crash of
/// the process loses that transaction, not the journal (its bytes are in the kernel's page
/// cache). The next open of the catalog replays the entries the database does not hold yet —
/// the ones after the sequence number the last committed batch recorded (`journalState`) —
/// and commits them. So a `.soon` write survives a crash of the process as soon as it returns,
/// while the SQLite commit, whose write-ahead-log frames cost more than the change itself, is
/// paid once per batch.
///
/// An `fsync` through the mount makes the journal durable instead of committing the batch
/// (``Catalog/prepareDurable()``): the journal is lengthened ahead with zeros, like the
/// write-ahead logs, so that its entries then need only their data written. The zeros end the
/// entries when it is read (a length of 0 is no entry), and are not taken for damage.
///
/// Format (native-endian, this machine only): entries back to back, each
/// `u32 length | u64 seq | u16 userID length | userID | u32 record count | (u32 length | record)*
/// | u64 FNV-1a of everything from seq on`. Reading stops at the first incomplete or damaged
/// entry (a power loss may tear the tail; what follows it was never acknowledged after it).
final class RedoJournal: @unchecked Sendable {
  // @unchecked: `fd`, `size` and `lastSeq` change only on the catalog's writer connection
  // (serialized), or in `init`.
  let path: String
  private let fd: Int32
  /// Where the next entry goes: the end of the entries (zeros may follow, see ``flush()``).
  private(set) var size: UInt64
  /// The file's length: the entries and the zeros after them (never less than `size`).
  private var fileLength: UInt64
  /// What a flush must do: how far the entries were flushed, the length whose allocation
  /// and size are on stable storage, and the journal's emptyings so far (a flush prepared
  /// before one marks nothing). Also read by ``didFlush(_:)``, on whatever thread flushed.
  private let flushState = Mutex<(flushed: UInt64, durableLength: UInt64, emptyings: Int)>(
    (0, 0, 0))
  /// The journal's file as a log to flush (another descriptor, made at the first flush).
  private var openLog: OpenLog?
  /// The highest sequence number written (or found).
  private(set) var lastSeq: UInt64
  /// A flush of entries was prepared (``flush()``) since the journal was last emptied: an
  /// `fsync` may rely on them.
  private(set) var flushPrepared = false

  /// An entry read back.
  struct Entry {
    var seq: UInt64
    var userID: String
    var records: [Data]
  }

  /// Past this size the journal is emptied at the next commit that covers all of it.
  static let truncateThreshold: UInt64 = 1 << 20

  enum Failure: Error {
    /// Another process holds the journal (and so writes this catalog).
    case busy
    case io(String, Int32)
  }

  /// Opens (creating) the journal and takes its lock; reads its valid entries.
  init(path: String) throws {
    self.path = path
    let fd = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw Failure.io("open \(path)", errno) }
    guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
      let e = errno
      Glibc.close(fd)
      if e == EWOULDBLOCK { throw Failure.busy }
      throw Failure.io("lock \(path)", e)
    }
    self.fd = fd
    var st = stat()
    guard fstat(fd, &st) == 0 else {
      let e = errno
      Glibc.close(fd)
      throw Failure.io("stat \(path)", e)
    }
    size = UInt64(st.st_size)
    fileLength = size
    lastSeq = 0
  }

  deinit { Glibc.close(fd) }

  /// Every complete, undamaged entry, in order; `valid` is where they end.
  func readAll() throws -> (entries: [Entry], valid: UInt64) {
    var bytes = [UInt8](repeating: 0, count: Int(size))
    var done = 0
    while done < bytes.count {
      let n = bytes.withUnsafeMutableBytes {
        pread(fd, $0.baseAddress! + done, $0.count - done, off_t(done))
      }
      if n < 0 {
        if errno == EINTR { continue }
        throw Failure.io("read \(path)", errno)
      }
      if n == 0 { break }
      done += n
    }
    var entries: [Entry] = []
    var r = JournalReader(bytes[0..<done])
    var valid = 0
    while let entry = r.entry() {
      entries.append(entry)
      valid = r.offset
      lastSeq = max(lastSeq, entry.seq)
    }
    // Zeros after the entries are the room made ahead for the next ones, not damage.
    if valid < done, bytes[valid..<done].allSatisfy({ $0 == 0 }) { size = UInt64(valid) }
    return (entries, UInt64(valid))
  }

  /// Appends one entry with the next sequence number and returns it. The entry is in the
  /// kernel when this returns (it survives a crash of the process).
  func append(userID: String, records: [Data]) throws -> UInt64 {
    let seq = lastSeq + 1
    var w = JournalWriter()
    w.u32(0)  // length, patched below
    w.u64(seq)
    let user = Array(userID.utf8)
    w.u16(UInt16(user.count))
    w.bytes(user)
    w.u32(UInt32(records.count))
    for r in records {
      w.data(r)
    }
    w.u64(JournalReader.fnv1a(w.buffer[4...]))
    let length = UInt32(w.buffer.count - 4)
    withUnsafeBytes(of: length) { w.buffer.replaceSubrange(0..<4, with: $0) }
    try writeFully(w.buffer, at: size)
    size += UInt64(w.buffer.count)
    fileLength = max(fileLength, size)
    lastSeq = seq
    return seq
  }

  /// The flush that makes every entry so far durable: nothing when a flush covered them all;
  /// the journal's data, when its entries lie in room whose allocation and size are on stable
  /// storage (its writeback starts here); else the file, lengthened first with zeros so that
  /// the next entries need only their data written. Call on the writer connection (entries
  /// are appended there).
  func flush() -> PendingFlush {
    let end = size
    let (flushed, durableLength, emptyings) = flushState.withLock {
      ($0.flushed, $0.durableLength, $0.emptyings)
    }
    guard end > flushed else { return .none }
    flushPrepared = true
    if openLog == nil { openLog = OpenLog.duplicating(fd) }
    if end <= durableLength, let log = openLog {
      _ = zdc_start_writeback(log.fd)
      return PendingFlush(paths: [], dataOnly: [log]) { [self] in
        didFlush(end, length: nil, emptyings: emptyings)
      }
    }
    let target = LogRoom.target(after: end)
    let length = lengthen(to: target) ? target : fileLength
    // The whole file: its new length and blocks with its data.
    return PendingFlush(paths: [path], dataOnly: []) { [self] in
      didFlush(end, length: length, emptyings: emptyings)
    }
  }

  /// Where the entries end now, for ``didCover(_:)``. Call on the writer connection.
  func coverMark() -> (end: UInt64, emptyings: Int) {
    (size, flushState.withLock { $0.emptyings })
  }

  /// Records that the entries up to `mark` are durable without a flush of the journal (the log
  /// holding their commit was flushed).
  func didCover(_ mark: (end: UInt64, emptyings: Int)) {
    didFlush(mark.end, length: nil, emptyings: mark.emptyings)
  }

  /// Records a flush of the entries up to `end` (and of the file's length, with `length`),
  /// unless the journal was emptied since it was prepared.
  private func didFlush(_ end: UInt64, length: UInt64?, emptyings: Int) {
    flushState.withLock { s in
      guard s.emptyings == emptyings else { return }
      s.flushed = max(s.flushed, end)
      if let length { s.durableLength = max(s.durableLength, length) }
    }
  }

  /// Writes zeros from the end of the file (never over entries) to `target`; false when it
  /// could not (a full disk: the entries then get flushed with the file as it is).
  private func lengthen(to target: UInt64) -> Bool {
    let reached = LogRoom.writeZeros(fd, from: fileLength, to: target)
    fileLength = max(fileLength, reached)
    return reached >= target
  }

  /// The journal changed length without a flush (emptied or cut): its next flush is a whole
  /// one, and flushes prepared before record nothing.
  private func lengthChanged(to length: UInt64) {
    fileLength = length
    flushState.withLock { s in
      s.emptyings += 1
      s.flushed = min(s.flushed, length)
      s.durableLength = 0
    }
  }

  /// Numbers the next entries after `seq` (the last one the database holds): an emptied
  /// journal found at open says nothing of the numbers used before it was emptied.
  func continueAfter(_ seq: UInt64) { lastSeq = max(lastSeq, seq) }

  /// Empties the journal (every entry is in the database, or given up).
  func truncate() throws {
    guard fileLength > 0 else { return }
    guard ftruncate(fd, 0) == 0 else { throw Failure.io("truncate \(path)", errno) }
    size = 0
    flushPrepared = false
    lengthChanged(to: 0)
  }

  /// Cuts a damaged tail off (from `offset` on).
  func truncate(to offset: UInt64) throws {
    guard offset < size else { return }
    guard ftruncate(fd, off_t(offset)) == 0 else { throw Failure.io("truncate \(path)", errno) }
    size = offset
    lengthChanged(to: offset)
  }

  private func writeFully(_ bytes: [UInt8], at offset: UInt64) throws {
    var done = 0
    while done < bytes.count {
      let n = bytes.withUnsafeBytes {
        pwrite(fd, $0.baseAddress! + done, $0.count - done, off_t(offset) + off_t(done))
      }
      if n < 0 {
        if errno == EINTR { continue }
        let e = errno
        // A partial entry must not stay: the next entry would follow garbage. (Zeros over it
        // when the journal has room past it; cut off otherwise.)
        if fileLength > offset {
          let zeros = [UInt8](repeating: 0, count: done)
          _ = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
        } else {
          _ = ftruncate(fd, off_t(offset))
          lengthChanged(to: offset)
        }
        throw Failure.io("write \(path)", e)
      }
      done += n
    }
  }
}

/// Appends fixed-width and length-prefixed values (journal entries and records).
struct JournalWriter {
  var buffer: [UInt8] = []

  init() { buffer.reserveCapacity(512) }

  mutating func u8(_ v: UInt8) { buffer.append(v) }
  mutating func u16(_ v: UInt16) { withUnsafeBytes(of: v) { buffer.append(contentsOf: $0) } }
  mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v) { buffer.append(contentsOf: $0) } }
  mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v) { buffer.append(contentsOf: $0) } }
  mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
  mutating func f64(_ v: Double) { u64(v.bitPattern) }
  mutating func bytes(_ b: [UInt8]) { buffer.append(contentsOf: b) }

  mutating func data(_ d: Data) {
    u32(UInt32(d.count))
    // Through its bytes: appending a `Data` as a sequence cost about 1,500 instructions.
    d.withUnsafeBytes { buffer.append(contentsOf: $0) }
  }

  mutating func string(_ s: String) {
    var s = s
    s.withUTF8 { u in
      u32(UInt32(u.count))
      buffer.append(contentsOf: u)
    }
  }

  mutating func optional<T>(_ v: T?, _ write: (inout JournalWriter, T) -> Void) {
    if let v {
      u8(1)
      write(&self, v)
    } else {
      u8(0)
    }
  }
}

/// Reads what ``JournalWriter`` wrote; every read returns `nil` past the end.
struct JournalReader {
  let bytes: ArraySlice<UInt8>
  private(set) var offset: Int

  init(_ bytes: ArraySlice<UInt8>) {
    self.bytes = bytes
    offset = bytes.startIndex
  }

  init(_ data: Data) { self.init(ArraySlice(data)) }

  static func fnv1a(_ bytes: ArraySlice<UInt8>) -> UInt64 { FNV1a.hash(bytes) }

  var atEnd: Bool { offset >= bytes.endIndex }

  private mutating func fixed<T: FixedWidthInteger>(_: T.Type) -> T? {
    let n = MemoryLayout<T>.size
    guard offset + n <= bytes.endIndex else { return nil }
    var v: T = 0
    withUnsafeMutableBytes(of: &v) { dst in
      bytes[offset..<(offset + n)].withUnsafeBytes { dst.copyMemory(from: $0) }
    }
    offset += n
    return v
  }

  mutating func u8() -> UInt8? { fixed(UInt8.self) }
  mutating func u16() -> UInt16? { fixed(UInt16.self) }
  mutating func u32() -> UInt32? { fixed(UInt32.self) }
  mutating func u64() -> UInt64? { fixed(UInt64.self) }
  mutating func i64() -> Int64? { u64().map { Int64(bitPattern: $0) } }
  mutating func f64() -> Double? { u64().map { Double(bitPattern: $0) } }

  mutating func raw(_ count: Int) -> ArraySlice<UInt8>? {
    guard count >= 0, offset + count <= bytes.endIndex else { return nil }
    defer { offset += count }
    return bytes[offset..<(offset + count)]
  }

  mutating func data() -> Data? {
    guard let n = u32(), let b = raw(Int(n)) else { return nil }
    return Data(b)
  }

  mutating func string() -> String? {
    guard let n = u32(), let b = raw(Int(n)) else { return nil }
    return String(decoding: b, as: UTF8.self)
  }

  /// `.some(nil)` for an absent value, `nil` when the bytes end or are malformed.
  mutating func optional<T>(_ read: (inout JournalReader) -> T?) -> T?? {
    guard let flag = u8() else { return nil }
    if flag == 0 { return .some(nil) }
    guard flag == 1, let v = read(&self) else { return nil }
    return .some(v)
  }

  /// The next journal entry, or `nil` at the end or at a damaged entry.
  mutating func entry() -> RedoJournal.Entry? {
    let start = offset
    guard let length = u32(), length >= 8 + 2 + 4 + 8, let body = raw(Int(length)) else {
      offset = start
      return nil
    }
    let payload = body.dropLast(8)
    var check = JournalReader(body.suffix(8))
    guard let sum = check.u64(), sum == Self.fnv1a(payload) else {
      offset = start
      return nil
    }
    var r = JournalReader(payload)
    guard let seq = r.u64(), let userLength = r.u16(), let user = r.raw(Int(userLength)),
      let count = r.u32()
    else {
      offset = start
      return nil
    }
    var records: [Data] = []
    for _ in 0..<count {
      guard let d = r.data() else {
        offset = start
        return nil
      }
      records.append(d)
    }
    return RedoJournal.Entry(
      seq: seq, userID: String(decoding: user, as: UTF8.self), records: records)
  }
}
