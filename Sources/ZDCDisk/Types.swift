public import Foundation
import GRDB
public import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// Errors of the local disk cache and staging area.
public enum DiskError: Error, Sendable, Equatable, CustomStringConvertible {
  /// The local cache key is not 32 bytes.
  case invalidKey
  /// A file failed authentication or is malformed; a cache entry was dropped (download again).
  case corrupt(String)
  /// A partial cache entry does not hold all of the range asked for.
  case notPresent(ByteRange)
  /// The staging version was committed or discarded: it takes no more writes.
  case sealed
  /// The handle was closed.
  case closed
  /// The entry left the index while the operation ran (evicted, invalidated or removed).
  case gone
  /// The index database or a file operation failed.
  case io(String)
  /// The disk holding the state directory is full (or over quota).
  case noSpace
  /// A file would be larger than the local file system (or the process's file size limit)
  /// allows.
  case fileTooLarge

  public var description: String {
    switch self {
    case .invalidKey: return "local cache key must be 32 bytes"
    case .corrupt(let m): return "corrupt local file (dropped if cached): \(m)"
    case .notPresent(let r): return "range \(r) not present in the partial cache entry"
    case .sealed: return "staging version already committed or discarded"
    case .closed: return "handle closed"
    case .gone: return "entry no longer in the disk index"
    case .io(let m): return "disk cache I/O: \(m)"
    case .noSpace: return "no space left on the disk holding the cache"
    case .fileTooLarge: return "larger than the largest file the disk holding the cache takes"
    }
  }

  /// `error` (from the index database or a file operation) as a `DiskError`: a full disk stays
  /// recognisable as `.noSpace`, a file too large for it as `.fileTooLarge`; anything else
  /// becomes `.io` with `context`.
  static func from(_ error: any Error, _ context: String) -> DiskError {
    switch error {
    case let e as DiskError: return e
    case StoreError.io(_, let code) where code == ENOSPC || code == EDQUOT: return .noSpace
    case StoreError.io(_, let code) where code == EFBIG: return .fileTooLarge
    case let e as DatabaseError where e.resultCode == .SQLITE_FULL: return .noSpace
    default: return .io(context.isEmpty ? "\(error)" : "\(context): \(error)")
    }
  }
}

/// The two pools of the disk manager.
public enum DiskPool: String, Sendable, Hashable, Codable {
  /// Content written locally and not yet uploaded (or being written).
  case staging
  /// Downloaded (or uploaded) clean content, evictable.
  case cache
}

/// How much the disk manager holds.
public struct DiskUsage: Sendable, Hashable {
  /// Bytes on disk of every entry (both pools).
  public var bytes: UInt64 = 0
  /// Number of entries (both pools).
  public var entries = 0
  /// Bytes on disk of dirty (committed, not yet uploaded) staging entries.
  public var dirtyBytes: UInt64 = 0
  /// Bytes on disk of the cache pool.
  public var cacheBytes: UInt64 = 0
  /// Number of cache entries.
  public var cacheEntries = 0
  /// Number of entries with open handles.
  public var pinnedEntries = 0
  /// The size cap that eviction aims for.
  public var capBytes: UInt64 = 0

  public init() {}
}

/// The newest committed staged version of a node, as a CryptoFile to upload.
public struct StagedData: Sendable, Hashable {
  /// The node.
  public var nodeID: NodeID
  /// The staging version (increasing per node).
  public var version: Int64
  /// The CryptoFile (open with `key`, e.g. as `NodeData.cryptoFile(url, key:)`).
  public var url: URL
  /// The local cache key.
  public var key: Data
  /// Plaintext size.
  public var size: UInt64

  public init(nodeID: NodeID, version: Int64, url: URL, key: Data, size: UInt64) {
    self.nodeID = nodeID
    self.version = version
    self.url = url
    self.key = key
    self.size = size
  }
}

/// Which chunks (``CacheChunks``) of a partial cache entry are present.
struct ChunkBitmap: Sendable, Hashable {
  private(set) var bytes: [UInt8]
  let count: UInt64

  init(count: UInt64) {
    self.count = count
    bytes = [UInt8](repeating: 0, count: Int((count + 7) / 8))
  }

  init?(data: Data, count: UInt64) {
    guard data.count == Int((count + 7) / 8) else { return nil }
    self.count = count
    bytes = [UInt8](data)
  }

  var data: Data { Data(bytes) }

  func contains(_ i: UInt64) -> Bool {
    i < count && bytes[Int(i >> 3)] & (1 << UInt8(i & 7)) != 0
  }

  mutating func insert(_ range: Range<UInt64>) {
    for i in range where i < count { bytes[Int(i >> 3)] |= 1 << UInt8(i & 7) }
  }

  /// The smallest run holding every missing chunk of `range`, or `nil` when all are present.
  func missingSpan(in range: Range<UInt64>) -> Range<UInt64>? {
    let r = range.clamped(to: 0..<count)
    guard let lo = r.first(where: { !contains($0) }) else { return nil }
    let hi = r.reversed().first(where: { !contains($0) })!
    return lo..<(hi + 1)
  }

  var presentCount: UInt64 {
    bytes.reduce(0) { $0 + UInt64($1.nonzeroBitCount) }
  }

  var isFull: Bool { presentCount == count }
}

/// Chunk arithmetic of partial cache files: the unit of ranged downloads and of the presence
/// bitmap, 64 KiB of data-section plaintext (the store's chunk size).
///
/// A whole number of CryptoFile chunks, whatever the file's chunk size: a missing chunk is
/// whole slots, holes in the file.
public enum CacheChunks {
  /// Plaintext bytes per chunk.
  public static let size: UInt64 = 1 << 16

  /// Number of chunks of a file of `fileSize` bytes (0 for an empty file).
  public static func count(fileSize: UInt64) -> UInt64 { (fileSize + size - 1) / size }

  /// The chunks holding `range` of a file of `fileSize` bytes.
  public static func chunks(covering range: ByteRange, fileSize: UInt64) -> Range<UInt64> {
    let hi = min(range.upperBound, fileSize)
    guard hi > range.lowerBound else { return 0..<0 }
    return (range.lowerBound / size)..<((hi - 1) / size + 1)
  }

  /// The bytes of a file of `fileSize` bytes that `chunks` hold.
  public static func byteRange(of chunks: Range<UInt64>, fileSize: UInt64) -> ByteRange {
    let lo = min(chunks.lowerBound * size, fileSize)
    return ByteRange(lo, max(lo, min(chunks.upperBound * size, fileSize)))
  }
}
