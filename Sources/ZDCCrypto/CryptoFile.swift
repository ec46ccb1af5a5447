import CSodium
public import Foundation
import Glibc
import ZDCCore

/// A local encrypted file (cache and write-back staging) that reads and writes like a plain
/// file: CryptoFile v1.
///
/// The plaintext is split into 64 KiB chunks, each stored in a fixed-size slot with its own
/// fresh random nonce, authenticated with the file's random ID, its index and whether it is the
/// last chunk. Only the chunks an operation touches are re-encrypted, and a one-chunk write-back
/// buffer makes small sequential writes encrypt each chunk once.
///
/// A non-final slot that is all zero bytes (a filesystem hole) reads as 64 KiB of zeros, so
/// extending a file or writing sparsely never encrypts the gap. As a consequence, someone who
/// can write the cache file can zero a chunk undetected: the local cache does not defend
/// against a local attacker with write access (the store format has no such allowance).
///
/// Changes reach the disk on `sync()` or `close()` (or when the buffer moves to another chunk);
/// a file left mid-update by a crash fails authentication rather than returning wrong bytes.
///
/// Thread-safe: every operation holds an internal lock.
public final class CryptoFile: @unchecked Sendable {
  // @unchecked: all mutable state is guarded by `lock`.

  /// The format version.
  public static let version: UInt8 = 1
  /// log2 of the chunk size.
  public static let chunkShift: UInt8 = 16
  /// Plaintext bytes per chunk.
  public static let chunkSize = 1 << 16
  /// Bytes of the cleartext header.
  public static let headerSize = 32
  /// Bytes of a full slot: nonce (24) ‖ ciphertext (64 KiB) ‖ tag (16).
  public static let slotSize = chunkSize + slotOverhead
  static let slotOverhead = AEAD.nonceSize + AEAD.tagSize
  static let magic: [UInt8] = Array("ZDCCRYPT".utf8)
  static let fileIDSize = 16

  private let lock = NSLock()
  private var fd: Int32
  private let key: Data
  /// fileID (16) ‖ u64 LE chunk index ‖ u8 last flag.
  private var ad = [UInt8](repeating: 0, count: 16 + 8 + 1)
  private var plaintextSize: UInt64
  private var physicalSize: UInt64
  /// Plaintext of the buffered chunk; bytes from `bufferLength` on are zero.
  private let buffer: UnsafeMutableRawBufferPointer
  private var bufferIndex: UInt64?
  private var bufferLength = 0
  /// Bytes of `buffer` that may be non-zero (from here on it is zero): making the buffer zero
  /// costs only what was used, not 64 KiB (most files are small).
  private var bufferExtent = 0
  private var bufferDirty = false
  /// Scratch space for one slot.
  private let slot: UnsafeMutableRawBufferPointer
  /// Number of chunk encryptions so far (for tests of the write-back buffer).
  private(set) var chunkEncryptions = 0

  private init(fd: Int32, key: Data, fileID: Data, plaintextSize: UInt64, physicalSize: UInt64) {
    self.fd = fd
    self.key = key
    self.plaintextSize = plaintextSize
    self.physicalSize = physicalSize
    // Both from one anonymous mapping: zero pages that cost nothing until touched, and that
    // leave the process (plaintext included) when unmapped — no 64 KiB memset at either end.
    let space = Self.mapSize
    let base = mmap(nil, space, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if let base, base != MAP_FAILED {
      mapped = UnsafeMutableRawBufferPointer(start: base, count: space)
    } else {
      let fallback = UnsafeMutableRawBufferPointer.allocate(byteCount: space, alignment: 16)
      fallback.initializeMemory(as: UInt8.self, repeating: 0)
      mapped = fallback
      isMapped = false
    }
    buffer = UnsafeMutableRawBufferPointer(rebasing: mapped[0..<Self.chunkSize])
    slot = UnsafeMutableRawBufferPointer(
      rebasing: mapped[Self.slotStart..<(Self.slotStart + Self.slotSize)])
    ad.replaceSubrange(0..<16, with: fileID)
  }

  deinit {
    if fd >= 0 {
      try? flush()
      Glibc.close(fd)
    }
    if isMapped {
      munmap(mapped.baseAddress, mapped.count)
    } else {
      sodium_memzero(mapped.baseAddress, mapped.count)
      mapped.deallocate()
    }
  }

  /// The buffer and the slot scratch space, page-aligned.
  private let mapped: UnsafeMutableRawBufferPointer
  private var isMapped = true
  private static let slotStart = chunkSize
  private static let mapSize = (chunkSize + slotSize + 4095) & ~4095

  /// Makes the whole buffer zero again.
  private func zeroBuffer() {
    if bufferExtent > 0 {
      UnsafeMutableRawBufferPointer(rebasing: buffer[0..<bufferExtent])
        .initializeMemory(as: UInt8.self, repeating: 0)
    }
    bufferExtent = 0
  }

  // MARK: Layout arithmetic

  static func lastIndex(_ size: UInt64) -> UInt64 {
    size == 0 ? 0 : (size - 1) >> UInt64(chunkShift)
  }

  /// Plaintext length of chunk `i` (at most the last index) in a file of `size` bytes.
  static func chunkLength(_ i: UInt64, _ size: UInt64) -> Int {
    i == lastIndex(size) ? Int(size - (i << UInt64(chunkShift))) : chunkSize
  }

  static func slotOffset(_ i: UInt64) -> UInt64 {
    UInt64(headerSize) + i * UInt64(slotSize)
  }

  /// The physical file size holding `size` plaintext bytes.
  public static func physicalSize(plaintextSize size: UInt64) -> UInt64 {
    let last = lastIndex(size)
    return slotOffset(last) + UInt64(slotOverhead + chunkLength(last, size))
  }

  /// The plaintext size of a physical file of `physical` bytes, or `nil` if no valid file has
  /// that size.
  public static func plaintextSize(physicalSize physical: UInt64) -> UInt64? {
    guard physical >= UInt64(headerSize + slotOverhead) else { return nil }
    let body = physical - UInt64(headerSize)
    let full = body / UInt64(slotSize)
    let rem = body % UInt64(slotSize)
    if rem == 0 { return full * UInt64(chunkSize) }
    guard rem >= UInt64(slotOverhead), !(rem == UInt64(slotOverhead) && full > 0) else {
      return nil
    }
    return full * UInt64(chunkSize) + rem - UInt64(slotOverhead)
  }

  /// The plaintext size of the CryptoFile at `url`, from its physical size alone.
  public static func plaintextSize(ofFileAt url: URL) throws -> UInt64 {
    var st = stat()
    guard stat(url.path, &st) == 0 else { throw POSIXIO.error("stat \(url.path)") }
    guard let size = plaintextSize(physicalSize: UInt64(st.st_size)) else {
      throw CryptoError.malformed("CryptoFile of \(st.st_size) bytes cannot be valid")
    }
    return size
  }

  // MARK: Opening

  /// Creates (or replaces) an empty CryptoFile, mode 0600, under a 32-byte key.
  public static func create(at url: URL, key: Data) throws -> CryptoFile {
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("file key must be 32 bytes")
    }
    let fd = try POSIXIO.open(url.path, O_RDWR | O_CREAT | O_TRUNC)
    let fileID = SecureRandom.bytes(fileIDSize)
    var header = Data(count: headerSize)
    header.withUnsafeMutableBytes { h in
      h.copyBytes(from: magic)
      h[8] = version
      h[9] = chunkShift
      fileID.withUnsafeBytes {
        UnsafeMutableRawBufferPointer(rebasing: h[16..<32]).copyMemory(from: $0)
      }
    }
    do {
      try header.withUnsafeBytes { try POSIXIO.pwrite(fd, $0, 0) }
    } catch {
      Glibc.close(fd)
      throw error
    }
    let file = CryptoFile(
      fd: fd, key: key, fileID: fileID, plaintextSize: 0, physicalSize: UInt64(headerSize))
    file.bufferIndex = 0
    file.bufferLength = 0
    file.bufferDirty = true
    try file.flush()
    return file
  }

  /// Opens an existing CryptoFile; checks its header and authenticates its last chunk.
  public static func open(at url: URL, key: Data) throws -> CryptoFile {
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("file key must be 32 bytes")
    }
    let fd = try POSIXIO.open(url.path, O_RDWR)
    do {
      var header = Data(count: headerSize)
      let got = try header.withUnsafeMutableBytes { try POSIXIO.pread(fd, $0, 0) }
      guard got == headerSize else { throw CryptoError.truncated("CryptoFile header") }
      try header.withUnsafeBytes { h in
        guard h[0..<8].elementsEqual(magic) else { throw CryptoError.malformed("CryptoFile magic") }
        guard h[8] == version else { throw CryptoError.unsupportedVersion(Int(h[8])) }
        guard h[9] == chunkShift, h[10..<16].allSatisfy({ $0 == 0 }) else {
          throw CryptoError.malformed("CryptoFile header")
        }
      }
      let physical = try POSIXIO.size(fd)
      guard let size = plaintextSize(physicalSize: physical) else {
        throw CryptoError.truncated("CryptoFile of \(physical) bytes cannot be valid")
      }
      let file = CryptoFile(
        fd: fd, key: key, fileID: header.subdata(in: 16..<32), plaintextSize: size,
        physicalSize: physical)
      try file.load(lastIndex(size), fresh: false)
      return file
    } catch {
      Glibc.close(fd)
      throw error
    }
  }

  // MARK: Chunk buffer

  private func checkOpen() throws {
    guard fd >= 0 else { throw StoreError.io("CryptoFile is closed", errno: EBADF) }
  }

  private func setAD(index: UInt64, last: Bool) {
    ad.withUnsafeMutableBytes { LE.store(index, $0, at: 16) }
    ad[24] = last ? 1 : 0
  }

  /// Encrypts the buffered chunk into its slot if it changed.
  private func flush() throws {
    guard bufferDirty, let index = bufferIndex else { return }
    let length = bufferLength
    let last = index == Self.lastIndex(plaintextSize)
    setAD(index: index, last: last)
    randombytes_buf(slot.baseAddress!, AEAD.nonceSize)
    let nonce = UnsafeRawBufferPointer(rebasing: slot[0..<AEAD.nonceSize])
    let body = UnsafeMutableRawBufferPointer(rebasing: slot[AEAD.nonceSize...])
    _ = try ad.withUnsafeBytes { a in
      try key.withUnsafeBytes { k in
        try AEAD.seal(
          UnsafeRawBufferPointer(rebasing: buffer[0..<length]), into: body, nonce: nonce,
          associatedData: a, key: k)
      }
    }
    chunkEncryptions += 1
    let offset = Self.slotOffset(index)
    let count = Self.slotOverhead + length
    try POSIXIO.pwrite(fd, UnsafeRawBufferPointer(rebasing: slot[0..<count]), offset)
    let end = offset + UInt64(count)
    if last {
      if physicalSize != end { try POSIXIO.truncate(fd, end) }
      physicalSize = end
    } else {
      physicalSize = max(physicalSize, end)
    }
    bufferDirty = false
  }

  /// Makes chunk `index` the buffered chunk (flushing the previous one). A `fresh` chunk starts
  /// as zeros without reading the disk; otherwise its slot is read and authenticated.
  private func load(_ index: UInt64, fresh: Bool) throws {
    if bufferIndex == index { return }
    try flush()
    bufferIndex = nil
    if fresh {
      zeroBuffer()
      bufferLength = 0
      bufferIndex = index
      return
    }
    let length = Self.chunkLength(index, plaintextSize)
    let last = index == Self.lastIndex(plaintextSize)
    let count = Self.slotOverhead + length
    let got = try POSIXIO.pread(
      fd, UnsafeMutableRawBufferPointer(rebasing: slot[0..<count]), Self.slotOffset(index))
    guard got == count else { throw CryptoError.truncated("CryptoFile slot \(index)") }
    if !last, slot[0..<AEAD.nonceSize].allSatisfy({ $0 == 0 }),
      sodium_is_zero(slot.baseAddress!.assumingMemoryBound(to: UInt8.self), count) == 1
    {
      // A hole: reads as zeros.
      zeroBuffer()
    } else {
      setAD(index: index, last: last)
      do {
        _ = try ad.withUnsafeBytes { a in
          try key.withUnsafeBytes { k in
            try AEAD.open(
              UnsafeRawBufferPointer(rebasing: slot[AEAD.nonceSize..<count]), into: buffer,
              nonce: UnsafeRawBufferPointer(rebasing: slot[0..<AEAD.nonceSize]),
              associatedData: a, key: k)
          }
        }
      } catch CryptoError.authenticationFailed {
        // The buffer may hold part of the plaintext: it holds nothing valid now.
        bufferExtent = Self.chunkSize
        zeroBuffer()
        throw CryptoError.authenticationFailed("CryptoFile chunk \(index)")
      }
      if length < bufferExtent {
        UnsafeMutableRawBufferPointer(rebasing: buffer[length..<bufferExtent])
          .initializeMemory(as: UInt8.self, repeating: 0)
      }
      bufferExtent = length
    }
    bufferLength = length
    bufferIndex = index
  }

  /// Grows the file with zeros to `newSize` (> current size).
  private func extend(to newSize: UInt64) throws {
    let oldLast = Self.lastIndex(plaintextSize)
    let newLast = Self.lastIndex(newSize)
    try load(oldLast, fresh: false)
    plaintextSize = newSize
    bufferLength = Self.chunkLength(oldLast, newSize)
    bufferDirty = true
    if newLast > oldLast {
      // Chunks between stay holes; the new last chunk is zeros.
      try load(newLast, fresh: true)
      bufferLength = Self.chunkLength(newLast, newSize)
      bufferDirty = true
    }
  }

  // MARK: Public operations

  /// The plaintext size.
  public var size: UInt64 {
    lock.lock()
    defer { lock.unlock() }
    return plaintextSize
  }

  /// Reads up to `buffer.count` bytes at `offset` into `buffer`; returns the number read,
  /// fewer than asked only at the end of the file.
  public func read(into out: UnsafeMutableRawBufferPointer, at offset: UInt64) throws -> Int {
    lock.lock()
    defer { lock.unlock() }
    try checkOpen()
    guard offset < plaintextSize, out.count > 0 else { return 0 }
    let end = min(plaintextSize, offset + UInt64(out.count))
    var pos = offset
    while pos < end {
      let index = pos >> UInt64(Self.chunkShift)
      try load(index, fresh: false)
      let start = index << UInt64(Self.chunkShift)
      let a = Int(pos - start)
      let b = Int(min(end, start + UInt64(Self.chunkSize)) - start)
      let dst = Int(pos - offset)
      UnsafeMutableRawBufferPointer(rebasing: out[dst..<(dst + b - a)])
        .copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[a..<b]))
      pos = start + UInt64(b)
    }
    return Int(end - offset)
  }

  /// Reads up to `count` bytes at `offset` (fewer at the end of the file).
  public func read(offset: UInt64, count: Int) throws -> Data {
    let available = min(UInt64(max(0, count)), size > offset ? size - offset : 0)
    var out = Data(count: Int(available))
    let n = try out.withUnsafeMutableBytes { try read(into: $0, at: offset) }
    if n < out.count { out.count = n }
    return out
  }

  /// Writes bytes at any offset; writing beyond the end fills the gap with zeros.
  public func write(_ bytes: UnsafeRawBufferPointer, at offset: UInt64) throws {
    lock.lock()
    defer { lock.unlock() }
    try checkOpen()
    guard bytes.count > 0 else { return }
    guard offset <= UInt64(Int64.max) - UInt64(bytes.count) else {
      throw StoreError.io("CryptoFile write beyond the largest file size", errno: EFBIG)
    }
    if offset > plaintextSize { try extend(to: offset) }
    let oldLast = Self.lastIndex(plaintextSize)
    let end = offset + UInt64(bytes.count)
    let newSize = max(plaintextSize, end)
    if newSize > plaintextSize {
      // The old last chunk grows (or stops being last): read it under the current size, whose
      // length and last flag are the ones on disk, before the size changes.
      try load(oldLast, fresh: false)
      bufferDirty = true
    }
    plaintextSize = newSize
    if bufferIndex == oldLast { bufferLength = Self.chunkLength(oldLast, newSize) }
    var pos = offset
    while pos < end {
      let index = pos >> UInt64(Self.chunkShift)
      let start = index << UInt64(Self.chunkShift)
      let a = Int(pos - start)
      let b = Int(min(end, start + UInt64(Self.chunkSize)) - start)
      let length = Self.chunkLength(index, newSize)
      try load(index, fresh: index > oldLast || (a == 0 && b >= length))
      let src = Int(pos - offset)
      UnsafeMutableRawBufferPointer(rebasing: buffer[a..<b])
        .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[src..<(src + b - a)]))
      bufferExtent = max(bufferExtent, b)
      bufferLength = length
      bufferDirty = true
      pos = start + UInt64(b)
    }
  }

  /// Writes bytes at any offset; writing beyond the end fills the gap with zeros.
  public func write(_ data: Data, at offset: UInt64) throws {
    try data.withUnsafeBytes { try write($0, at: offset) }
  }

  /// Shrinks or grows (with zeros) the file to `newSize` bytes.
  public func truncate(to newSize: UInt64) throws {
    lock.lock()
    defer { lock.unlock() }
    try checkOpen()
    if newSize == plaintextSize { return }
    guard newSize <= UInt64(Int64.max) else {
      throw StoreError.io("CryptoFile truncate beyond the largest file size", errno: EFBIG)
    }
    if newSize > plaintextSize { return try extend(to: newSize) }
    try flush()
    let newLast = Self.lastIndex(newSize)
    if let b = bufferIndex, b > newLast { bufferIndex = nil }
    try load(newLast, fresh: false)
    let length = Self.chunkLength(newLast, newSize)
    if length < bufferLength {
      UnsafeMutableRawBufferPointer(rebasing: buffer[length..<bufferLength])
        .initializeMemory(as: UInt8.self, repeating: 0)
    }
    plaintextSize = newSize
    bufferLength = length
    bufferDirty = true
    try flush()
  }

  /// Writes the buffered chunk and flushes the file to stable storage.
  public func sync() throws {
    lock.lock()
    defer { lock.unlock() }
    try checkOpen()
    try flush()
    try POSIXIO.fsync(fd)
  }

  /// Writes the buffered chunk to the file (no fsync): the content survives a crash of this
  /// process, not a power loss (use ``sync()`` for that).
  public func flushBuffer() throws {
    lock.lock()
    defer { lock.unlock() }
    try checkOpen()
    try flush()
  }

  /// Writes the buffered chunk and closes the file; later calls throw.
  public func close() throws {
    lock.lock()
    defer { lock.unlock() }
    guard fd >= 0 else { return }
    defer {
      Glibc.close(fd)
      fd = -1
    }
    try flush()
  }

  /// Streams the whole plaintext in order, one chunk (or less) per call.
  public func readAll(to sink: (Data) throws -> Void) throws {
    var offset: UInt64 = 0
    while true {
      let piece = try read(offset: offset, count: Self.chunkSize)
      if piece.isEmpty { return }
      try sink(piece)
      offset += UInt64(piece.count)
    }
  }

  /// The plaintext as a `CloudFileSource`, read sequentially from the current size.
  public func cloudFileSource() -> CloudFileSource {
    var offset: UInt64 = 0
    return .reader(size: size) { [self] buf in
      let n = try read(into: buf, at: offset)
      offset += UInt64(n)
      return n
    }
  }
}
