import Foundation
import Logging
import ZDCCore
import ZDCDisk
import ZDCSync

/// Reads of a big file that is not (wholly) in the disk cache: ranged downloads into a partial
/// cache entry, with read-ahead in the background for sequential readers.
///
/// A read downloads only the chunks it needs (a random reader fetches 64 KiB chunks, not
/// windows it will not read). A sequential reader — one that starts where the previous read
/// ended, give or take the kernel's parallel read-ahead — also starts background downloads of
/// the next window, which doubles per sequential read up to ``maxWindow``, so that by the time
/// it asks, the bytes are local or on their way (a read that needs chunks a background
/// download is fetching waits for it instead of fetching them again). Thread-safe: reads may
/// run concurrently.
final class RangedSource: @unchecked Sendable {
  // @unchecked: mutable state is guarded by `lock`.
  let nodeID: NodeID
  let size: UInt64
  private let lock = NSLock()
  /// The latest handle on the partial entry (pinned; replaced by fresher ones).
  private var handle: CachedFileHandle?
  /// Where a sequential reader continues.
  private var expected: UInt64 = 0
  /// How far ahead of a sequential reader to download.
  private var window: UInt64 = RangedSource.minWindow
  /// The end of what background downloads were asked for.
  private var prefetchedTo: UInt64 = 0
  private var prefetching = 0
  private var closed = false

  /// The first read-ahead window of a sequential reader.
  static let minWindow: UInt64 = 1 << 20
  /// The largest read-ahead window.
  static let maxWindow: UInt64 = 16 << 20
  /// Background downloads at once per open file.
  static let maxPrefetches = 2
  /// Where background downloads run (blocking calls, off the FUSE threads).
  static let prefetchQueue = DispatchQueue(
    label: "zdc.fs.prefetch", qos: .utility, attributes: .concurrent)

  init(nodeID: NodeID, size: UInt64, handle: CachedFileHandle?) {
    self.nodeID = nodeID
    self.size = size
    self.handle = handle
  }

  /// The DATA version read, once known (a handle exists).
  var version: ContentVersion {
    lock.withLock { handle.map { .cloud($0.eTag) } ?? .unknown }
  }

  func read(into buf: UnsafeMutableRawBufferPointer, at offset: UInt64, fs: FileSystem) throws
    -> Int
  {
    guard offset < size, buf.count > 0 else { return 0 }
    let end = min(size, offset + UInt64(buf.count))
    let range = ByteRange(offset, end)
    // A pinned handle of our own: another read may replace (and close) the shared one.
    let (local, sequential) = try lock.withLock { () -> (CachedFileHandle?, Bool) in
      guard !closed else { throw FileSystemError.badHandle }
      let slack = window
      let sequential =
        offset + slack >= expected && offset <= expected + slack
      if sequential {
        window = min(window * 2, Self.maxWindow)
      } else {
        window = Self.minWindow
      }
      expected = max(expected, end)
      return (try handle?.duplicate(), sequential)
    }
    if sequential { prefetch(after: end, fs: fs) }
    if let local {
      defer { local.close() }
      if local.contains(range) { return try local.read(into: buf, at: offset) }
    }
    guard let downloads = fs.downloads else { throw FileSystemError.unavailable }
    let fresh: CachedFileHandle
    do {
      fresh = try fs.downloadingNode(nodeID) {
        try downloads.downloadRange(nodeID: nodeID, range: range, readAhead: 0)
      }
    } catch {
      throw FileSystemError.io("download failed")
    }
    defer { fresh.close() }
    let keep = try fresh.duplicate()
    let old = lock.withLock { () -> CachedFileHandle? in
      if closed { return keep }
      defer { handle = keep }
      return handle
    }
    old?.close()
    return try fresh.read(into: buf, at: offset)
  }

  /// Starts background downloads of the window after `end`, unless already asked for.
  private func prefetch(after end: UInt64, fs: FileSystem) {
    guard let downloads = fs.downloads else { return }
    let job = lock.withLock { () -> ByteRange? in
      guard !closed, prefetching < Self.maxPrefetches else { return nil }
      let target = min(size, end + window)
      let from = max(prefetchedTo, end)
      guard target > from else { return nil }
      prefetchedTo = target
      prefetching += 1
      return ByteRange(from, target)
    }
    guard let job else { return }
    let id = nodeID
    Self.prefetchQueue.async { [self] in
      defer { lock.withLock { prefetching -= 1 } }
      do {
        let h = try fs.downloadingNode(id) {
          try downloads.downloadRange(nodeID: id, range: job, readAhead: 0)
        }
        h.close()
      } catch {
        // A read that needs these bytes downloads them itself (and reports the failure).
        lock.withLock { prefetchedTo = min(prefetchedTo, job.lowerBound) }
        fs.log.debug("read-ahead download failed: \(error)")
      }
    }
  }

  func close() {
    let h = lock.withLock { () -> CachedFileHandle? in
      closed = true
      defer { handle = nil }
      return handle
    }
    h?.close()
  }

  func bufferedChunk(containing offset: UInt64, into out: UnsafeMutableRawBufferPointer)
    -> (start: UInt64, count: Int)?
  {
    guard let h = lock.withLock({ try? handle?.duplicate() }) else { return nil }
    defer { h.close() }
    return h.bufferedChunk(containing: offset, into: out)
  }
}
