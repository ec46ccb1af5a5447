import CSodium
public import Foundation
public import ZDCCore

/// The layout of CloudFile v1, the encrypted DATA object, and its pure offset arithmetic.
///
/// An object is a 32-byte outer header followed by XChaCha20-Poly1305 chunks of the plaintext
/// stream `innerHeader(64) | metadata | thumbnail | data`, 64 KiB of plaintext per chunk.
public enum CloudFileFormat {
  /// The format version in the outer and inner headers.
  public static let version: UInt8 = 1
  /// log2 of the chunk plaintext size.
  public static let chunkShift: UInt8 = 16
  /// Plaintext bytes per chunk (the final chunk may hold fewer, never zero).
  public static let chunkSize = 1 << 16
  /// Bytes of the cleartext outer header.
  public static let outerHeaderSize = 32
  /// Bytes of the encrypted inner header at the start of the plaintext stream.
  public static let innerHeaderSize = 64
  /// Bytes of ciphertext per full chunk (plaintext plus tag).
  public static let encryptedChunkSize = chunkSize + AEAD.tagSize

  static let outerMagic: [UInt8] = Array("ZDCF".utf8)
  static let innerMagic: [UInt8] = Array("ZDCCLOUD".utf8)
  static let noncePrefixSize = 16
  /// The largest plaintext stream handled (2^62 bytes), so that size arithmetic never overflows.
  public static let maxPlaintextSize: UInt64 = 1 << 62

  /// Size of the plaintext stream for the given section sizes, or `nil` on overflow.
  public static func plaintextSize(metadataSize: UInt64, thumbnailSize: UInt64, dataSize: UInt64)
    -> UInt64?
  {
    var total = UInt64(innerHeaderSize)
    for s in [metadataSize, thumbnailSize, dataSize] {
      let (sum, overflow) = total.addingReportingOverflow(s)
      if overflow { return nil }
      total = sum
    }
    return total <= maxPlaintextSize ? total : nil
  }

  /// Number of chunks holding a plaintext stream of `plaintextSize` bytes (at least 1).
  public static func chunkCount(plaintextSize: UInt64) -> UInt64 {
    plaintextSize == 0 ? 1 : (plaintextSize + UInt64(chunkSize) - 1) >> UInt64(chunkShift)
  }

  /// Total object size for a plaintext stream of `plaintextSize` bytes.
  public static func ciphertextSize(plaintextSize: UInt64) -> UInt64 {
    UInt64(outerHeaderSize) + plaintextSize
      + chunkCount(plaintextSize: plaintextSize) * UInt64(AEAD.tagSize)
  }

  /// The plaintext stream size implied by a total object size, or `nil` if no valid object
  /// has that size.
  public static func plaintextSize(ciphertextSize total: UInt64) -> UInt64? {
    let minimum = UInt64(outerHeaderSize + innerHeaderSize + AEAD.tagSize)
    guard total >= minimum, total <= ciphertextSize(plaintextSize: maxPlaintextSize) else {
      return nil
    }
    let body = total - UInt64(outerHeaderSize)
    let full = body / UInt64(encryptedChunkSize)
    let rem = body % UInt64(encryptedChunkSize)
    if rem == 0 { return full * UInt64(chunkSize) }
    guard rem > UInt64(AEAD.tagSize) else { return nil }
    return full * UInt64(chunkSize) + rem - UInt64(AEAD.tagSize)
  }

  /// The chunks holding a range of the plaintext stream (empty for an empty range).
  public static func chunks(forPlaintext range: ByteRange) -> Range<UInt64> {
    guard range.count > 0 else { return 0..<0 }
    let shift = UInt64(chunkShift)
    return (range.lowerBound >> shift)..<((range.upperBound - 1) >> shift + 1)
  }

  /// The plaintext range of the stream that a run of chunks holds.
  public static func plaintextRange(forChunks chunks: Range<UInt64>, plaintextSize: UInt64)
    -> ByteRange
  {
    let shift = UInt64(chunkShift)
    let lo = min(chunks.lowerBound << shift, plaintextSize)
    let hi = min(chunks.upperBound << shift, plaintextSize)
    return ByteRange(lo, max(lo, hi))
  }

  /// The object bytes holding a run of chunks (the final chunk is shorter).
  public static func ciphertextRange(forChunks chunks: Range<UInt64>, plaintextSize: UInt64)
    -> ByteRange
  {
    let total = ciphertextSize(plaintextSize: plaintextSize)
    let e = UInt64(encryptedChunkSize)
    let lo = min(UInt64(outerHeaderSize) + chunks.lowerBound * e, total)
    let hi = min(UInt64(outerHeaderSize) + chunks.upperBound * e, total)
    return ByteRange(lo, max(lo, hi))
  }

  /// The object bytes to fetch to decrypt a range of the plaintext stream.
  public static func ciphertextRange(forPlaintext range: ByteRange, plaintextSize: UInt64)
    -> ByteRange
  {
    ciphertextRange(forChunks: chunks(forPlaintext: range), plaintextSize: plaintextSize)
  }
}

/// One of the three plaintext sections of a CloudFile.
public enum CloudFileSection: String, Sendable, Hashable, CaseIterable {
  /// Application metadata (shown as `.meta` / `user.zdc.meta`).
  case metadata
  /// A thumbnail (shown as `.thumb` / `user.zdc.thumb`).
  case thumbnail
  /// The content.
  case data
}

/// The sizes of a CloudFile's sections, as declared in its inner header.
public struct CloudFileSizes: Sendable, Hashable {
  /// Metadata section size in bytes.
  public var metadataSize: UInt64
  /// Thumbnail section size in bytes.
  public var thumbnailSize: UInt64
  /// Data section size in bytes.
  public var dataSize: UInt64

  public init(metadataSize: UInt64, thumbnailSize: UInt64, dataSize: UInt64) {
    self.metadataSize = metadataSize
    self.thumbnailSize = thumbnailSize
    self.dataSize = dataSize
  }

  /// The size of one section.
  public func size(of section: CloudFileSection) -> UInt64 {
    switch section {
    case .metadata: return metadataSize
    case .thumbnail: return thumbnailSize
    case .data: return dataSize
    }
  }

  /// Where a section lies in the plaintext stream (the sizes must not overflow).
  public func streamRange(of section: CloudFileSection) -> ByteRange {
    let h = UInt64(CloudFileFormat.innerHeaderSize)
    switch section {
    case .metadata: return ByteRange(h, h + metadataSize)
    case .thumbnail: return ByteRange(h + metadataSize, h + metadataSize + thumbnailSize)
    case .data:
      let lo = h + metadataSize + thumbnailSize
      return ByteRange(lo, lo + dataSize)
    }
  }

  /// The 64-byte inner header declaring these sizes.
  func innerHeader() -> Data {
    var d = Data(count: CloudFileFormat.innerHeaderSize)
    d.withUnsafeMutableBytes { p in
      p.copyBytes(from: CloudFileFormat.innerMagic)
      LE.store(UInt32(CloudFileFormat.version), p, at: 8)
      LE.store(metadataSize, p, at: 16)
      LE.store(thumbnailSize, p, at: 24)
      LE.store(dataSize, p, at: 32)
    }
    return d
  }

  /// Parses an inner header.
  static func parse(innerHeader p: UnsafeRawBufferPointer) throws -> CloudFileSizes {
    guard p.count >= CloudFileFormat.innerHeaderSize else {
      throw CryptoError.truncated("CloudFile inner header")
    }
    guard p[0..<8].elementsEqual(CloudFileFormat.innerMagic) else {
      throw CryptoError.malformed("CloudFile inner magic")
    }
    let version = LE.load(p, at: 8, as: UInt32.self)
    guard version == UInt32(CloudFileFormat.version) else {
      throw CryptoError.unsupportedVersion(Int(version))
    }
    guard LE.load(p, at: 12, as: UInt32.self) == 0, p[40..<64].allSatisfy({ $0 == 0 }) else {
      throw CryptoError.malformed("CloudFile inner header reserved bytes")
    }
    return CloudFileSizes(
      metadataSize: LE.load(p, at: 16, as: UInt64.self),
      thumbnailSize: LE.load(p, at: 24, as: UInt64.self),
      dataSize: LE.load(p, at: 32, as: UInt64.self))
  }
}

/// Where the data section of a CloudFile comes from while encoding.
public enum CloudFileSource {
  /// Bytes in memory.
  case data(Data)
  /// A cleartext file, read sequentially.
  case file(URL)
  /// Exactly `size` bytes from a reader that fills the start of the buffer it is given and
  /// returns how many bytes it wrote (0 only at the end).
  case reader(size: UInt64, read: (UnsafeMutableRawBufferPointer) throws -> Int)
}

/// Per-chunk AEAD state shared by the CloudFile encoder and reader: nonce and AD buffers.
struct CloudChunkCipher {
  let key: Data
  /// nonce prefix (16) ‖ u64 LE chunk index.
  var nonce = [UInt8](repeating: 0, count: AEAD.nonceSize)
  /// outer header (32) ‖ last flag.
  var ad = [UInt8](repeating: 0, count: CloudFileFormat.outerHeaderSize + 1)

  init(key: Data, outerHeader: UnsafeRawBufferPointer) {
    self.key = key
    nonce.withUnsafeMutableBytes { n in
      n.copyMemory(from: UnsafeRawBufferPointer(rebasing: outerHeader[8..<24]))
    }
    ad.withUnsafeMutableBytes { a in
      a.copyMemory(from: UnsafeRawBufferPointer(rebasing: outerHeader[0..<32]))
    }
  }

  mutating func set(index: UInt64, last: Bool) {
    nonce.withUnsafeMutableBytes { LE.store(index, $0, at: 16) }
    ad[CloudFileFormat.outerHeaderSize] = last ? 1 : 0
  }

  mutating func seal(
    _ plaintext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, index: UInt64,
    last: Bool
  ) throws -> Int {
    set(index: index, last: last)
    return try nonce.withUnsafeBytes { n in
      try ad.withUnsafeBytes { a in
        try key.withUnsafeBytes { k in
          try AEAD.seal(plaintext, into: out, nonce: n, associatedData: a, key: k)
        }
      }
    }
  }

  mutating func open(
    _ ciphertext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, index: UInt64,
    last: Bool
  ) throws -> Int {
    set(index: index, last: last)
    do {
      return try nonce.withUnsafeBytes { n in
        try ad.withUnsafeBytes { a in
          try key.withUnsafeBytes { k in
            try AEAD.open(ciphertext, into: out, nonce: n, associatedData: a, key: k)
          }
        }
      }
    } catch CryptoError.authenticationFailed {
      throw CryptoError.authenticationFailed("CloudFile chunk \(index)")
    }
  }

  static func outerHeader(noncePrefix: Data) -> Data {
    var h = Data(count: CloudFileFormat.outerHeaderSize)
    h.withUnsafeMutableBytes { p in
      p.copyBytes(from: CloudFileFormat.outerMagic)
      p[4] = CloudFileFormat.version
      p[5] = CloudFileFormat.chunkShift
      noncePrefix.withUnsafeBytes { n in
        UnsafeMutableRawBufferPointer(rebasing: p[8..<24]).copyMemory(from: n)
      }
    }
    return h
  }
}

/// Encrypts a node's content into a CloudFile v1 object, one chunk at a time.
public struct CloudFileEncoder: Sendable {
  let key: Data
  let fixedNoncePrefix: Data?

  /// An encoder for a node key (32 bytes). Each `encode` call uses a fresh random nonce prefix.
  public init(key: Data) throws {
    try self.init(key: key, fixedNoncePrefix: nil)
  }

  /// For test vectors only: every `encode` uses `noncePrefix`, so never encode twice with it.
  init(key: Data, noncePrefix: Data) throws {
    precondition(noncePrefix.count == CloudFileFormat.noncePrefixSize)
    try self.init(key: key, fixedNoncePrefix: noncePrefix)
  }

  private init(key: Data, fixedNoncePrefix: Data?) throws {
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("node key must be 32 bytes")
    }
    self.key = key
    self.fixedNoncePrefix = fixedNoncePrefix
  }

  /// Total object size for the given section sizes (sizes whose sum exceeds
  /// `CloudFileFormat.maxPlaintextSize` cannot be encoded).
  public static func encodedSize(metadataSize: UInt64, thumbnailSize: UInt64, dataSize: UInt64)
    -> UInt64
  {
    let p =
      CloudFileFormat.plaintextSize(
        metadataSize: metadataSize, thumbnailSize: thumbnailSize, dataSize: dataSize)
      ?? CloudFileFormat.maxPlaintextSize + 1
    return CloudFileFormat.ciphertextSize(plaintextSize: p)
  }

  /// Encodes the object, handing its bytes in order to `sink` (the outer header, then one
  /// encrypted chunk per call). Memory use is constant.
  public func encode(
    metadata: Data = Data(), thumbnail: Data = Data(), data source: CloudFileSource,
    to sink: (Data) throws -> Void
  ) throws {
    switch source {
    case .data(let d):
      var offset = 0
      try encode(metadata: metadata, thumbnail: thumbnail, dataSize: UInt64(d.count), sink: sink) {
        buf in
        let n = min(buf.count, d.count - offset)
        d.withUnsafeBytes { src in
          buf.copyMemory(from: UnsafeRawBufferPointer(rebasing: src[offset..<(offset + n)]))
        }
        offset += n
        return n
      }
    case .file(let url):
      let fd = try POSIXIO.open(url.path, O_RDONLY)
      defer { Glibc.close(fd) }
      let size = try POSIXIO.size(fd)
      try encode(metadata: metadata, thumbnail: thumbnail, dataSize: size, sink: sink) { buf in
        try POSIXIO.read(fd, buf)
      }
    case .reader(let size, let read):
      try encode(metadata: metadata, thumbnail: thumbnail, dataSize: size, sink: sink, read: read)
    }
  }

  /// Encodes the object into a file (created or truncated, mode 0600). `pace` runs before each
  /// piece (the outer header, then each encrypted chunk) is written: a caller that spreads the
  /// work out waits there, and an error it throws ends the encoding.
  public func encode(
    metadata: Data = Data(), thumbnail: Data = Data(), data source: CloudFileSource,
    toFileAt url: URL, pace: () throws -> Void = {}
  ) throws {
    let fd = try POSIXIO.open(url.path, O_WRONLY | O_CREAT | O_TRUNC)
    defer { Glibc.close(fd) }
    do {
      try encode(metadata: metadata, thumbnail: thumbnail, data: source) { chunk in
        try pace()
        try chunk.withUnsafeBytes { try POSIXIO.write(fd, $0) }
      }
    } catch {
      unlink(url.path)  // never leave a partial object behind
      throw error
    }
  }

  private func encode(
    metadata: Data, thumbnail: Data, dataSize: UInt64, sink: (Data) throws -> Void,
    read: (UnsafeMutableRawBufferPointer) throws -> Int
  ) throws {
    let sizes = CloudFileSizes(
      metadataSize: UInt64(metadata.count), thumbnailSize: UInt64(thumbnail.count),
      dataSize: dataSize)
    guard
      let total = CloudFileFormat.plaintextSize(
        metadataSize: sizes.metadataSize, thumbnailSize: sizes.thumbnailSize, dataSize: dataSize)
    else { throw CryptoError.malformed("CloudFile sections too large") }
    let prefix = fixedNoncePrefix ?? SecureRandom.bytes(CloudFileFormat.noncePrefixSize)
    let header = CloudChunkCipher.outerHeader(noncePrefix: prefix)
    var cipher = header.withUnsafeBytes { CloudChunkCipher(key: key, outerHeader: $0) }
    try sink(header)

    let chunkSize = CloudFileFormat.chunkSize
    let chunkCount = CloudFileFormat.chunkCount(plaintextSize: total)
    let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 16)
    defer {
      sodium_memzero(plain.baseAddress, chunkSize)
      plain.deallocate()
    }
    var out = Data(count: CloudFileFormat.encryptedChunkSize)
    var fill = 0
    var index: UInt64 = 0

    func flush() throws {
      let last = index == chunkCount - 1
      let n = try out.withUnsafeMutableBytes { o in
        try cipher.seal(
          UnsafeRawBufferPointer(rebasing: plain[0..<fill]), into: o, index: index, last: last)
      }
      try sink(n == out.count ? out : out.prefix(n))
      index += 1
      fill = 0
    }

    func append(_ bytes: Data) throws {
      try bytes.withUnsafeBytes { src in
        var pos = 0
        while pos < src.count {
          let n = min(chunkSize - fill, src.count - pos)
          UnsafeMutableRawBufferPointer(rebasing: plain[fill..<(fill + n)])
            .copyMemory(from: UnsafeRawBufferPointer(rebasing: src[pos..<(pos + n)]))
          fill += n
          pos += n
          if fill == chunkSize { try flush() }
        }
      }
    }

    try append(sizes.innerHeader())
    try append(metadata)
    try append(thumbnail)
    var remaining = dataSize
    while remaining > 0 {
      let want = min(UInt64(chunkSize - fill), remaining)
      let n = try read(UnsafeMutableRawBufferPointer(rebasing: plain[fill..<(fill + Int(want))]))
      guard n > 0 else { throw CryptoError.truncated("data source ended \(remaining) bytes early") }
      guard UInt64(n) <= want else { throw CryptoError.failed("data source overfilled its buffer") }
      fill += n
      remaining -= UInt64(n)
      if fill == chunkSize { try flush() }
    }
    var probe: UInt8 = 0
    let extra = try withUnsafeMutableBytes(of: &probe) { try read($0) }
    guard extra == 0 else { throw CryptoError.malformed("data source longer than declared") }
    if fill > 0 { try flush() }
    precondition(index == chunkCount, "CloudFile chunk accounting")
  }
}

/// Reads any byte range of any section of a CloudFile v1 object, fetching only the chunks it
/// needs through a caller-supplied range fetch.
public final class CloudFileReader: Sendable {
  /// The section sizes declared (and authenticated) in the inner header.
  public let sizes: CloudFileSizes
  /// The object's total size.
  public let ciphertextSize: UInt64
  /// The plaintext stream size.
  public let plaintextSize: UInt64
  /// The number of chunks.
  public let chunkCount: UInt64

  let key: Data
  let header: Data
  let chunk0: Data
  let fetch: @Sendable (ByteRange) throws -> Data

  /// Fetches the outer header and chunk 0, authenticates them and checks that the declared
  /// section sizes match `ciphertextSize`.
  public init(
    key: Data, ciphertextSize: UInt64, fetch: @escaping @Sendable (ByteRange) throws -> Data
  ) throws {
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("node key must be 32 bytes")
    }
    guard let plaintextSize = CloudFileFormat.plaintextSize(ciphertextSize: ciphertextSize) else {
      throw CryptoError.truncated("CloudFile of \(ciphertextSize) bytes cannot be valid")
    }
    self.key = key
    self.fetch = fetch
    self.ciphertextSize = ciphertextSize
    self.plaintextSize = plaintextSize
    chunkCount = CloudFileFormat.chunkCount(plaintextSize: plaintextSize)
    let first = CloudFileFormat.ciphertextRange(forChunks: 0..<1, plaintextSize: plaintextSize)
    let bytes = try fetch(ByteRange(0, first.upperBound))
    guard bytes.count == Int(first.upperBound) else {
      throw CryptoError.truncated("CloudFile fetch returned \(bytes.count) bytes")
    }
    let header = Data(bytes.prefix(CloudFileFormat.outerHeaderSize))
    try header.withUnsafeBytes { h in
      guard h[0..<4].elementsEqual(CloudFileFormat.outerMagic) else {
        throw CryptoError.malformed("CloudFile magic")
      }
      guard h[4] == CloudFileFormat.version else { throw CryptoError.unsupportedVersion(Int(h[4])) }
      guard h[5] == CloudFileFormat.chunkShift else {
        throw CryptoError.malformed("CloudFile chunk shift \(h[5])")
      }
      guard h[6] == 0, h[7] == 0, h[24..<32].allSatisfy({ $0 == 0 }) else {
        throw CryptoError.malformed("CloudFile header reserved bytes")
      }
    }
    self.header = header
    var cipher = header.withUnsafeBytes { CloudChunkCipher(key: key, outerHeader: $0) }
    let plainCount = Int(min(plaintextSize, UInt64(CloudFileFormat.chunkSize)))
    var chunk0 = Data(count: plainCount)
    let lastIsZero = chunkCount == 1
    try chunk0.withUnsafeMutableBytes { o in
      try bytes.withUnsafeBytes { b in
        _ = try cipher.open(
          UnsafeRawBufferPointer(rebasing: b[CloudFileFormat.outerHeaderSize...]), into: o,
          index: 0, last: lastIsZero)
      }
    }
    self.chunk0 = chunk0
    let sizes = try chunk0.withUnsafeBytes { try CloudFileSizes.parse(innerHeader: $0) }
    guard
      let declared = CloudFileFormat.plaintextSize(
        metadataSize: sizes.metadataSize, thumbnailSize: sizes.thumbnailSize,
        dataSize: sizes.dataSize)
    else { throw CryptoError.malformed("CloudFile section sizes overflow") }
    if declared > plaintextSize {
      throw CryptoError.truncated("CloudFile is \(ciphertextSize) bytes, header wants more")
    }
    if declared < plaintextSize {
      throw CryptoError.malformed("CloudFile is \(ciphertextSize) bytes, header wants fewer")
    }
    self.sizes = sizes
  }

  /// Decrypts the chunks holding `streamRange` of the plaintext stream (fetching them in one
  /// call, except chunk 0 which is kept from `init`) and hands each chunk's plaintext, with
  /// its stream offset, to `body`.
  func forEachChunk(
    covering streamRange: ByteRange,
    _ body: (UInt64, UnsafeRawBufferPointer) throws -> Void
  ) throws {
    var chunks = CloudFileFormat.chunks(forPlaintext: streamRange)
    guard !chunks.isEmpty else { return }
    if chunks.lowerBound == 0 {
      try chunk0.withUnsafeBytes { try body(0, $0) }
      chunks = 1..<chunks.upperBound
      if chunks.isEmpty { return }
    }
    let range = CloudFileFormat.ciphertextRange(forChunks: chunks, plaintextSize: plaintextSize)
    let bytes = try fetch(range)
    guard UInt64(bytes.count) == range.count else {
      throw CryptoError.truncated("CloudFile fetch of \(range) returned \(bytes.count) bytes")
    }
    var cipher = header.withUnsafeBytes { CloudChunkCipher(key: key, outerHeader: $0) }
    let plain = UnsafeMutableRawBufferPointer.allocate(
      byteCount: CloudFileFormat.chunkSize, alignment: 16)
    defer {
      sodium_memzero(plain.baseAddress, plain.count)
      plain.deallocate()
    }
    try bytes.withUnsafeBytes { b in
      var pos = 0
      for index in chunks {
        let n = min(CloudFileFormat.encryptedChunkSize, b.count - pos)
        let got = try cipher.open(
          UnsafeRawBufferPointer(rebasing: b[pos..<(pos + n)]), into: plain, index: index,
          last: index == chunkCount - 1)
        try body(
          index << UInt64(CloudFileFormat.chunkShift),
          UnsafeRawBufferPointer(rebasing: plain[0..<got]))
        pos += n
      }
    }
  }

  /// Decrypts bytes `range` of `section` (clamped to the section's end, like a file read).
  public func read(_ section: CloudFileSection, range: ByteRange) throws -> Data {
    let s = sizes.streamRange(of: section)
    let lo = s.lowerBound + min(range.lowerBound, s.count)
    let hi = s.lowerBound + min(range.upperBound, s.count)
    guard hi > lo else { return Data() }
    let want = ByteRange(lo, hi)
    var out = Data(count: Int(want.count))
    try out.withUnsafeMutableBytes { o in
      try forEachChunk(covering: want) { start, chunk in
        let a = max(start, lo)
        let b = min(start + UInt64(chunk.count), hi)
        guard b > a else { return }
        UnsafeMutableRawBufferPointer(rebasing: o[Int(a - lo)..<Int(b - lo)])
          .copyMemory(
            from: UnsafeRawBufferPointer(rebasing: chunk[Int(a - start)..<Int(b - start)]))
      }
    }
    return out
  }

  /// Decrypts a whole section.
  public func read(_ section: CloudFileSection) throws -> Data {
    try read(section, range: ByteRange(0, sizes.size(of: section)))
  }

  /// Decrypts a whole section in order, handing it to `sink` in pieces of at most one chunk;
  /// fetches `chunksPerFetch` chunks at a time.
  public func stream(
    _ section: CloudFileSection, chunksPerFetch: Int = 16, to sink: (Data) throws -> Void
  ) throws {
    let s = sizes.streamRange(of: section)
    guard s.count > 0 else { return }
    let step = UInt64(max(1, chunksPerFetch)) << UInt64(CloudFileFormat.chunkShift)
    var pos = s.lowerBound
    while pos < s.upperBound {
      // Align each batch to chunk boundaries so no chunk is fetched twice.
      let batchEnd = min(((pos >> UInt64(CloudFileFormat.chunkShift)) << 16) + step, s.upperBound)
      try forEachChunk(covering: ByteRange(pos, batchEnd)) { start, chunk in
        let a = max(start, pos)
        let b = min(start + UInt64(chunk.count), batchEnd)
        guard b > a else { return }
        try sink(Data(UnsafeRawBufferPointer(rebasing: chunk[Int(a - start)..<Int(b - start)])))
      }
      pos = batchEnd
    }
  }
}
