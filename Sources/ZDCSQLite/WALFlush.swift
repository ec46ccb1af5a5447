import CLinux
public import GRDB
import Glibc
import Synchronization

/// Which commits of a write-ahead-log database (`synchronous=NORMAL`: a commit survives a crash
/// of the process and reaches stable storage with the log's next flush) are known to be on
/// stable storage, counted in the writer connection's changes (`sqlite3_total_changes`).
///
/// The main database file never needs a flush of its own here: a checkpoint flushes it before
/// the log starts over. The log itself needs only its data written when it has the size it had
/// at its last flush (SQLite reuses the log from its start after a checkpoint and never
/// shortens it unless told to): its blocks are allocated and its size on stable storage.
public final class WALFlush: Sendable {
  /// The database file's path.
  public let path: String
  private let state = Mutex<State>(State())

  private struct State {
    /// Changes made durable.
    var flushed: Int?
    /// The log's inode and size when a flush of it began.
    var shape: Shape?
    /// The log, held open between flushes (no path lookup, `open`, `fstat` or `fstatfs` per
    /// flush).
    var log: OpenLog?
  }

  struct Shape: Equatable {
    var inode: UInt64
    var size: Int64
  }

  public init(path: String) { self.path = path }

  /// The flush that makes every commit of `db` (the writer connection) so far durable: the log,
  /// or nothing when no change was made since a flush that covered them all.
  ///
  /// When only the log's data needs to reach stable storage, its writeback starts here: the
  /// device writes it while the caller goes on to its other files.
  public func pending(_ db: Database) -> PendingFlush {
    let count = db.totalChangesCount
    let log = path + "-wal"
    let (clean, known, held) = state.withLock { s in
      (s.flushed.map { count <= $0 } ?? false, s.shape, s.log)
    }
    if clean { return .none }
    let open = OpenLog.current(log, held: held)
    if open?.log !== held { state.withLock { $0.log = open?.log } }
    var shape = open?.shape
    if let open, open.shape == known {
      _ = zdc_start_writeback(open.log.fd)
      return PendingFlush(paths: [], dataOnly: [open.log], mark: (self, count, open.shape))
    }
    // The log grew (or is new to us): its size goes to stable storage with this flush, and
    // room for the next commits with it, so that they need only their data written.
    if let s = shape, s.size > 0 { shape = Self.extend(log, db, from: s) ?? s }
    return PendingFlush(paths: [log], dataOnly: [], mark: (self, count, shape))
  }

  /// The log lengthened with zeros to ``LogRoom/target(after:)`` its end, under SQLite's write
  /// lock (no connection of any process appends to it meanwhile), and its new shape, or `nil`
  /// when it could not be.
  /// SQLite ignores what follows a log's last valid frame (the zeros fail its checksums), as
  /// it does after a checkpoint, when it starts the log over without shortening it.
  static func extend(_ log: String, _ db: Database, from shape: Shape) -> Shape? {
    try? db.inTransaction(.immediate) {
      guard let now = Self.shape(log), now.inode == shape.inode else { return .commit }
      let fd = Glibc.open(log, O_WRONLY | O_CLOEXEC)
      guard fd >= 0 else { return .commit }
      defer { Glibc.close(fd) }
      // A full disk: the log keeps the size it has; what was written is zeros past its end.
      _ = LogRoom.writeZeros(
        fd, from: UInt64(now.size), to: LogRoom.target(after: UInt64(now.size)))
      return .commit
    }
    return Self.shape(log)
  }

  static func shape(_ path: String) -> Shape? {
    var st = stat()
    guard stat(path, &st) == 0 else { return nil }
    return Shape(inode: UInt64(st.st_ino), size: Int64(st.st_size))
  }

  fileprivate func didFlush(_ count: Int, _ shape: Shape?) {
    state.withLock { s in
      s.flushed = max(s.flushed ?? count, count)
      if let shape { s.shape = shape }
    }
  }
}

/// Room made ahead at the end of an append-only log (a write-ahead log, the catalog's redo
/// journal): zeros written past its end, so that once its new length is flushed, the next
/// appends need only their data written.
public enum LogRoom {
  /// Logs are lengthened in steps of this many bytes (1 MiB: SQLite's default checkpoint starts
  /// a log over at about 4 MB).
  public static let step: UInt64 = 1 << 20
  /// At least this much room follows a log's end after it was lengthened.
  public static let reserve: UInt64 = 256 << 10

  /// The length a log ending at `end` is lengthened to: the next multiple of ``step`` at least
  /// ``reserve`` past it.
  public static func target(after end: UInt64) -> UInt64 {
    (end + reserve) / step * step + step
  }

  /// Writes zeros over `from..<to` of `fd`; returns how far it got (short of `to` on a full
  /// disk).
  public static func writeZeros(_ fd: Int32, from: UInt64, to: UInt64) -> UInt64 {
    guard to > from else { return from }
    let zeros = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 16, alignment: 4096)
    defer { zeros.deallocate() }
    zeros.initializeMemory(as: UInt8.self, repeating: 0)
    var offset = from
    while offset < to {
      let n = Glibc.pwrite(
        fd, zeros.baseAddress, Int(min(UInt64(zeros.count), to - offset)), off_t(offset))
      if n < 0, errno == EINTR { continue }
      guard n > 0 else { break }
      offset += UInt64(n)
    }
    return offset
  }
}

/// A write-ahead log held open by its ``WALFlush``; the descriptor stays valid while this object
/// lives.
public final class OpenLog: Sendable {
  /// The open descriptor (read-only).
  public let fd: Int32
  /// The device of its file system (`st_dev`).
  public let device: UInt64
  /// Its file system's type (`statfs`'s `f_type`), or -1 when unknown.
  public let fileSystemType: Int
  /// The log's inode.
  let inode: UInt64

  private init(fd: Int32, device: UInt64, fileSystemType: Int, inode: UInt64) {
    self.fd = fd
    self.device = device
    self.fileSystemType = fileSystemType
    self.inode = inode
  }

  deinit { Glibc.close(fd) }

  /// The descriptor, device and file system type, as `LocalDurability.sync` takes them.
  public var descriptor: (fd: Int32, device: UInt64, fileSystemType: Int) {
    (fd, device, fileSystemType)
  }

  /// Another descriptor of the open file `fd` (its own, closed with this object), with the
  /// file's device and file system type; `nil` when it cannot be had.
  public static func duplicating(_ fd: Int32) -> OpenLog? {
    let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
    guard copy >= 0 else { return nil }
    var st = stat()
    guard fstat(copy, &st) == 0 else {
      Glibc.close(copy)
      return nil
    }
    return OpenLog(
      fd: copy, device: UInt64(st.st_dev), fileSystemType: Int(zdc_file_system_type(copy)),
      inode: UInt64(st.st_ino))
  }

  /// The log at `path` and its shape: `held` while it is still linked (SQLite deletes a log
  /// only with the last connection, or on a change of journal mode; it never renames one),
  /// else the file opened anew, or `nil` when there is none.
  static func current(_ path: String, held: OpenLog?) -> (log: OpenLog, shape: WALFlush.Shape)? {
    // `statx` for size, inode and links alone: a query of the log's times (`fstat`) would make
    // each commit's write give it a new one, dirtying its inode (see `zdc_file_identity`).
    var size: UInt64 = 0
    var inode: UInt64 = 0
    var links: UInt32 = 0
    if let held, zdc_file_identity(held.fd, &size, &inode, &links) == 0, links > 0 {
      return (held, WALFlush.Shape(inode: inode, size: Int64(size)))
    }
    let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    var st = stat()
    guard fstat(fd, &st) == 0, zdc_file_identity(fd, &size, &inode, &links) == 0 else {
      Glibc.close(fd)
      return nil
    }
    let log = OpenLog(
      fd: fd, device: UInt64(st.st_dev), fileSystemType: Int(zdc_file_system_type(fd)),
      inode: inode)
    return (log, WALFlush.Shape(inode: inode, size: Int64(size)))
  }
}

/// Files to flush to make some commits durable; ``done()`` after they were flushed.
public struct PendingFlush: Sendable {
  /// The files, for
  /// `LocalDurability.sync(paths:dataOnly:dataOnlyDescriptors:before:beforeDevice:)`.
  public let paths: [String]
  /// Logs whose metadata is on stable storage: only their data needs to be (`dataOnly`). Their
  /// writeback has started. Their descriptors stay open while this value lives.
  public let dataOnly: [OpenLog]
  private let onDone: [@Sendable () -> Void]

  /// Nothing to flush.
  public static let none = PendingFlush(paths: [], dataOnly: [], onDone: [])

  /// Files to flush, and what to record once they were (`done`).
  public init(paths: [String], dataOnly: [OpenLog], done: @escaping @Sendable () -> Void) {
    self.init(paths: paths, dataOnly: dataOnly, onDone: [done])
  }

  private init(paths: [String], dataOnly: [OpenLog], onDone: [@Sendable () -> Void]) {
    self.paths = paths
    self.dataOnly = dataOnly
    self.onDone = onDone
  }

  fileprivate init(
    paths: [String], dataOnly: [OpenLog], mark: (WALFlush, Int, WALFlush.Shape?)
  ) {
    self.init(paths: paths, dataOnly: dataOnly, onDone: [{ mark.0.didFlush(mark.1, mark.2) }])
  }

  /// This flush and `other` as one.
  public func merged(with other: PendingFlush) -> PendingFlush {
    PendingFlush(
      paths: paths + other.paths, dataOnly: dataOnly + other.dataOnly,
      onDone: onDone + other.onDone)
  }

  /// Whether there is nothing to flush.
  public var isEmpty: Bool { paths.isEmpty && dataOnly.isEmpty }

  /// Records that ``paths`` and ``dataOnly`` were flushed.
  public func done() { for f in onDone { f() } }
}
