import CLinux
import CSodium
public import Foundation
import Glibc
import Synchronization
import ZDCCore

/// A local encrypted file (cache and write-back staging) that reads and writes like a plain
/// file: CryptoFile v1.
///
/// The plaintext is split into chunks of a size fixed per file (``chunkShift``, recorded in its
/// header: 4 KiB to 64 KiB; new files get ``defaultChunkShift``), each stored in a fixed-size
/// slot with its own fresh random nonce, authenticated with the file's random ID, its index and
/// whether it is the last chunk. The cipher is also fixed per file (``Cipher``, in the header):
/// new files use AES-256-GCM under a key derived for the file where the processor has AES
/// instructions, XChaCha20-Poly1305 under the cache key elsewhere. Only the chunks an operation
/// touches are re-encrypted, and a one-chunk write-back buffer makes small sequential writes
/// encrypt each chunk once.
///
/// A non-final slot that is all zero bytes (a filesystem hole) reads as a chunk of zeros, so
/// extending a file or writing sparsely never encrypts the gap. As a consequence, someone who
/// can write the cache file can zero a chunk undetected: the local cache does not defend
/// against a local attacker with write access (the store format has no such allowance).
///
/// Changes reach the disk on `sync()` or `close()` (or when the buffer moves to another chunk);
/// a file left mid-update by a crash fails authentication rather than returning wrong bytes.
///
/// Thread-safe. Reads run concurrently with one another (each decrypts whole chunks straight
/// into the caller's buffer, the one-chunk buffer serving only partial chunks); writes, size
/// changes and closing wait for them and exclude everything else.
public final class CryptoFile: @unchecked Sendable {
  // @unchecked: mutable state is guarded by `lock`. `gate` is held shared by reads and
  // exclusively by every operation that writes the file or closes it, so that while a read
  // holds it the file on disk is current (reads flush a dirty buffer first) and `fd` stays
  // open: reads then decrypt whole chunks without `lock`.

  /// The format version.
  public static let version: UInt8 = 1
  /// The chunk shifts (log2 of the chunk size) a file may have: 4 KiB to 64 KiB chunks.
  public static let chunkShifts: ClosedRange<UInt8> = 12...16
  /// The chunk shift of new files: 4 KiB chunks.
  public static let defaultChunkShift: UInt8 = 12
  /// Plaintext bytes per chunk of new files.
  public static let defaultChunkSize = 1 << Int(defaultChunkShift)
  /// The largest chunk any file has (plaintext bytes).
  public static let maxChunkSize = 1 << Int(chunkShifts.upperBound)
  /// Bytes of the cleartext header.
  public static let headerSize = 32
  /// Bytes a slot adds to its chunk: nonce (24) and tag (16). AES-256-GCM uses the first 12
  /// bytes of the nonce field (the rest are random too): both ciphers share one layout.
  public static let slotOverhead = AEAD.nonceSize + AEAD.tagSize

  /// The authenticated cipher of a file's slots (header byte 10).
  public enum Cipher: UInt8, Sendable, CaseIterable {
    /// XChaCha20-Poly1305 under the cache key, 24-byte nonces.
    case xchacha20poly1305 = 0
    /// AES-256-GCM under a key derived from the cache key and the file's ID (keyed BLAKE2b),
    /// 12-byte nonces: random 96-bit nonces stay far from a collision within one file's writes.
    case aes256gcm = 1
  }

  /// The cipher of new files: AES-256-GCM where the processor has AES and carry-less multiply
  /// instructions (several times the speed of XChaCha20-Poly1305 there), else
  /// XChaCha20-Poly1305 (faster than AES in software). Files of either cipher open everywhere.
  public static let defaultCipher: Cipher =
    AESGCMKey.isHardwareAccelerated ? .aes256gcm : .xchacha20poly1305
  static let magic: [UInt8] = Array("ZDCCRYPT".utf8)
  static let fileIDSize = 16

  /// log2 of this file's chunk size.
  public let chunkShift: UInt8
  /// This file's cipher.
  public let cipher: Cipher
  /// The file's AES-256-GCM key, expanded (AES-256-GCM files only).
  private let aes: AESGCMKey?
  /// The largest physical size this file may reach (see `FileSizeLimit`).
  private let maxPhysicalSize: UInt64
  /// Plaintext bytes per chunk of this file.
  public var chunkSize: Int { layout.chunkSize }
  /// Bytes of a full slot of this file: nonce ‖ ciphertext of a chunk ‖ tag.
  public var slotSize: Int { layout.slotSize }
  let layout: ChunkLayout

  private let lock = NSLock()
  private let gate: UnsafeMutablePointer<pthread_rwlock_t>
  private var fd: Int32
  private let key: Data
  private let fileID: [UInt8]
  private var plaintextSize: UInt64
  private var physicalSize: UInt64
  /// Plaintext of the buffered chunk (room for the largest chunk); bytes from `bufferLength`
  /// on are zero.
  private let buffer: UnsafeMutableRawBufferPointer
  private var bufferIndex: UInt64?
  private var bufferLength = 0
  /// Bytes of `buffer` that may be non-zero; from here on it is zero (most files are small:
  /// clearing the buffer then costs what they used, not a whole chunk).
  private var bufferExtent = 0
  private var bufferDirty = false
  /// Scratch space for one slot of the largest chunk (with room for the header before it, see
  /// `open`); between reads of a slot it holds the run.
  private let slot: UnsafeMutableRawBufferPointer
  /// The run: sealed slots of consecutive chunks from `runStart`, at the start of `slot`, not
  /// written yet (`runBytes` bytes; its last slot may be the file's last). Written with one
  /// call when it is full, when a chunk that does not continue it is sealed, and before
  /// anything reads or writes the file otherwise: small writes then cost a write call per
  /// `slot`'s worth of slots, not per chunk.
  private var runStart: UInt64 = 0
  private var runCount = 0
  private var runBytes = 0
  /// Slots the run holds at most.
  private let runCapacity: Int
  /// Number of chunk encryptions so far (for tests of the write-back buffer).
  private(set) var chunkEncryptions = 0
  /// Number of writes of slots to the file so far (for tests of the run).
  private(set) var slotWrites = 0
  /// Told before each change of the file (see ``guardWrites(with:)``).
  private var writeGuard: CopyBeforeWrite?

  /// `slot` must hold `headerSize + maxSlotSize` bytes; the file takes ownership of it.
  private init(
    fd: Int32, key: Data, fileID: [UInt8], layout: ChunkLayout, plaintextSize: UInt64,
    physicalSize: UInt64, slot: UnsafeMutableRawBufferPointer, cipher: Cipher, aes: AESGCMKey?,
    maxPhysicalSize: UInt64
  ) {
    self.maxPhysicalSize = maxPhysicalSize
    self.cipher = cipher
    self.aes = aes
    self.layout = layout
    chunkShift = layout.shift
    self.fd = fd
    self.key = key
    self.fileID = fileID
    self.plaintextSize = plaintextSize
    self.physicalSize = physicalSize
    // An anonymous mapping: zero pages that cost nothing until touched, and that leave the
    // process (plaintext included) when unmapped — no 64 KiB memset at either end; after that,
    // `bufferExtent` says how much must be cleared to make it zero again.
    // Buffers of closed files are reused (zeroed): mapping and unmapping one per file cost
    // page faults and TLB shootdowns that dominated opening a small file.
    let base =
      BlockPool.chunkBuffers.take()
      ?? mmap(nil, Self.maxChunkSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if let base, base != MAP_FAILED {
      buffer = UnsafeMutableRawBufferPointer(start: base, count: Self.maxChunkSize)
      bufferIsMapped = true
    } else {
      buffer = .allocate(byteCount: Self.maxChunkSize, alignment: 16)
      buffer.initializeMemory(as: UInt8.self, repeating: 0)
      bufferIsMapped = false
    }
    self.slot = slot
    runCapacity = max(1, (slot.count - Self.headerSize) / layout.slotSize)
    gate = .allocate(capacity: 1)
    var attr = pthread_rwlockattr_t()
    pthread_rwlockattr_init(&attr)
    // A steady stream of reads must not starve a writer.
    pthread_rwlockattr_setkind_np(&attr, Int32(PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP))
    pthread_rwlock_init(gate, &attr)
    pthread_rwlockattr_destroy(&attr)
  }

  deinit {
    if fd >= 0 {
      try? flush()
      Glibc.close(fd)
    }
    if bufferIsMapped {
      zeroBuffer()
      #if DEBUG
        // Tests check that a file's buffer really is all zero when it is handed on.
        precondition(!buffer.contains { $0 != 0 }, "a CryptoFile buffer was not cleared")
      #endif
      if !BlockPool.chunkBuffers.give(buffer.baseAddress!) {
        munmap(buffer.baseAddress, buffer.count)
      }
    } else {
      sodium_memzero(buffer.baseAddress, buffer.count)
      buffer.deallocate()
    }
    Self.releaseSlotScratch(slot)
    pthread_rwlock_destroy(gate)
    gate.deallocate()
  }

  private let bufferIsMapped: Bool

  /// Makes the whole buffer zero again (clearing only what was used).
  private func zeroBuffer() {
    if bufferExtent > 0 {
      UnsafeMutableRawBufferPointer(rebasing: buffer[0..<bufferExtent])
        .initializeMemory(as: UInt8.self, repeating: 0)
    }
    bufferExtent = 0
  }

  /// Scratch space for a slot, reused from a closed file when one is free (freeing a block of
  /// this size made malloc consolidate its free lists every time). It only ever holds
  /// ciphertext and headers.
  static func allocateSlotScratch() -> UnsafeMutableRawBufferPointer {
    let count = headerSize + maxChunkSize + slotOverhead
    if let p = BlockPool.slotScratch.take() {
      return UnsafeMutableRawBufferPointer(start: p, count: count)
    }
    return .allocate(byteCount: count, alignment: 16)
  }

  static func releaseSlotScratch(_ slot: UnsafeMutableRawBufferPointer) {
    if !BlockPool.slotScratch.give(slot.baseAddress!) { slot.deallocate() }
  }

  /// Runs `body` holding `gate` exclusively, then `lock`.
  private func exclusive<T>(_ body: () throws -> T) rethrows -> T {
    pthread_rwlock_wrlock(gate)
    defer { pthread_rwlock_unlock(gate) }
    lock.lock()
    defer { lock.unlock() }
    return try body()
  }

  // MARK: Layout arithmetic

  /// Bytes of a full slot of a file whose chunk shift is `chunkShift`.
  public static func slotSize(chunkShift: UInt8 = defaultChunkShift) -> Int {
    (1 << Int(chunkShift)) + slotOverhead
  }

  /// The physical file size holding `size` plaintext bytes in chunks of `1 << chunkShift` bytes.
  public static func physicalSize(plaintextSize size: UInt64, chunkShift: UInt8 = defaultChunkShift)
    -> UInt64
  {
    ChunkLayout(shift: chunkShift).physicalSize(plaintextSize: size)
  }

  /// The plaintext size of a physical file of `physical` bytes whose chunk shift is
  /// `chunkShift`, or `nil` if no valid file has that size.
  public static func plaintextSize(
    physicalSize physical: UInt64, chunkShift: UInt8 = defaultChunkShift
  ) -> UInt64? {
    ChunkLayout(shift: chunkShift).plaintextSize(physicalSize: physical)
  }

  /// The plaintext size of the CryptoFile at `url`, from its header's chunk size and its
  /// physical size (nothing is decrypted).
  public static func plaintextSize(ofFileAt url: URL) throws -> UInt64 {
    try layout(ofFileAt: url).plaintextSize
  }

  /// The chunk shift and plaintext size of the CryptoFile at `url`, from its header and its
  /// physical size (nothing is decrypted).
  public static func layout(ofFileAt url: URL) throws -> (chunkShift: UInt8, plaintextSize: UInt64)
  {
    let fd = try POSIXIO.open(url.path, O_RDONLY)
    defer { Glibc.close(fd) }
    let physical = try POSIXIO.size(fd)
    let layout = try withUnsafeTemporaryAllocation(byteCount: headerSize, alignment: 8) { h in
      let got = try POSIXIO.pread(fd, h, 0)
      guard got == headerSize else { throw CryptoError.truncated("CryptoFile header") }
      return try checkHeader(UnsafeRawBufferPointer(h))
    }
    guard let size = layout.plaintextSize(physicalSize: physical) else {
      throw CryptoError.malformed("CryptoFile of \(physical) bytes cannot be valid")
    }
    return (layout.shift, size)
  }

  /// The layout a header (``headerSize`` bytes) declares, once its fields are checked.
  static func checkHeader(_ h: UnsafeRawBufferPointer) throws -> ChunkLayout {
    try checkHeaderFields(h).layout
  }

  /// The layout and cipher a header (``headerSize`` bytes) declares, once its fields are
  /// checked.
  static func checkHeaderFields(_ h: UnsafeRawBufferPointer) throws -> (
    layout: ChunkLayout, cipher: Cipher
  ) {
    guard h[0..<8].elementsEqual(magic) else { throw CryptoError.malformed("CryptoFile magic") }
    guard h[8] == version else { throw CryptoError.unsupportedVersion(Int(h[8])) }
    guard chunkShifts.contains(h[9]) else {
      throw CryptoError.malformed("CryptoFile chunk shift \(h[9])")
    }
    guard let cipher = Cipher(rawValue: h[10]) else {
      throw CryptoError.malformed("CryptoFile cipher \(h[10])")
    }
    guard h[11..<16].allSatisfy({ $0 == 0 }) else {
      throw CryptoError.malformed("CryptoFile header")
    }
    return (ChunkLayout(shift: h[9]), cipher)
  }

  /// The expanded AES-256-GCM key of the file `fileID` under `key` (nil for other ciphers).
  static func aesKey(_ cipher: Cipher, key: Data, fileID: some Collection<UInt8>) throws
    -> AESGCMKey?
  {
    guard cipher == .aes256gcm else { return nil }
    let derived = try AESGCMKey.derive(
      from: key, context: "zdc.cryptofile.v1|aes256gcm|", id: Array(fileID))
    return try derived.withUnsafeBytes { try AESGCMKey($0) }
  }

  // MARK: Opening

  /// Creates (or replaces) an empty CryptoFile, mode 0600, under a 32-byte key, with chunks of
  /// `1 << chunkShift` bytes (`chunkShift` in ``chunkShifts``).
  ///
  /// With `deferringFirstChunk`, only the header is written now: the (empty) last chunk that
  /// makes the file valid on disk is written by the first flush, sync or close, whatever was
  /// written before (for files made ahead of need that may never be used).
  public static func create(
    at url: URL, key: Data, chunkShift: UInt8 = defaultChunkShift,
    cipher: Cipher = defaultCipher, deferringFirstChunk: Bool = false
  ) throws -> CryptoFile {
    try create(
      path: url.path, key: key, chunkShift: chunkShift, cipher: cipher,
      deferringFirstChunk: deferringFirstChunk)
  }

  /// ``create(at:key:chunkShift:cipher:deferringFirstChunk:)`` at a file path.
  public static func create(
    path: String, key: Data, chunkShift: UInt8 = defaultChunkShift,
    cipher: Cipher = defaultCipher, deferringFirstChunk: Bool = false
  ) throws -> CryptoFile {
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("file key must be 32 bytes")
    }
    guard chunkShifts.contains(chunkShift) else {
      throw CryptoError.malformed("CryptoFile chunk shift \(chunkShift) is not supported")
    }
    let fileID = SecureRandom.bytes(fileIDSize)
    let aes = try aesKey(cipher, key: key, fileID: fileID)
    let fd = try POSIXIO.open(path, O_RDWR | O_CREAT | O_TRUNC)
    var header = Data(count: headerSize)
    header.withUnsafeMutableBytes { h in
      h.copyBytes(from: magic)
      h[8] = version
      h[9] = chunkShift
      h[10] = cipher.rawValue
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
      fd: fd, key: key, fileID: [UInt8](fileID), layout: ChunkLayout(shift: chunkShift),
      plaintextSize: 0, physicalSize: UInt64(headerSize), slot: allocateSlotScratch(),
      cipher: cipher, aes: aes, maxPhysicalSize: FileSizeLimit.largest(forFileAt: path))
    file.bufferIndex = 0
    file.bufferLength = 0
    file.bufferDirty = true
    if !deferringFirstChunk { try file.flush() }
    return file
  }

  /// Opens an existing CryptoFile; checks its header and authenticates its last chunk.
  public static func open(at url: URL, key: Data) throws -> CryptoFile {
    try open(path: url.path, key: key)
  }

  /// Opens an existing CryptoFile at a path; checks its header and authenticates its last
  /// chunk. A file of up to one slot of the largest chunk is read with one call.
  public static func open(path: String, key: Data) throws -> CryptoFile {
    guard key.count == AEAD.keySize else {
      throw CryptoError.invalidKey("file key must be 32 bytes")
    }
    let fd = try POSIXIO.open(path, O_RDWR)
    var scratch: UnsafeMutableRawBufferPointer? = allocateSlotScratch()
    defer { if let scratch { releaseSlotScratch(scratch) } }
    // Closed here until a CryptoFile owns it; from then on only the file closes it (a second
    // close could hit a descriptor another thread has just opened under the same number).
    var owned = false
    do {
      let buf = scratch!
      let physical = try POSIXIO.size(fd)
      // The header, and the whole slot too when it is the only one.
      let whole = physical <= UInt64(buf.count)
      let want = whole ? Int(physical) : headerSize
      let got = try POSIXIO.pread(fd, UnsafeMutableRawBufferPointer(rebasing: buf[0..<want]), 0)
      guard got >= headerSize else { throw CryptoError.truncated("CryptoFile header") }
      let h = UnsafeRawBufferPointer(rebasing: buf[0..<headerSize])
      let (layout, cipher) = try checkHeaderFields(h)
      let aes = try aesKey(cipher, key: key, fileID: h[16..<32])
      guard let size = layout.plaintextSize(physicalSize: physical) else {
        throw CryptoError.truncated("CryptoFile of \(physical) bytes cannot be valid")
      }
      let file = CryptoFile(
        fd: fd, key: key, fileID: [UInt8](h[16..<32]), layout: layout, plaintextSize: size,
        physicalSize: physical, slot: buf, cipher: cipher, aes: aes,
        maxPhysicalSize: FileSizeLimit.largest(forFileAt: path))
      scratch = nil  // owned by the file now
      owned = true
      let last = layout.lastIndex(size)
      if whole && got == want {
        let from = Int(layout.slotOffset(last))
        try file.takeChunk(last, slotAt: UnsafeRawBufferPointer(rebasing: buf[from..<want]))
      } else {
        try file.load(last, fresh: false)
      }
      return file
    } catch {
      if !owned { Glibc.close(fd) }
      throw error
    }
  }

  // MARK: Chunk buffer

  private func checkOpen() throws {
    guard fd >= 0 else { throw StoreError.io("CryptoFile is closed", errno: EBADF) }
  }

  /// fileID (16) ‖ u64 LE chunk index ‖ u8 last flag.
  private func withAD<T>(index: UInt64, last: Bool, _ body: (UnsafeRawBufferPointer) throws -> T)
    rethrows -> T
  {
    try withUnsafeTemporaryAllocation(byteCount: Self.fileIDSize + 9, alignment: 8) { ad in
      fileID.withUnsafeBytes { ad.copyMemory(from: $0) }
      LE.store(index, ad, at: Self.fileIDSize)
      ad[Self.fileIDSize + 8] = last ? 1 : 0
      return try body(UnsafeRawBufferPointer(ad))
    }
  }

  /// Writes the buffered chunk, if it changed, and the run to the file.
  private func flush() throws {
    try seal()
    try writeRun()
  }

  /// Encrypts the buffered chunk, if it changed, onto the run (the file's last chunk is
  /// written at once, with the run before it).
  private func seal() throws {
    guard bufferDirty, let index = bufferIndex else { return }
    if runCount > 0
      && (index != runStart + UInt64(runCount) || runCount == runCapacity
        || runBytes != runCount * layout.slotSize)
    {
      try writeRun()
    }
    let length = bufferLength
    let last = index == layout.lastIndex(plaintextSize)
    if runCount == 0 { runStart = index }
    let at = runBytes
    SecureRandom.fill(UnsafeMutableRawBufferPointer(rebasing: slot[at..<(at + AEAD.nonceSize)]))
    let nonce = UnsafeRawBufferPointer(rebasing: slot[at..<(at + AEAD.nonceSize)])
    let body = UnsafeMutableRawBufferPointer(
      rebasing: slot[(at + AEAD.nonceSize)..<(at + layout.slotSize)])
    try withAD(index: index, last: last) { a in
      try sealChunk(
        UnsafeRawBufferPointer(rebasing: buffer[0..<length]), into: body, nonce: nonce, ad: a)
    }
    chunkEncryptions += 1
    runCount += 1
    runBytes += Self.slotOverhead + length
    bufferDirty = false
    if last { try writeRun() }
  }

  /// Writes the run to the file (and cuts the file after it when it ends with the last chunk).
  /// A run that could not be written stays, to be written by the next attempt.
  private func writeRun() throws {
    guard runCount > 0 else { return }
    let endsFile = runStart + UInt64(runCount) - 1 == layout.lastIndex(plaintextSize)
    let offset = layout.slotOffset(runStart)
    try writeGuard?.willWrite(at: offset, count: runBytes)
    try POSIXIO.pwrite(fd, UnsafeRawBufferPointer(rebasing: slot[0..<runBytes]), offset)
    slotWrites += 1
    try wrote(runBytes, to: offset + UInt64(runBytes), endsFile: endsFile)
    runCount = 0
    runBytes = 0
  }

  /// Bytes written since the file's writeback was last started.
  private var unsubmitted = 0
  /// False while everything written through this object is on stable storage (after a
  /// ``sync()`` with no write since): a file opened here may hold what another writer left
  /// unflushed, so it starts true.
  private var unsynced = true
  /// How much is written before the file's writeback is started: the device writes a large
  /// file while it is being written, instead of all of it at the `fsync` that ends it.
  static let writebackStep = 8 << 20

  /// Records a write of slots ending at `end` (`count` bytes); cuts the file there when they
  /// end it.
  private func wrote(_ count: Int, to end: UInt64, endsFile: Bool) throws {
    unsynced = true
    unsubmitted += count
    if unsubmitted >= Self.writebackStep {
      unsubmitted = 0
      // Only a hint: a failure here is reported by the writes and syncs that follow.
      _ = zdc_start_writeback(fd)
    }
    if endsFile {
      if physicalSize > end {
        try writeGuard?.willTruncate(to: end)
        try POSIXIO.truncate(fd, end)
      }
      physicalSize = end
    } else {
      physicalSize = max(physicalSize, end)
    }
  }

  /// Whether the process may run on more than one CPU, read once: Foundation reads the cgroup's
  /// quota and CPU set from /sys (four system calls) at each `activeProcessorCount`.
  private static let severalProcessors = ProcessInfo.processInfo.activeProcessorCount > 1

  /// Seals whole chunks `chunks` (at most a scratch buffer's worth) of a file of `size` bytes from
  /// their plaintext `bytes` into their slots with one write; on two threads when there are
  /// several (encryption is most of a large write's cost). The caller holds the file
  /// exclusively; the buffer is not involved.
  private func writeWhole(_ bytes: UnsafeRawBufferPointer, chunks: Range<UInt64>, size: UInt64)
    throws
  {
    let last = layout.lastIndex(size)
    let scratch = ScratchPool.shared.take()
    defer { ScratchPool.shared.give(scratch) }
    let n = Int(chunks.count)
    // Two threads from 256 KiB on (below that, handing work over costs more than it saves).
    let workers =
      n << Int(layout.shift) >= 1 << 18 && Self.severalProcessors ? 2 : 1
    let job = SealJob(bytes: bytes, scratch: scratch)
    DispatchQueue.concurrentPerform(iterations: workers) { w in
      let mine = (w * n / workers)..<((w + 1) * n / workers)
      // The nonces of the worker's slots, with one call (a call per slot cost a sixth of the
      // encryption of 4 KiB chunks).
      let nonces = UnsafeMutableRawBufferPointer.allocate(
        byteCount: max(1, mine.count) * AEAD.nonceSize, alignment: 8)
      defer { nonces.deallocate() }
      SecureRandom.fill(nonces)
      for i in mine {
        let chunk = chunks.lowerBound + UInt64(i)
        let length = layout.chunkLength(chunk, size)
        let from = i << Int(layout.shift)
        let slotStart = i * layout.slotSize
        let out = UnsafeMutableRawBufferPointer(
          rebasing: job.scratch[slotStart..<(slotStart + Self.slotOverhead + length)])
        let nonce = (i - mine.lowerBound) * AEAD.nonceSize
        UnsafeMutableRawBufferPointer(rebasing: out[0..<AEAD.nonceSize])
          .copyMemory(
            from: UnsafeRawBufferPointer(rebasing: nonces[nonce..<(nonce + AEAD.nonceSize)]))
        do {
          try withAD(index: chunk, last: chunk == last) { a in
            try sealChunk(
              UnsafeRawBufferPointer(rebasing: job.bytes[from..<(from + length)]),
              into: UnsafeMutableRawBufferPointer(rebasing: out[AEAD.nonceSize...]),
              nonce: UnsafeRawBufferPointer(rebasing: out[0..<AEAD.nonceSize]), ad: a)
          }
        } catch {
          job.fail(error)
          return
        }
      }
    }
    if let error = job.error { throw error }
    chunkEncryptions += n
    // Slots sealed earlier first: they may hold older versions of these chunks.
    try writeRun()
    let tail = chunks.upperBound - 1
    let count = (n - 1) * layout.slotSize + Self.slotOverhead + layout.chunkLength(tail, size)
    let offset = layout.slotOffset(chunks.lowerBound)
    try writeGuard?.willWrite(at: offset, count: count)
    try POSIXIO.pwrite(fd, UnsafeRawBufferPointer(rebasing: scratch[0..<count]), offset)
    slotWrites += 1
    try wrote(count, to: offset + UInt64(count), endsFile: tail == last)
  }

  /// AES-256-GCM's nonce (the first 12 bytes of the slot's nonce field) and associated data:
  /// the chunk's (`ad`) followed by the nonce field's other 12 bytes, so that every byte of an
  /// AES-256-GCM slot is authenticated too.
  private func withAESAD<T>(
    _ ad: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> T
  ) rethrows -> T {
    let n = AESGCMKey.nonceSize
    let rest = nonce.count - n
    return try withUnsafeTemporaryAllocation(byteCount: ad.count + rest, alignment: 8) { a in
      UnsafeMutableRawBufferPointer(rebasing: a[0..<ad.count]).copyMemory(from: ad)
      UnsafeMutableRawBufferPointer(rebasing: a[ad.count...])
        .copyMemory(from: UnsafeRawBufferPointer(rebasing: nonce[n...]))
      return try body(
        UnsafeRawBufferPointer(a), UnsafeRawBufferPointer(rebasing: nonce[0..<n]))
    }
  }

  /// Encrypts a chunk into ciphertext ‖ tag with the file's cipher; `nonce` is the slot's
  /// 24-byte nonce field (AES-256-GCM takes its first 12 bytes). Touches no mutable state.
  private func sealChunk(
    _ plaintext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer,
    nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer
  ) throws {
    if let aes {
      _ = try withAESAD(ad, nonce: nonce) { a, n in
        try aes.seal(plaintext, into: out, nonce: n, associatedData: a)
      }
    } else {
      _ = try key.withUnsafeBytes { k in
        try AEAD.seal(plaintext, into: out, nonce: nonce, associatedData: ad, key: k)
      }
    }
  }

  /// Authenticates and decrypts ciphertext ‖ tag with the file's cipher (see `sealChunk`).
  private func openChunk(
    _ ciphertext: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer,
    nonce: UnsafeRawBufferPointer, ad: UnsafeRawBufferPointer
  ) throws {
    if let aes {
      _ = try withAESAD(ad, nonce: nonce) { a, n in
        try aes.open(ciphertext, into: out, nonce: n, associatedData: a)
      }
    } else {
      _ = try key.withUnsafeBytes { k in
        try AEAD.open(ciphertext, into: out, nonce: nonce, associatedData: ad, key: k)
      }
    }
  }

  /// Authenticates and decrypts the slot of chunk `index` (`slot` holds nonce ‖ ciphertext ‖
  /// tag of `length` plaintext bytes) into `out`; a hole (a non-final all-zero slot) gives
  /// zeros. Touches no mutable state.
  private func openSlot(
    _ slot: UnsafeRawBufferPointer, index: UInt64, length: Int, last: Bool,
    into out: UnsafeMutableRawBufferPointer
  ) throws {
    let count = Self.slotOverhead + length
    if !last, slot[0..<AEAD.nonceSize].allSatisfy({ $0 == 0 }),
      sodium_is_zero(slot.baseAddress!.assumingMemoryBound(to: UInt8.self), count) == 1
    {
      UnsafeMutableRawBufferPointer(rebasing: out[0..<length])
        .initializeMemory(as: UInt8.self, repeating: 0)
      return
    }
    do {
      try withAD(index: index, last: last) { a in
        try openChunk(
          UnsafeRawBufferPointer(rebasing: slot[AEAD.nonceSize..<count]),
          into: UnsafeMutableRawBufferPointer(rebasing: out[0..<length]),
          nonce: UnsafeRawBufferPointer(rebasing: slot[0..<AEAD.nonceSize]), ad: a)
      }
    } catch CryptoError.authenticationFailed {
      throw CryptoError.authenticationFailed("CryptoFile chunk \(index)")
    }
  }

  /// Makes chunk `index` the buffered chunk (sealing the previous one). A `fresh` chunk starts
  /// as zeros without reading the disk; otherwise its slot is read and authenticated.
  private func load(_ index: UInt64, fresh: Bool) throws {
    if bufferIndex == index { return }
    try seal()
    bufferIndex = nil
    if fresh {
      zeroBuffer()
      bufferLength = 0
      bufferIndex = index
      return
    }
    // The slot is read into `slot`, and may be in the run.
    try writeRun()
    let length = layout.chunkLength(index, plaintextSize)
    let count = Self.slotOverhead + length
    let got = try POSIXIO.pread(
      fd, UnsafeMutableRawBufferPointer(rebasing: slot[0..<count]), layout.slotOffset(index))
    guard got == count else { throw CryptoError.truncated("CryptoFile slot \(index)") }
    try takeChunk(index, slotAt: UnsafeRawBufferPointer(rebasing: slot[0..<count]))
  }

  /// Makes chunk `index` the buffered chunk from its slot bytes, already read (`slot` holds
  /// exactly its slot); the buffer holds nothing dirty.
  private func takeChunk(_ index: UInt64, slotAt slot: UnsafeRawBufferPointer) throws {
    let length = layout.chunkLength(index, plaintextSize)
    guard slot.count == Self.slotOverhead + length else {
      throw CryptoError.truncated("CryptoFile slot \(index)")
    }
    bufferIndex = nil
    defer { bufferExtent = max(bufferExtent, length) }
    try openSlot(
      slot, index: index, length: length, last: index == layout.lastIndex(plaintextSize),
      into: buffer)
    if length < bufferExtent {
      UnsafeMutableRawBufferPointer(rebasing: buffer[length..<bufferExtent])
        .initializeMemory(as: UInt8.self, repeating: 0)
      bufferExtent = length
    }
    bufferLength = length
    bufferIndex = index
  }

  /// Grows the file with zeros to `newSize` (> current size).
  /// Refuses a size whose slots the local file system (or the process's file size limit)
  /// cannot hold, before anything changes: a later write of the buffered last chunk would
  /// fail for good, and every operation after it.
  private func checkFits(_ newSize: UInt64) throws {
    guard newSize > plaintextSize else { return }
    let physical = layout.physicalSize(plaintextSize: newSize)
    guard physical <= maxPhysicalSize else {
      throw StoreError.io(
        "CryptoFile of \(newSize) bytes needs \(physical) on disk, more than the largest file "
          + "(\(maxPhysicalSize) bytes) the local file system holds",
        errno: EFBIG)
    }
  }

  private func extend(to newSize: UInt64) throws {
    let oldLast = layout.lastIndex(plaintextSize)
    let newLast = layout.lastIndex(newSize)
    try load(oldLast, fresh: false)
    plaintextSize = newSize
    bufferLength = layout.chunkLength(oldLast, newSize)
    bufferDirty = true
    if newLast > oldLast {
      // Chunks between stay holes; the new last chunk is zeros.
      try load(newLast, fresh: true)
      bufferLength = layout.chunkLength(newLast, newSize)
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
  ///
  /// Whole chunks are decrypted straight into `out`, outside the lock (other reads proceed
  /// meanwhile); a partial chunk goes through the one-chunk buffer, so that small sequential
  /// reads decrypt each chunk once.
  public func read(into out: UnsafeMutableRawBufferPointer, at offset: UInt64) throws -> Int {
    pthread_rwlock_rdlock(gate)
    defer { pthread_rwlock_unlock(gate) }
    let (fd, size, buffered) = try lock.withLock { () -> (Int32, UInt64, UInt64?) in
      try checkOpen()
      // Holding the gate shared, nothing else writes: with the buffer flushed, every slot on
      // disk is current until the read ends.
      try flush()
      return (self.fd, plaintextSize, bufferIndex)
    }
    guard offset < size, out.count > 0 else { return 0 }
    let end = min(size, offset + UInt64(out.count))
    let last = layout.lastIndex(size)
    var pos = offset
    while pos < end {
      let index = pos >> layout.shiftAmount
      let start = index << layout.shiftAmount
      let length = layout.chunkLength(index, size)
      let a = Int(pos - start)
      let b = Int(min(end, start + UInt64(length)) - start)
      let dst = Int(pos - offset)
      let target = UnsafeMutableRawBufferPointer(rebasing: out[dst..<(dst + b - a)])
      if a == 0 && b == length && index != buffered {
        // A run of whole chunks: every chunk before the one holding `end` (and that one too
        // when the read reaches the end of the file), up to the buffered chunk.
        var through = end == size ? last + 1 : min(last + 1, end >> layout.shiftAmount)
        if let buffered, buffered > index { through = min(through, buffered) }
        let bytes = try readWhole(
          fd, chunks: index..<max(index + 1, through), size: size,
          into: UnsafeMutableRawBufferPointer(rebasing: out[dst...]))
        pos = start + UInt64(bytes)
        continue
      }
      try lock.withLock {
        // Another read may have moved the buffer meanwhile; the chunk is then read again.
        try load(index, fresh: false)
        target.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[a..<b]))
      }
      pos = start + UInt64(b)
    }
    return Int(end - offset)
  }

  /// Copies the buffered chunk into `out` (at least ``chunkSize`` bytes) when it is the chunk
  /// holding `offset` and holds no unwritten change; returns where it starts and its length.
  /// Lets a caller hand a chunk that a small read just decrypted to another cache.
  public func bufferedChunk(containing offset: UInt64, into out: UnsafeMutableRawBufferPointer)
    -> (start: UInt64, count: Int)?
  {
    lock.withLock {
      guard fd >= 0, !bufferDirty, let index = bufferIndex,
        index == offset >> layout.shiftAmount, out.count >= bufferLength
      else { return nil }
      out.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[0..<bufferLength]))
      return (index << layout.shiftAmount, bufferLength)
    }
  }

  /// Decrypts whole chunks (the caller holds `gate` shared) into `out`, reading several
  /// slots per call; returns the plaintext bytes written.
  private func readWhole(
    _ fd: Int32, chunks: Range<UInt64>, size: UInt64, into out: UnsafeMutableRawBufferPointer
  ) throws -> Int {
    let last = layout.lastIndex(size)
    let scratch = ScratchPool.shared.take()
    defer { ScratchPool.shared.give(scratch) }
    var written = 0
    var index = chunks.lowerBound
    while index < chunks.upperBound {
      let n = min(chunks.upperBound - index, UInt64(ScratchPool.slots(layout.shift)))
      let tail = index + n - 1
      let physical =
        Int(n - 1) * layout.slotSize + Self.slotOverhead + layout.chunkLength(tail, size)
      let got = try POSIXIO.pread(
        fd, UnsafeMutableRawBufferPointer(rebasing: scratch[0..<physical]), layout.slotOffset(index)
      )
      guard got == physical else { throw CryptoError.truncated("CryptoFile slot \(index)") }
      for i in 0..<Int(n) {
        let chunk = index + UInt64(i)
        let length = layout.chunkLength(chunk, size)
        let from = i * layout.slotSize
        try openSlot(
          UnsafeRawBufferPointer(rebasing: scratch[from..<(from + Self.slotOverhead + length)]),
          index: chunk, length: length, last: chunk == last,
          into: UnsafeMutableRawBufferPointer(rebasing: out[written..<(written + length)]))
        written += length
      }
      index += n
    }
    return written
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
    try exclusive { try writeLocked(bytes, at: offset) }
  }

  private func writeLocked(_ bytes: UnsafeRawBufferPointer, at offset: UInt64) throws {
    try checkOpen()
    guard bytes.count > 0 else { return }
    guard offset <= UInt64(Int64.max) - UInt64(bytes.count) else {
      throw StoreError.io("CryptoFile write beyond the largest file size", errno: EFBIG)
    }
    try checkFits(offset + UInt64(bytes.count))
    if offset > plaintextSize { try extend(to: offset) }
    let oldLast = layout.lastIndex(plaintextSize)
    let end = offset + UInt64(bytes.count)
    let newSize = max(plaintextSize, end)
    if newSize > plaintextSize {
      // The old last chunk grows (or stops being last): read it under the current size, whose
      // length and last flag are the ones on disk, before the size changes.
      try load(oldLast, fresh: false)
      bufferDirty = true
    }
    plaintextSize = newSize
    if bufferIndex == oldLast { bufferLength = layout.chunkLength(oldLast, newSize) }
    var pos = offset
    while pos < end {
      let index = pos >> layout.shiftAmount
      let start = index << layout.shiftAmount
      let a = Int(pos - start)
      let b = Int(min(end, start + UInt64(layout.chunkSize)) - start)
      let length = layout.chunkLength(index, newSize)
      if a == 0 && b == length {
        // Whole chunks from here: sealed straight from `bytes`, without the buffer.
        var through = index + 1
        while through - index < UInt64(ScratchPool.slots(layout.shift)),
          (through << layout.shiftAmount) + UInt64(layout.chunkLength(through, newSize)) <= end,
          through <= layout.lastIndex(newSize)
        {
          through += 1
        }
        if through - index >= 2 {
          let src = Int(pos - offset)
          let span =
            Int((through - 1 - index) << layout.shiftAmount)
            + layout.chunkLength(through - 1, newSize)
          if let buffered = bufferIndex, (index..<through).contains(buffered) {
            // Its content is replaced as a whole.
            bufferIndex = nil
            bufferDirty = false
          }
          try writeWhole(
            UnsafeRawBufferPointer(rebasing: bytes[src..<(src + span)]), chunks: index..<through,
            size: newSize)
          pos = start + UInt64(span)
          continue
        }
      }
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

  /// Has `copy` told before each change of the file from now on (its blocks copied first), or
  /// nobody with `nil`. A chunk still buffered (the caller flushes it first: ``flushBuffer()``)
  /// is written when it is written, guarded.
  public func guardWrites(with copy: CopyBeforeWrite?) {
    exclusive { writeGuard = copy }
  }

  /// Shrinks or grows (with zeros) the file to `newSize` bytes.
  public func truncate(to newSize: UInt64) throws {
    try exclusive { try truncateLocked(to: newSize) }
  }

  private func truncateLocked(to newSize: UInt64) throws {
    try checkOpen()
    if newSize == plaintextSize { return }
    guard newSize <= UInt64(Int64.max) else {
      throw StoreError.io("CryptoFile truncate beyond the largest file size", errno: EFBIG)
    }
    if newSize > plaintextSize {
      try checkFits(newSize)
      return try extend(to: newSize)
    }
    try flush()
    let newLast = layout.lastIndex(newSize)
    if let b = bufferIndex, b > newLast { bufferIndex = nil }
    try load(newLast, fresh: false)
    let length = layout.chunkLength(newLast, newSize)
    if length < bufferLength {
      UnsafeMutableRawBufferPointer(rebasing: buffer[length..<bufferLength])
        .initializeMemory(as: UInt8.self, repeating: 0)
    }
    plaintextSize = newSize
    bufferLength = length
    bufferDirty = true
    try flush()
  }

  /// Writes the buffered chunk and starts writing the file's dirty pages to its device
  /// without waiting (a ``sync()`` after it has less to wait for).
  public func startSync() throws {
    try exclusive {
      try checkOpen()
      try flush()
      _ = zdc_start_writeback(fd)
    }
  }

  /// Writes the buffered chunk and flushes the file to stable storage (no flush when nothing
  /// was written through this object since its last one: an `fsync` that has nothing to do
  /// costs the device a cache flush all the same). True when it flushed.
  @discardableResult
  public func sync() throws -> Bool {
    try exclusive {
      try checkOpen()
      try flush()
      guard unsynced else { return false }
      try POSIXIO.fdatasync(fd)
      unsynced = false
      return true
    }
  }

  /// Writes the buffered chunk to the file (no fsync): the content survives a crash of this
  /// process, not a power loss (use ``sync()`` for that).
  public func flushBuffer() throws {
    try exclusive {
      try checkOpen()
      try flush()
    }
  }

  /// Writes the buffered chunk and closes the file; later calls throw.
  public func close() throws {
    try exclusive {
      guard fd >= 0 else { return }
      defer {
        Glibc.close(fd)
        fd = -1
      }
      try flush()
    }
  }

  /// Closes the file without writing what it buffers (the caller overwrites or deletes the
  /// file); later calls throw.
  public func closeDiscarding() {
    exclusive {
      guard fd >= 0 else { return }
      Glibc.close(fd)
      fd = -1
    }
  }

  /// Streams the whole plaintext in order, at most ``maxChunkSize`` bytes per call.
  public func readAll(to sink: (Data) throws -> Void) throws {
    var offset: UInt64 = 0
    while true {
      let piece = try read(offset: offset, count: Self.maxChunkSize)
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

/// The chunk size of one file and the arithmetic of its slots.
struct ChunkLayout: Sendable {
  /// log2 of the chunk size.
  let shift: UInt8
  /// `shift` as a shift amount.
  let shiftAmount: UInt64
  /// Plaintext bytes per chunk.
  let chunkSize: Int
  /// Bytes of a full slot.
  let slotSize: Int

  init(shift: UInt8) {
    self.shift = shift
    shiftAmount = UInt64(shift)
    chunkSize = 1 << Int(shift)
    slotSize = chunkSize + CryptoFile.slotOverhead
  }

  /// Index of the last chunk of a file of `size` bytes (0 when empty).
  func lastIndex(_ size: UInt64) -> UInt64 {
    size == 0 ? 0 : (size - 1) >> shiftAmount
  }

  /// Plaintext length of chunk `i` (at most the last index) in a file of `size` bytes.
  func chunkLength(_ i: UInt64, _ size: UInt64) -> Int {
    i == lastIndex(size) ? Int(size - (i << shiftAmount)) : chunkSize
  }

  func slotOffset(_ i: UInt64) -> UInt64 {
    UInt64(CryptoFile.headerSize) + i * UInt64(slotSize)
  }

  /// The physical file size holding `size` plaintext bytes.
  func physicalSize(plaintextSize size: UInt64) -> UInt64 {
    let last = lastIndex(size)
    return slotOffset(last) + UInt64(CryptoFile.slotOverhead + chunkLength(last, size))
  }

  /// The plaintext size of a physical file of `physical` bytes, or `nil` if no valid file has
  /// that size.
  func plaintextSize(physicalSize physical: UInt64) -> UInt64? {
    let overhead = UInt64(CryptoFile.slotOverhead)
    guard physical >= UInt64(CryptoFile.headerSize) + overhead else { return nil }
    let body = physical - UInt64(CryptoFile.headerSize)
    let full = body / UInt64(slotSize)
    let rem = body % UInt64(slotSize)
    if rem == 0 { return full << shiftAmount }
    guard rem >= overhead, !(rem == overhead && full > 0) else { return nil }
    return (full << shiftAmount) + rem - overhead
  }
}

/// What the sealing threads of one `writeWhole` share: plaintext in, slots out (each thread its
/// own chunks), and the first error.
private final class SealJob: @unchecked Sendable {
  // @unchecked: threads write disjoint slots of `scratch`; `firstError` is guarded by `lock`.
  let bytes: UnsafeRawBufferPointer
  let scratch: UnsafeMutableRawBufferPointer
  private let lock = NSLock()
  private var firstError: (any Error)?

  init(bytes: UnsafeRawBufferPointer, scratch: UnsafeMutableRawBufferPointer) {
    self.bytes = bytes
    self.scratch = scratch
  }

  func fail(_ error: any Error) { lock.withLock { if firstError == nil { firstError = error } } }

  var error: (any Error)? { lock.withLock { firstError } }
}

/// Reusable scratch buffers for reads and writes of whole chunks (several slots each), so that
/// large reads allocate nothing.
final class ScratchPool: @unchecked Sendable {
  // @unchecked: `free` is guarded by `lock`.
  /// Plaintext bytes of the slots a buffer holds.
  static let plaintextBytes = 1 << 20
  /// Slots per buffer for chunks of `1 << shift` bytes.
  static func slots(_ shift: UInt8) -> Int { plaintextBytes >> Int(shift) }
  /// Bytes per buffer: room for the slots of the smallest chunks (the most slots).
  static let byteCount =
    slots(CryptoFile.chunkShifts.lowerBound)
    * CryptoFile.slotSize(chunkShift: CryptoFile.chunkShifts.lowerBound)
  static let shared = ScratchPool()
  private let lock = NSLock()
  private var free: [UnsafeMutableRawBufferPointer] = []

  func take() -> UnsafeMutableRawBufferPointer {
    lock.withLock { free.popLast() }
      ?? .allocate(byteCount: Self.byteCount, alignment: 16)
  }

  /// Returns a buffer (ciphertext only, never plaintext); keeps a few.
  func give(_ b: UnsafeMutableRawBufferPointer) {
    let kept = lock.withLock { () -> Bool in
      guard free.count < 8 else { return false }
      free.append(b)
      return true
    }
    if !kept { b.deallocate() }
  }
}

/// Fixed-size memory blocks of closed CryptoFiles kept for the next ones (a bounded stack of
/// addresses): their 64 KiB chunk buffers (anonymous mappings, handed back all zero) and slot
/// scratch (ciphertext only).
final class BlockPool: Sendable {
  private let free = Mutex<[UInt]>([])
  /// Blocks kept at most (the caller releases the rest).
  let capacity: Int

  init(capacity: Int) { self.capacity = capacity }

  static let chunkBuffers = BlockPool(capacity: 64)
  static let slotScratch = BlockPool(capacity: 64)

  func take() -> UnsafeMutableRawPointer? {
    free.withLock { $0.popLast() }.flatMap { UnsafeMutableRawPointer(bitPattern: $0) }
  }

  /// Keeps a block; false when the pool is full (the caller releases it).
  func give(_ block: UnsafeMutableRawPointer) -> Bool {
    free.withLock {
      guard $0.count < capacity else { return false }
      $0.append(UInt(bitPattern: block))
      return true
    }
  }
}
