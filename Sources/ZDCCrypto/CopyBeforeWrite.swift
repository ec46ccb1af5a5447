import Foundation
import Glibc
import Synchronization

/// A copy of a file's content at one moment, made while the file goes on being written in
/// place: each block the file is about to change is copied first (``willWrite(at:count:)``,
/// ``willTruncate(to:)``), and the rest on demand (``fill()``). Until it is filled, the copy's
/// blocks not copied yet are holes (it starts sparse), so that after a crash of the process
/// ``fillHoles(copy:from:)`` completes it from the file: a block not copied is one the file
/// has not changed.
///
/// Works on file systems that report holes (`SEEK_HOLE`) exactly at block granularity
/// (``supports(path:)``). A power loss may lose copied blocks not yet written back, which then
/// come from the file, changed; as for any write not yet flushed.
public final class CopyBeforeWrite: Sendable {
  /// The unit copied: the file system's block (holes are whole blocks).
  public static let blockSize: UInt64 = 4096

  /// The file's size when the copy began (the copy's size).
  public let size: UInt64
  private let state: Mutex<State>

  private struct State {
    var source: Int32
    var copy: Int32
    /// One bit per block: copied.
    var copied: [UInt64]
    var remaining: Int
    var finished = false
  }

  /// Starts a copy of the file at `source` into the file at `copy` (made its size: holes but
  /// for its first block, copied at once).
  ///
  /// What `copy` holds already (a new file's header) lies within its first block, which is
  /// copied over it. The copy is not emptied first: on ext4, a file cut to size 0 is written
  /// back as soon as it is closed (its "replace by truncate" heuristic), so each copy, usually
  /// deleted unread at the next commit, cost a write to the device (a third of the commit's
  /// time in a database's transactions).
  public init(source: String, copy: String) throws {
    let s = Glibc.open(source, O_RDONLY | O_CLOEXEC)
    guard s >= 0 else { throw POSIXIO.error("open \(source)") }
    let c = Glibc.open(copy, O_WRONLY | O_CLOEXEC)
    guard c >= 0 else {
      let error = POSIXIO.error("open \(copy)")
      Glibc.close(s)
      throw error
    }
    let blocks: Int
    var copied: [UInt64]
    do {
      size = try POSIXIO.size(s)
      blocks = Int((size + Self.blockSize - 1) / Self.blockSize)
      copied = [UInt64](repeating: 0, count: (blocks + 63) / 64)
      let first = min(size, Self.blockSize)
      if try POSIXIO.size(c) > first {
        // More than its first block to cover: emptied (not expected).
        try POSIXIO.truncate(c, 0)
      } else if first > 0 {
        try Self.copy(from: s, to: c, range: 0..<first)
        copied[0] = 1
      }
      try POSIXIO.truncate(c, size)
    } catch {
      Glibc.close(s)
      Glibc.close(c)
      throw error
    }
    state = Mutex(
      State(
        source: s, copy: c, copied: copied, remaining: blocks - Int(copied.first ?? 0)))
  }

  deinit {
    state.withLock { s in
      if !s.finished { Self.close(&s) }
    }
  }

  /// Whether the file system holding `path` reports holes exactly (ext4, XFS, btrfs, tmpfs).
  public static func supports(path: String) -> Bool {
    POSIXIO.fileSystemType(ofPath: path).map(exactHoles.contains) ?? false
  }

  /// `lseek(2)` whences Glibc's module leaves out (they need `_GNU_SOURCE`).
  private static let seekData: Int32 = 3
  private static let seekHole: Int32 = 4

  static let exactHoles: Set<Int> = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994]

  /// Whether the block of `fd` at `offset` holds data, not a hole (on a file system that does
  /// not report holes, everything is data).
  public static func holdsData(_ fd: Int32, at offset: Int64) -> Bool {
    lseek(fd, off_t(offset), seekData) == off_t(offset)
  }

  /// Copies the blocks `count` bytes at `offset` of the file touch, those not copied yet,
  /// before the file is written there.
  public func willWrite(at offset: UInt64, count: Int) throws {
    try save(offset..<(offset + UInt64(count)))
  }

  /// Copies the blocks from `newSize` on, those not copied yet, before the file is cut there.
  public func willTruncate(to newSize: UInt64) throws {
    if newSize < size { try save(newSize..<size) }
  }

  /// Copies every block not copied yet: the copy is then whole, and the file's writes no longer
  /// need copying.
  public func fill() throws {
    try save(0..<size, finishing: true)
  }

  /// Stops copying (the copy is no longer wanted).
  public func finish() {
    state.withLock { s in
      if !s.finished { Self.close(&s) }
    }
  }

  /// Whether the copy is whole or no longer wanted.
  public var isFinished: Bool { state.withLock { $0.finished } }

  private func save(_ range: Range<UInt64>, finishing: Bool = false) throws {
    try state.withLock { s in
      guard !s.finished else { return }
      let end = min(range.upperBound, size)
      if range.lowerBound < end, s.remaining > 0 {
        var block = range.lowerBound / Self.blockSize
        let last = (end - 1) / Self.blockSize
        while block <= last {
          let word = Int(block / 64)
          let bit = UInt64(1) << (block % 64)
          if s.copied[word] & bit != 0 {
            block += 1
            continue
          }
          // A run of blocks not copied yet, copied with one call.
          var runEnd = block + 1
          while runEnd <= last, s.copied[Int(runEnd / 64)] & (UInt64(1) << (runEnd % 64)) == 0 {
            runEnd += 1
          }
          let from = block * Self.blockSize
          let to = min(runEnd * Self.blockSize, size)
          try Self.copy(from: s.source, to: s.copy, range: from..<to)
          for b in block..<runEnd {
            s.copied[Int(b / 64)] |= UInt64(1) << (b % 64)
          }
          s.remaining -= Int(runEnd - block)
          block = runEnd
        }
      }
      if finishing { Self.close(&s) }
    }
  }

  private static func close(_ s: inout State) {
    Glibc.close(s.source)
    Glibc.close(s.copy)
    s.source = -1
    s.copy = -1
    s.finished = true
  }

  /// Copies `range` of `source` to the same place in `copy` through a buffer: the copy's
  /// blocks must be data even where the source has holes or zeros (a hole in the copy means
  /// "not copied").
  private static func copy(from source: Int32, to copy: Int32, range: Range<UInt64>) throws {
    // No bigger than the range (a block or two, usually): a large buffer is mapped and
    // unmapped at each call.
    let chunk = Int(min(UInt64(1 << 18), max(range.upperBound - range.lowerBound, 1)))
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 4096)
    defer { buffer.deallocate() }
    var offset = range.lowerBound
    while offset < range.upperBound {
      let want = Int(min(UInt64(chunk), range.upperBound - offset))
      let part = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<want])
      let n = try POSIXIO.pread(source, part, offset)
      if n < want {
        // Past the source's end (cannot happen while writes are guarded): zeros.
        UnsafeMutableRawBufferPointer(rebasing: part[n...]).initializeMemory(
          as: UInt8.self, repeating: 0)
      }
      try POSIXIO.pwrite(copy, UnsafeRawBufferPointer(part), offset)
      offset += UInt64(want)
    }
  }

  /// Completes a copy a crash interrupted: its holes (blocks never copied) are filled from
  /// `source`, which has not changed them. Returns the bytes filled.
  @discardableResult
  public static func fillHoles(copy: String, from source: String) throws -> UInt64 {
    let c = Glibc.open(copy, O_RDWR | O_CLOEXEC)
    guard c >= 0 else { throw POSIXIO.error("open \(copy)") }
    defer { Glibc.close(c) }
    let s = Glibc.open(source, O_RDONLY | O_CLOEXEC)
    guard s >= 0 else { throw POSIXIO.error("open \(source)") }
    defer { Glibc.close(s) }
    let size = try POSIXIO.size(c)
    var filled: UInt64 = 0
    var offset: UInt64 = 0
    while offset < size {
      let hole = lseek(c, off_t(offset), Self.seekHole)
      guard hole >= 0 else { throw POSIXIO.error("lseek SEEK_HOLE") }
      if UInt64(hole) >= size { break }
      var data = lseek(c, off_t(hole), Self.seekData)
      if data < 0 {
        guard errno == ENXIO else { throw POSIXIO.error("lseek SEEK_DATA") }
        data = off_t(size)
      }
      let range = UInt64(hole)..<min(UInt64(data), size)
      try Self.copy(from: s, to: c, range: range)
      filled += UInt64(range.count)
      offset = UInt64(data)
    }
    return filled
  }
}
