public import Foundation
import Glibc
import Logging
public import ZDCCatalog
public import ZDCCore
import ZDCCrypto
public import ZDCDisk

/// Why a download could not give a node's content.
public enum DownloadError: Error, Sendable, Equatable, CustomStringConvertible {
  /// The node's DATA object changed or vanished in the store since the catalog recorded
  /// `expected`: pull, then ask again.
  case remoteChanged(nodeID: NodeID, expected: String?, found: String?)
  /// The node has no DATA object (a trunk, or never uploaded).
  case noData(NodeID)

  public var description: String {
    switch self {
    case .remoteChanged(let id, let e, let f):
      return
        "DATA of node \(id) changed in the store (expected \(e ?? "none"), found \(f ?? "none"))"
    case .noData(let id): return "node \(id) has no DATA object"
    }
  }
}

/// Tuning of the download manager.
public struct DownloadOptions: Sendable {
  /// Attempts per store request when it fails with `StoreError.transient`.
  public var maxAttempts = 5
  /// Delay before the first retry; doubles each time.
  public var initialBackoff: TimeInterval = 0.2
  /// The longest delay between retries.
  public var maxBackoff: TimeInterval = 10
  /// Bytes fetched beyond the end of a ranged read, so sequential reads stay local.
  public var readAheadBytes: UInt64 = 1 << 20
  /// The most read-ahead grows to for a sequential read: twice what is cached just before
  /// the read, so a cold sequential read takes few, growing requests (a 1 GiB file: about 40
  /// instead of 1,000 at 1 MiB each, which matters on a store with 20 ms per request).
  public var maxReadAheadBytes: UInt64 = 32 << 20
  /// Decoded object headers kept in memory, so ranged reads of an object fetch only data.
  public var headerCacheSize = 128

  public init() {}
}

/// Downloads nodes' DATA objects into the disk cache on demand: whole, or by plaintext range
/// (partial cache entries), and the metadata or thumbnail section alone.
///
/// Calls block the calling thread (run them off latency-critical threads). Concurrent requests
/// for the same content share one download. Objects are authenticated with the node key;
/// tampered or corrupt objects throw `SyncError.badRemoteObject` and are never cached.
public final class DownloadManager: @unchecked Sendable {
  // @unchecked: mutable state (the header cache) is guarded by `lock`; coalescers are
  // thread-safe.

  /// The store objects come from.
  public let store: any CloudStore
  /// Where content goes.
  public let disk: DiskManager
  /// Where nodes and their cloud state live.
  public let catalog: Catalog
  /// The local user whose nodes these are.
  public let userID: String
  /// Where downloads report progress.
  public let progress: ProgressTracker
  /// Tuning.
  public let options: DownloadOptions

  private let logger = Logger(label: "zdc.download")
  private let lock = NSLock()
  private var readers: [ReaderKey: CloudFileReader] = [:]
  private var readerOrder: [ReaderKey] = []
  private let fileFlights = Coalescer<FlightKey, CachedFileHandle>()
  private let readerFlights = Coalescer<ReaderKey, CloudFileReader>()

  struct ReaderKey: Hashable, Sendable {
    var dataKey: String
    var eTag: String
  }

  struct FlightKey: Hashable, Sendable {
    var cloudID: String
    var eTag: String
    /// Cache chunks, or `nil` for the whole content.
    var chunks: Range<UInt64>?

    func covers(_ other: FlightKey) -> Bool {
      guard cloudID == other.cloudID, eTag == other.eTag else { return false }
      guard let mine = chunks else { return true }
      guard let theirs = other.chunks else { return false }
      return mine.lowerBound <= theirs.lowerBound && theirs.upperBound <= mine.upperBound
    }
  }

  /// What a download needs to know of a node.
  struct Target {
    var node: Node
    var location: CloudObjectRef
    var expectedETag: String? { location.eTagData }
    /// Section sizes known for the expected version.
    var knownInfo: CloudDataInfo? {
      guard let info = node.cloudDataInfo, let e = expectedETag, info.eTag == e else { return nil }
      return info
    }
  }

  public init(
    store: any CloudStore, disk: DiskManager, catalog: Catalog, userID: String,
    progress: ProgressTracker = ProgressTracker(), options: DownloadOptions = DownloadOptions()
  ) {
    self.store = store
    self.disk = disk
    self.catalog = catalog
    self.userID = userID
    self.progress = progress
    self.options = options
  }

  // MARK: Public operations

  /// The node's whole data section in the disk cache (downloaded if needed), pinned.
  public func downloadData(nodeID: NodeID) throws -> CachedFileHandle {
    let t = try target(nodeID)
    if let eTag = t.expectedETag, let h = disk.cachedFile(cloudID: t.node.cloudID, eTag: eTag) {
      if h.isComplete { return h }
      h.close()
    }
    let key = FlightKey(cloudID: t.node.cloudID, eTag: t.expectedETag ?? "", chunks: nil)
    return try fileFlights.run(
      key, share: { try $0.duplicate() }, release: { $0.close() },
      work: {
        // A download that finished just before this one started leaves nothing to do.
        if let eTag = t.expectedETag, let h = disk.cachedFile(cloudID: t.node.cloudID, eTag: eTag) {
          if h.isComplete { return h }
          h.close()
        }
        return try fetchWhole(t)
      })
  }

  /// A pinned cache entry of the node's data section holding at least `range` (clamped to
  /// the data size): only the chunks covering `range` plus `readAhead` bytes that are not
  /// cached yet are fetched. By default the read-ahead is ``DownloadOptions/readAheadBytes``,
  /// growing for sequential reads up to ``DownloadOptions/maxReadAheadBytes``.
  public func downloadRange(nodeID: NodeID, range: ByteRange, readAhead: UInt64? = nil) throws
    -> CachedFileHandle
  {
    let t = try target(nodeID)
    if let eTag = t.expectedETag, let h = disk.cachedFile(cloudID: t.node.cloudID, eTag: eTag) {
      if h.contains(range) { return h }
      h.close()
    }
    let (reader, eTag) = try reader(for: t)
    let dataSize = reader.sizes.dataSize
    let needed = CacheChunks.chunks(covering: range, fileSize: dataSize)
    for _ in 0..<8 {
      // The entry may be replaced meanwhile (a whole download): take it afresh each round.
      let handle = try disk.partialCachedFile(
        cloudID: t.node.cloudID, eTag: eTag, nodeID: nodeID, size: dataSize)
      let ahead = readAhead ?? sequentialReadAhead(handle, before: range, dataSize: dataSize)
      let (sum, overflow) = range.upperBound.addingReportingOverflow(ahead)
      let end = min(dataSize, overflow ? .max : sum)
      let window = CacheChunks.chunks(
        covering: ByteRange(min(range.lowerBound, end), end), fileSize: dataSize)
      guard handle.missingChunks(in: needed) != nil,
        let missing = handle.missingChunks(in: window)
      else { return handle }
      defer { handle.close() }
      let key = FlightKey(cloudID: t.node.cloudID, eTag: eTag, chunks: missing)
      let done: CachedFileHandle
      do {
        done = try fileFlights.run(
          key, covers: { $0.covers(key) }, share: { try $0.duplicate() }, release: { $0.close() },
          work: { try fetchChunks(t, reader: reader, eTag: eTag, chunks: missing, into: handle) })
      } catch DiskError.gone {
        continue  // replaced meanwhile (by a whole download): look again
      }
      done.close()
    }
    throw DiskError.notPresent(range)
  }

  /// The read-ahead for a read at `range`: twice the bytes cached just before it (a sequential
  /// read has them all), between the default and the maximum.
  func sequentialReadAhead(_ handle: CachedFileHandle, before range: ByteRange, dataSize: UInt64)
    -> UInt64
  {
    let base = options.readAheadBytes
    var run: UInt64 = 0
    var probe = max(base, CacheChunks.size)
    while probe <= options.maxReadAheadBytes / 2, probe <= range.lowerBound {
      let before = CacheChunks.chunks(
        covering: ByteRange(range.lowerBound - probe, range.lowerBound), fileSize: dataSize)
      guard handle.missingChunks(in: before) == nil else { break }
      run = probe
      probe *= 2
    }
    return min(options.maxReadAheadBytes, max(base, 2 * run))
  }

  /// The node's metadata section, fetched alone (not cached on disk).
  public func metadata(nodeID: NodeID) throws -> Data { try section(.metadata, nodeID: nodeID) }

  /// The node's thumbnail section, fetched alone (not cached on disk).
  public func thumbnail(nodeID: NodeID) throws -> Data { try section(.thumbnail, nodeID: nodeID) }

  /// The node's DATA section sizes and eTag, fetching the object's header if not known yet.
  public func cloudDataInfo(nodeID: NodeID) throws -> CloudDataInfo {
    let t = try target(nodeID)
    if let info = t.knownInfo { return info }
    let (reader, eTag) = try reader(for: t)
    return CloudDataInfo(reader.sizes, eTag: eTag, lastModified: nil)
  }

  // MARK: Steps

  private func target(_ nodeID: NodeID) throws -> Target {
    let (node, location) = try catalog.read(userID) { tx -> (Node?, CloudObjectRef?) in
      guard let node = try tx.node(id: nodeID) else { return (nil, nil) }
      return (node, try tx.objectLocation(of: nodeID))
    }
    guard let node else { throw SyncError.nodeGone(nodeID) }
    guard let location else { throw DownloadError.noData(nodeID) }
    return Target(node: node, location: location)
  }

  private func section(_ section: CloudFileSection, nodeID: NodeID) throws -> Data {
    let t = try target(nodeID)
    if let info = t.knownInfo {
      let size = section == .metadata ? info.metadataSize : info.thumbnailSize
      if size == 0 { return Data() }
    }
    let (reader, eTag) = try reader(for: t)
    let size = reader.sizes.size(of: section)
    let op = begin(nodeID, kind: section.rawValue, total: size)
    do {
      let data = try reader.read(section)
      end(op, bytes: UInt64(data.count), error: nil)
      return data
    } catch {
      let e = diagnose(error, t, eTag: eTag)
      end(op, bytes: 0, error: e)
      throw e
    }
  }

  /// Downloads the whole object (one request, into a temporary file), authenticates it while
  /// re-encrypting its data section into a new cache entry.
  private func fetchWhole(_ t: Target) throws -> CachedFileHandle {
    let total = t.knownInfo.map {
      CloudFileEncoder.encodedSize(
        metadataSize: $0.metadataSize, thumbnailSize: $0.thumbnailSize, dataSize: $0.dataSize)
    }
    let op = begin(t.node.id, kind: "download", total: total ?? 0)
    let tmp = disk.cacheDirectory.appendingPathComponent(
      "dl-" + Hex.encode(SecureRandom.bytes(12)))
    defer { _ = Glibc.unlink(tmp.path) }
    do {
      let info: ObjectInfo
      do {
        info = try retrying { try store.get(key: t.location.dataKey, range: nil, to: tmp) }
      } catch {
        throw diagnose(error, t, eTag: t.expectedETag)
      }
      if let expected = t.expectedETag, info.eTag != expected {
        throw DownloadError.remoteChanged(nodeID: t.node.id, expected: expected, found: info.eTag)
      }
      progress.update { p in
        if let i = p.operations.lastIndex(where: { $0.nodeID == op.nodeID && $0.kind == op.kind }) {
          p.operations[i].totalBytes = info.size
          p.operations[i].doneBytes = info.size
        }
      }
      let fd = Glibc.open(tmp.path, O_RDONLY)
      guard fd >= 0 else { throw StoreError.io("open downloaded object", errno: errno) }
      defer { Glibc.close(fd) }
      let handle: CachedFileHandle
      let sizes: CloudFileSizes
      do {
        let reader = try CloudFileReader(
          key: t.node.encryptionKey, ciphertextSize: info.size,
          fetch: { range in try Self.pread(fd, range) })
        sizes = reader.sizes
        handle = try disk.storeCachedFile(
          cloudID: t.node.cloudID, eTag: info.eTag, nodeID: t.node.id
        ) { file in
          var offset: UInt64 = 0
          try reader.stream(.data) { piece in
            try file.write(piece, at: offset)
            offset += UInt64(piece.count)
          }
        }
      } catch let error as CryptoError {
        throw SyncError.badRemoteObject(key: t.location.dataKey, reason: "\(error)")
      }
      record(t, sizes: sizes, eTag: info.eTag, lastModified: info.lastModified)
      end(op, bytes: info.size, error: nil)
      return handle
    } catch {
      end(op, bytes: 0, error: error)
      throw error
    }
  }

  private static func pread(_ fd: Int32, _ range: ByteRange) throws -> Data {
    var out = Data(count: Int(range.count))
    let n = out.withUnsafeMutableBytes { buf -> Int in
      var done = 0
      while done < buf.count {
        let r = Glibc.pread(
          fd, buf.baseAddress! + done, buf.count - done, off_t(range.lowerBound) + off_t(done))
        if r < 0 && errno == EINTR { continue }
        if r <= 0 { break }
        done += r
      }
      return done
    }
    out.count = n
    return out
  }

  /// Fetches `chunks` of the data section (one ranged request) into a partial entry.
  private func fetchChunks(
    _ t: Target, reader: CloudFileReader, eTag: String, chunks: Range<UInt64>,
    into handle: CachedFileHandle
  ) throws -> CachedFileHandle {
    // Another download may have filled them between our check and this flight.
    guard let chunks = handle.missingChunks(in: chunks) else { return try handle.duplicate() }
    let range = CacheChunks.byteRange(of: chunks, fileSize: reader.sizes.dataSize)
    let op = begin(t.node.id, kind: "download-range", total: range.count)
    do {
      let data: Data
      do {
        data = try reader.read(.data, range: range)
      } catch {
        throw diagnose(error, t, eTag: eTag)
      }
      try data.withUnsafeBytes { try handle.fill(chunks: chunks, with: $0) }
      end(op, bytes: range.count, error: nil)
      return try handle.duplicate()
    } catch {
      end(op, bytes: 0, error: error)
      throw error
    }
  }

  /// A decoded header of the node's DATA object (from memory, or fetched) and its eTag.
  private func reader(for t: Target) throws -> (CloudFileReader, String) {
    if let e = t.expectedETag,
      let r = lock.withLock({ readers[ReaderKey(dataKey: t.location.dataKey, eTag: e)] })
    {
      return (r, e)
    }
    let size: UInt64
    let eTag: String
    if let e = t.expectedETag, let info = t.knownInfo {
      eTag = e
      size = CloudFileEncoder.encodedSize(
        metadataSize: info.metadataSize, thumbnailSize: info.thumbnailSize,
        dataSize: info.dataSize)
    } else {
      let info: ObjectInfo
      do {
        info = try retrying { try store.head(key: t.location.dataKey) }
      } catch {
        throw diagnose(error, t, eTag: t.expectedETag)
      }
      if let expected = t.expectedETag, info.eTag != expected {
        throw DownloadError.remoteChanged(nodeID: t.node.id, expected: expected, found: info.eTag)
      }
      eTag = info.eTag
      size = info.size
    }
    let key = ReaderKey(dataKey: t.location.dataKey, eTag: eTag)
    let reader = try readerFlights.run(key, share: { $0 }, release: { _ in }) {
      if let r = lock.withLock({ readers[key] }) { return r }
      let store = self.store
      let dataKey = t.location.dataKey
      let r: CloudFileReader
      do {
        r = try CloudFileReader(
          key: t.node.encryptionKey, ciphertextSize: size,
          fetch: { [options, logger] range in
            try Self.retrying(options, logger) { try store.get(key: dataKey, range: range) }
          })
      } catch {
        throw diagnose(error, t, eTag: eTag)
      }
      lock.withLock {
        if readers.updateValue(r, forKey: key) == nil { readerOrder.append(key) }
        while readerOrder.count > max(1, options.headerCacheSize) {
          readers[readerOrder.removeFirst()] = nil
        }
      }
      record(t, sizes: r.sizes, eTag: eTag, lastModified: nil)
      return r
    }
    return (reader, eTag)
  }

  /// Tells a changed object (→ `remoteChanged`) from a bad one (→ `badRemoteObject`); store
  /// errors other than these pass through.
  private func diagnose(_ error: any Error, _ t: Target, eTag: String?) -> any Error {
    let dataKey = t.location.dataKey
    if let eTag { forgetReader(ReaderKey(dataKey: dataKey, eTag: eTag)) }
    switch error {
    case StoreError.notFound:
      if eTag == nil && t.expectedETag == nil { return DownloadError.noData(t.node.id) }
      return DownloadError.remoteChanged(nodeID: t.node.id, expected: eTag, found: nil)
    case is CryptoError, StoreError.invalidRange:
      if let eTag {
        do {
          let now = try retrying { try store.head(key: dataKey) }
          if now.eTag != eTag {
            return DownloadError.remoteChanged(nodeID: t.node.id, expected: eTag, found: now.eTag)
          }
        } catch StoreError.notFound {
          return DownloadError.remoteChanged(nodeID: t.node.id, expected: eTag, found: nil)
        } catch {}
      }
      return SyncError.badRemoteObject(key: dataKey, reason: "\(error)")
    default:
      return error
    }
  }

  private func forgetReader(_ key: ReaderKey) {
    lock.withLock {
      if readers.removeValue(forKey: key) != nil { readerOrder.removeAll { $0 == key } }
    }
  }

  /// Records the object's section sizes on the node, if they are news and still current.
  private func record(_ t: Target, sizes: CloudFileSizes, eTag: String, lastModified: Date?) {
    let info = CloudDataInfo(
      sizes, eTag: eTag, lastModified: lastModified ?? t.node.lastModifiedData)
    if let old = t.node.cloudDataInfo, old.eTag == eTag, old.metadataSize == info.metadataSize,
      old.thumbnailSize == info.thumbnailSize, old.dataSize == info.dataSize
    {
      return
    }
    do {
      try catalog.write(userID) { tx in
        guard let n = try tx.node(id: t.node.id), n.eTagData == nil || n.eTagData == eTag else {
          return
        }
        try tx.setCloudState(
          nodeID: n.id, eTagRcrd: n.eTagRcrd, lastModifiedRcrd: n.lastModifiedRcrd,
          eTagData: n.eTagData, lastModifiedData: n.lastModifiedData, cloudDataInfo: info)
      }
    } catch {
      logger.warning("could not record DATA sizes of node \(t.node.id): \(error)")
    }
  }

  // MARK: Retries

  /// Runs a store request, retrying `StoreError.transient` with exponential backoff.
  private func retrying<T>(_ body: () throws -> T) throws -> T {
    try Self.retrying(options, logger, body)
  }

  private static func retrying<T>(
    _ options: DownloadOptions, _ logger: Logger, _ body: () throws -> T
  ) throws -> T {
    var delay = options.initialBackoff
    var attempt = 1
    while true {
      do {
        return try body()
      } catch let error as StoreError where error.isRetryable && attempt < options.maxAttempts {
        logger.debug("retrying after \(error) (attempt \(attempt))")
        Thread.sleep(forTimeInterval: delay * Double.random(in: 0.75...1.25))
        delay = min(delay * 2, options.maxBackoff)
        attempt += 1
      }
    }
  }

  // MARK: Progress

  struct OperationToken {
    var nodeID: NodeID
    var kind: String
    var total: UInt64
  }

  private func begin(_ nodeID: NodeID, kind: String, total: UInt64) -> OperationToken {
    progress.update { p in
      p.download.inFlightItems += 1
      p.download.inFlightBytes += total
      p.operations.append(
        OperationProgress(nodeID: nodeID, kind: kind, totalBytes: total, doneBytes: 0))
    }
    return OperationToken(nodeID: nodeID, kind: kind, total: total)
  }

  private func end(_ op: OperationToken, bytes: UInt64, error: (any Error)?) {
    progress.update { p in
      p.download.inFlightItems -= 1
      p.download.inFlightBytes -= min(op.total, p.download.inFlightBytes)
      if let i = p.operations.firstIndex(where: { $0.nodeID == op.nodeID && $0.kind == op.kind }) {
        p.operations.remove(at: i)
      }
      if let error {
        p.lastError = "download of node \(op.nodeID) failed: \(error)"
      } else {
        p.download.doneItems += 1
        p.download.doneBytes += bytes
      }
    }
  }
}

/// Runs one piece of work per key however many threads ask at once: the others wait (blocking,
/// on a condition variable) and share its result.
final class Coalescer<Key: Hashable & Sendable, Value>: @unchecked Sendable {
  // @unchecked: `flights` is guarded by `lock`; each flight's fields by its condition.

  final class Flight {
    let condition = NSCondition()
    var result: Result<Value, any Error>?
    var participants = 1
  }

  private let lock = NSLock()
  private var flights: [Key: Flight] = [:]

  /// The result of `work` for `key`, run here or by the thread already running it (or a flight
  /// that `covers` says includes it). Each participant gets `share(result)`; `release` runs on
  /// the leader's result once every participant has its share.
  func run(
    _ key: Key, covers: (Key) -> Bool = { _ in false }, share: (Value) throws -> Value,
    release: (Value) -> Void, work: () throws -> Value
  ) throws -> Value {
    let (flight, leader) = lock.withLock { () -> (Flight, Bool) in
      if let f = flights[key] ?? flights.first(where: { covers($0.key) })?.value {
        f.condition.withLock { f.participants += 1 }
        return (f, false)
      }
      let f = Flight()
      flights[key] = f
      return (f, true)
    }
    if leader {
      let result = Result { try work() }
      lock.withLock { flights[key] = nil }
      flight.condition.withLock {
        flight.result = result
        flight.condition.broadcast()
      }
    }
    flight.condition.lock()
    defer { flight.condition.unlock() }
    while flight.result == nil { flight.condition.wait() }
    flight.participants -= 1
    switch flight.result! {
    case .success(let value):
      let mine = Result { try share(value) }
      if flight.participants == 0 { release(value) }
      return try mine.get()
    case .failure(let error):
      throw error
    }
  }
}
