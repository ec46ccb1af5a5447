public import Foundation
public import ZDCCore
import ZDCCrypto

/// One entry of the disk index in memory. Mutable fields are guarded by the manager's state
/// lock; `file` by `openLock`.
final class Entry: @unchecked Sendable {
  var row: IndexRow
  /// Plaintext chunks present, for a partial cache entry; `nil` when complete.
  var bitmap: ChunkBitmap?
  /// Open handles.
  var pins = 0
  /// Out of the index: its file is deleted when the last handle closes.
  var removed = false
  /// Its file is deleted on the maintenance queue rather than by the last handle's close.
  var unlinkLater = false
  /// A committed staging version flushed to stable storage (it never changes afterwards).
  var flushed = false
  /// Its file was handed out by path (an upload reads it): never written in place.
  var exported = false
  /// The shared open CryptoFile while pinned.
  var file: CryptoFile?
  /// A committed version whose file (a copy) is being made while a newer version writes the
  /// file it had in place: complete it before its file is read (see `writeInPlace`).
  var copying: CopyBeforeWrite?
  /// An uncommitted version written in place of a committed one that is being copied: its
  /// writes copy blocks first (its files are guarded with it), and it completes the copy
  /// before its file goes.
  var guarding: CopyBeforeWrite?
  /// When the file was made in its directory (see `DirectoryFlush`); 1 for files found at
  /// start-up.
  var madeAt: UInt64 = 1
  let openLock = NSLock()

  init(row: IndexRow) {
    self.row = row
    if !row.complete {
      let count = CacheChunks.count(fileSize: row.size)
      bitmap =
        row.chunks.flatMap { ChunkBitmap(data: $0, count: count) } ?? ChunkBitmap(count: count)
    }
  }

  var id: Int64 { row.id }
  /// True for committed staging content not yet uploaded.
  var isDirty: Bool { row.pool == .staging && row.dirty }
}

/// A pinned, read-only view of cached content (complete or partial) of one DATA version.
///
/// The entry cannot be evicted while a handle is open. Close it when done (it also closes on
/// deinit). Thread-safe.
public final class CachedFileHandle: @unchecked Sendable {
  let manager: DiskManager
  let entry: Entry
  let file: CryptoFile
  private let closedLock = NSLock()
  private var isClosed = false

  /// The content's cloudID.
  public let cloudID: String
  /// The DATA eTag this content was read from.
  public let eTag: String
  /// Plaintext size of the content (of the whole data section, even when partial).
  public let size: UInt64

  init(manager: DiskManager, entry: Entry, file: CryptoFile, cloudID: String, eTag: String) {
    self.manager = manager
    self.entry = entry
    self.file = file
    self.cloudID = cloudID
    self.eTag = eTag
    size = file.size
  }

  deinit { close() }

  /// True when every byte is present locally.
  public var isComplete: Bool { manager.isComplete(entry) }

  /// True when `range` (clamped to the size) is present locally.
  public func contains(_ range: ByteRange) -> Bool { manager.contains(entry, range) }

  /// The encrypted file (valid while some handle is open) and its key, e.g. for
  /// `NodeData.cryptoFile(url, key:)` of a complete entry.
  public var url: URL { manager.url(of: entry) }
  /// The local cache key.
  public var key: Data { manager.key }

  /// Reads up to `buffer.count` bytes at `offset`; returns fewer only at the end of the content.
  /// Throws `DiskError.notPresent` for a missing range of a partial entry and
  /// `DiskError.corrupt` (after dropping the entry) when the file fails authentication.
  public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws -> Int {
    guard !closed else { throw DiskError.closed }
    guard offset < size, buffer.count > 0 else { return 0 }
    let range = ByteRange(offset, min(size, offset + UInt64(buffer.count)))
    try manager.willRead(entry, range)
    do {
      return try file.read(into: buffer, at: offset)
    } catch let error as CryptoError {
      throw manager.corrupted(entry, error)
    }
  }

  /// The decrypted chunk holding `offset`, if the last read left it at hand (see
  /// `CryptoFile.bufferedChunk(containing:into:)`).
  public func bufferedChunk(containing offset: UInt64, into out: UnsafeMutableRawBufferPointer)
    -> (start: UInt64, count: Int)?
  {
    guard !closed else { return nil }
    return file.bufferedChunk(containing: offset, into: out)
  }

  /// Reads up to `count` bytes at `offset`.
  public func read(offset: UInt64, count: Int) throws -> Data {
    let n = offset < size ? min(UInt64(max(0, count)), size - offset) : 0
    var out = Data(count: Int(n))
    let got = try out.withUnsafeMutableBytes { try read(into: $0, at: offset) }
    if got < out.count { out.count = got }
    return out
  }

  /// The whole content (tests and small files).
  public func readAll() throws -> Data { try read(offset: 0, count: Int(size)) }

  /// Stores downloaded plaintext for `chunks` of a partial entry (`bytes` holds exactly the
  /// bytes of those chunks) and marks them present.
  public func fill(chunks: Range<UInt64>, with bytes: UnsafeRawBufferPointer) throws {
    guard !closed else { throw DiskError.closed }
    try manager.fill(entry, file: file, chunks: chunks, bytes: bytes)
  }

  /// The first-to-last missing chunk run within `chunks`, or `nil` when all are present.
  public func missingChunks(in chunks: Range<UInt64>) -> Range<UInt64>? {
    manager.missingChunks(entry, chunks)
  }

  /// Another handle on the same entry (pinned separately).
  public func duplicate() throws -> CachedFileHandle {
    guard !closed else { throw DiskError.closed }
    return manager.duplicate(self)
  }

  /// Unpins the entry. Idempotent.
  public func close() {
    let first = closedLock.withLock { () -> Bool in
      defer { isClosed = true }
      return !isClosed
    }
    if first { manager.unpin(entry) }
  }

  var closed: Bool { closedLock.withLock { isClosed } }
}

/// A writable staging version of a node's content: random-access reads and writes into an
/// encrypted file, pinned until uploaded.
///
/// Several handles may share one uncommitted version. After `DiskManager.commitStaging` or
/// `discardStaging` the version is sealed and writes throw `DiskError.sealed`. Thread-safe.
public final class StagingFile: @unchecked Sendable {
  let manager: DiskManager
  let entry: Entry
  let file: CryptoFile
  private let closedLock = NSLock()
  private var isClosed = false

  /// The node whose content this is.
  public let nodeID: NodeID
  /// The version (increasing per node).
  public let version: Int64

  init(manager: DiskManager, entry: Entry, file: CryptoFile) {
    self.manager = manager
    self.entry = entry
    self.file = file
    nodeID = entry.row.nodeID ?? 0
    version = entry.row.version
  }

  deinit { close() }

  /// The current plaintext size.
  public var size: UInt64 { file.size }

  /// The encrypted file's location.
  public var url: URL { manager.url(of: entry) }

  /// True once committed or discarded.
  public var isSealed: Bool { manager.isSealed(entry) }

  /// Reads up to `buffer.count` bytes at `offset`.
  public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws -> Int {
    guard !closed else { throw DiskError.closed }
    do {
      return try file.read(into: buffer, at: offset)
    } catch let error as CryptoError {
      throw manager.corrupted(entry, error)
    }
  }

  /// The decrypted chunk holding `offset`, if the last read left it at hand (see
  /// `CryptoFile.bufferedChunk(containing:into:)`).
  public func bufferedChunk(containing offset: UInt64, into out: UnsafeMutableRawBufferPointer)
    -> (start: UInt64, count: Int)?
  {
    guard !closed else { return nil }
    return file.bufferedChunk(containing: offset, into: out)
  }

  /// Reads up to `count` bytes at `offset`.
  public func read(offset: UInt64, count: Int) throws -> Data {
    guard !closed else { throw DiskError.closed }
    do {
      return try file.read(offset: offset, count: count)
    } catch let error as CryptoError {
      throw manager.corrupted(entry, error)
    }
  }

  /// Writes bytes at any offset (a gap reads as zeros).
  public func write(_ bytes: UnsafeRawBufferPointer, at offset: UInt64) throws {
    try checkWritable()
    try file.write(bytes, at: offset)
  }

  /// Writes bytes at any offset (a gap reads as zeros).
  public func write(_ data: Data, at offset: UInt64) throws {
    try data.withUnsafeBytes { try write($0, at: offset) }
  }

  /// Shrinks or grows (with zeros) the content.
  public func truncate(to size: UInt64) throws {
    try checkWritable()
    try file.truncate(to: size)
  }

  /// Unpins the version; closing the last handle of an uncommitted version discards it.
  public func close() {
    let first = closedLock.withLock { () -> Bool in
      defer { isClosed = true }
      return !isClosed
    }
    if first { manager.unpin(entry) }
  }

  var closed: Bool { closedLock.withLock { isClosed } }

  private func checkWritable() throws {
    guard !closed else { throw DiskError.closed }
    if manager.isSealed(entry) { throw DiskError.sealed }
  }
}

/// The content a new staging version starts from: a pinned staged version or cached content.
public enum StagingBase: Sendable {
  case staged(StagingFile)
  case cached(CachedFileHandle)

  /// Plaintext size of the content.
  public var size: UInt64 {
    switch self {
    case .staged(let f): return f.size
    case .cached(let h): return h.size
    }
  }

  /// Reads up to `buffer.count` bytes at `offset`.
  public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws -> Int {
    switch self {
    case .staged(let f): return try f.read(into: buffer, at: offset)
    case .cached(let h): return try h.read(into: buffer, at: offset)
    }
  }

  /// Closes (unpins) the handle.
  public func close() {
    switch self {
    case .staged(let f): f.close()
    case .cached(let h): h.close()
    }
  }
}
