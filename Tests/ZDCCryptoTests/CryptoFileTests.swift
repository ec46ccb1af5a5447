import Foundation
import Synchronization
import Testing
import ZDCCore

@testable import ZDCCrypto

/// The chunk shifts every behaviour is checked with: new files' and the 64 KiB chunks of files
/// made before chunk sizes varied (caches and staged content an upgrade keeps).
let testedChunkShifts: [UInt8] = [CryptoFile.defaultChunkShift, 16]

@Suite struct CryptoFileTests {
  let key = SecureRandom.bytes(32)

  func all(_ f: CryptoFile) throws -> Data { try f.read(offset: 0, count: Int(f.size) + 10) }

  /// Several files and a directory flushed as one batch (writebacks started first, `before`
  /// run between the two steps); a missing path is skipped, as a file gone meanwhile.
  @Test func severalFilesAreMadeDurableInOneBatch() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let a = dir.appendingPathComponent("a")
    let b = dir.appendingPathComponent("b")
    try Data("first".utf8).write(to: a)
    try Data("second".utf8).write(to: b)
    var ran = false
    let flushes = try LocalDurability.sync(
      paths: [a.path, dir.path, b.path, dir.appendingPathComponent("missing").path]
    ) {
      ran = true
      return true
    }
    #expect(ran)
    #expect(flushes == 4)
    #expect(throws: StoreError.self) {
      try LocalDurability.sync(paths: [a.path]) { throw StoreError.io("before", errno: EIO) }
    }
    #expect(throws: StoreError.self) {
      try LocalDurability.sync(paths: [a.appendingPathComponent("under-a-file").path])
    }
  }

  /// Files whose metadata is on stable storage already (`dataOnly`) ride on another file's
  /// flush when the file system sends the device a cache flush per `fsync` and the other file
  /// is on the same device: one flush, not one each. Elsewhere each gets its own, and when
  /// the flush they counted on does not happen (`before` had nothing to flush), one of them
  /// is flushed instead.
  @Test func filesWithOnlyDataToFlushRideOnAnotherFilesFlush() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let names = ["a", "b", "c"]
    let paths = names.map { dir.appendingPathComponent($0).path }
    for p in paths { try Data(repeating: 1, count: 8192).write(to: URL(fileURLWithPath: p)) }
    func dirty() throws {
      for p in paths {
        let h = try FileHandle(forWritingTo: URL(fileURLWithPath: p))
        try h.write(contentsOf: Data(repeating: 2, count: 100))
        try h.close()
      }
    }
    let flushing = LocalDurability.flushesDevice(ofPath: dir.path)
    let device = try #require(LocalDurability.device(ofPath: dir.path))
    try dirty()
    // One file flushed, two riding on it.
    #expect(
      try LocalDurability.sync(paths: [paths[0]], dataOnly: Array(paths[1...]))
        == (flushing ? 1 : 3))
    try dirty()
    // Only riders: one of them is flushed.
    #expect(try LocalDurability.sync(paths: [], dataOnly: paths) == (flushing ? 1 : 3))
    try dirty()
    // Riding on `before`'s flush, which happens; then on one that does not.
    #expect(
      try LocalDurability.sync(paths: [], dataOnly: paths, before: { true }, beforeDevice: device)
        == (flushing ? 1 : 4))
    try dirty()
    #expect(
      try LocalDurability.sync(paths: [], dataOnly: paths, before: { false }, beforeDevice: device)
        == (flushing ? 1 : 3))
    // `before` on another device: nothing rides on it.
    #expect(
      try LocalDurability.sync(
        paths: [], dataOnly: paths, before: { true }, beforeDevice: device &+ 1)
        == (flushing ? 2 : 4))
    // A file on a file system that is not known to flush the device (tmpfs) is flushed itself.
    if FileManager.default.fileExists(atPath: "/dev/shm") {
      let shm = "/dev/shm/zdc-test-\(UUID().uuidString)"
      try Data("x".utf8).write(to: URL(fileURLWithPath: shm))
      defer { unlink(shm) }
      #expect(try LocalDurability.sync(paths: [paths[0]], dataOnly: [shm]) == 2)
    }
  }

  /// A file written in place under a `CopyBeforeWrite` leaves in the copy the content it had
  /// when the copy began: each block copied before its first change, the rest by `fill()`, or
  /// from the file's unchanged blocks into the copy's holes after a crash (`fillHoles`).
  @Test func aCopyBeforeWriteKeepsTheContentAsItWas() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    guard CopyBeforeWrite.supports(path: dir.path) else { return }
    let url = dir.appendingPathComponent("f")
    let original = Data((0..<600_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 9) })
    let f = try CryptoFile.create(at: url, key: key)
    try f.write(original, at: 0)
    try f.close()
    let before = try Data(contentsOf: url)
    // What the copy's file held before: a few bytes (a new file's header, which its first
    // block, copied at once, covers) or more than a block (emptied first).
    for (finish, stale) in [("fill", 3), ("crash", 3), ("crash", 10_000)] {
      let copy = dir.appendingPathComponent("copy-\(finish)-\(stale)")
      try Data(repeating: 0x6F, count: stale).write(to: copy)
      let cow = try CopyBeforeWrite(source: url.path, copy: copy.path)
      let w = try CryptoFile.open(at: url, key: key)
      w.guardWrites(with: cow)
      try w.write(Data(repeating: 1, count: 5000), at: 100_000)
      try w.truncate(to: 300_000)
      try w.write(Data(repeating: 2, count: 10), at: 700_000)
      try w.flushBuffer()
      if finish == "fill" {
        try cow.fill()
        #expect(cow.isFinished)
        // Later writes no longer reach the copy.
        try w.write(Data(repeating: 3, count: 100), at: 0)
        try w.flushBuffer()
      } else {
        cow.finish()
        #expect(try CopyBeforeWrite.fillHoles(copy: copy.path, from: url.path) > 0)
      }
      try w.close()
      #expect(try Data(contentsOf: copy) == before)
      #expect(try CryptoFile.open(at: copy, key: key).read(offset: 0, count: 700_000) == original)
      // The file itself has the new content.
      let now = try CryptoFile.open(at: url, key: key)
      #expect(now.size == 700_010)
      try now.close()
      // The next round starts from the content as it was.
      try FileManager.default.removeItem(at: url)
      try FileManager.default.copyItem(at: copy, to: url)
    }
  }

  /// A flush with nothing written since the last one is skipped (it would cost the device a
  /// cache flush all the same); any write, a truncation, or a file opened anew flushes again.
  @Test func aSyncWithNothingWrittenSinceTheLastFlushesNothing() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("f")
    let f = try CryptoFile.create(at: url, key: key)
    try f.write(Data(repeating: 7, count: 10_000), at: 0)
    #expect(try f.sync())
    #expect(try !f.sync())
    try f.write(Data([1]), at: 5)
    #expect(try f.sync())
    #expect(try !f.sync())
    try f.truncate(to: 3)
    #expect(try f.sync())
    try f.truncate(to: 9_000)
    #expect(try f.sync())
    #expect(try !f.sync())
    try f.close()
    let reopened = try CryptoFile.open(at: url, key: key)
    defer { try? reopened.close() }
    #expect(try reopened.sync())
    #expect(try !reopened.sync())
    #expect(try reopened.read(offset: 0, count: 3) == Data(repeating: 7, count: 3))
  }

  /// The largest file probe: within a limit any file system allows, that limit; a directory
  /// that cannot hold a temporary file leaves the limit as given.
  @Test func theLargestFileProbeStaysWithinItsLimit() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    #expect(FileSizeLimit.probe(directory: dir.path, upTo: 12_345_678) == 12_345_678)
    #expect(FileSizeLimit.probe(directory: dir.path + "/missing", upTo: 99) == 99)
    #expect(FileSizeLimit.directory(of: "/a/b/c") == "/a/b")
    #expect(FileSizeLimit.directory(of: "/c") == "/" && FileSizeLimit.directory(of: "c") == ".")
    #expect(FileSizeLimit.directory(of: "/tmp/caf\u{E9}/\u{1F600}/x") == "/tmp/caf\u{E9}/\u{1F600}")
    #expect(FileSizeLimit.directory(of: "a/b") == "a" && FileSizeLimit.directory(of: "a/") == "a")
  }

  @Test(arguments: testedChunkShifts) func emptyFileHasOneChunkAndReopens(shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("f")
    let f = try CryptoFile.create(at: url, key: key, chunkShift: shift)
    #expect(f.size == 0)
    #expect(f.chunkShift == shift)
    #expect(try f.read(offset: 0, count: 10).isEmpty)
    try f.close()
    #expect(try Data(contentsOf: url).count == 32 + 40)
    #expect(try CryptoFile.plaintextSize(ofFileAt: url) == 0)
    let g = try CryptoFile.open(at: url, key: key)
    #expect(g.size == 0)
    #expect(g.chunkShift == shift)
    try g.close()
    #expect(throws: CryptoError.self) { try CryptoFile.open(at: url, key: SecureRandom.bytes(32)) }
  }

  /// (Also for a file created with its first chunk deferred, as spare staging files are.)
  @Test(arguments: [false, true], testedChunkShifts)
  func randomOperationsMatchModel(deferred: Bool, shift: UInt8) throws {
    for cipher in CryptoFile.Cipher.allCases {
      try randomOperationsMatchModel(deferred: deferred, shift: shift, cipher: cipher)
    }
  }

  func randomOperationsMatchModel(deferred: Bool, shift: UInt8, cipher: CryptoFile.Cipher) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    for seed in UInt64(1)...4 {
      var rng = SplitMix64(seed: seed)
      let url = dir.appendingPathComponent("f\(seed)")
      var f = try CryptoFile.create(
        at: url, key: key, chunkShift: shift, cipher: cipher, deferringFirstChunk: deferred)
      var model = Data()
      for step in 0..<400 {
        switch Int.random(in: 0..<100, using: &rng) {
        case 0..<45:
          let small = Bool.random(using: &rng)
          let len = Int.random(in: 1...(small ? 5000 : 3 * CS), using: &rng)
          let off =
            Int.random(in: 0..<4, using: &rng) == 0
            ? model.count  // an append
            : Int.random(in: 0...(model.count + (small ? 2000 : 2 * CS)), using: &rng)
          let bytes = randomBytes(len, &rng)
          try f.write(bytes, at: UInt64(off))
          if model.count < off + len { model.append(Data(count: off + len - model.count)) }
          model.replaceSubrange(off..<(off + len), with: bytes)
        case 45..<75:
          let off = Int.random(in: 0...(model.count + 100), using: &rng)
          let len = Int.random(in: 0...(2 * CS), using: &rng)
          let got = try f.read(offset: UInt64(off), count: len)
          let lo = min(off, model.count)
          // #require: stop at the first divergence instead of cascading.
          try #require(
            got == model.subdata(in: lo..<min(model.count, lo + len)), "seed \(seed) step \(step)")
        case 75..<88:
          let n = Int.random(in: 0...(model.count + 3 * CS), using: &rng)
          try f.truncate(to: UInt64(n))
          if n < model.count {
            model = model.prefix(n)
          } else {
            model.append(Data(count: n - model.count))
          }
        case 88..<93:
          try f.sync()
          #expect(try CryptoFile.plaintextSize(ofFileAt: url) == UInt64(model.count))
        default:
          try f.close()
          #expect(try CryptoFile.plaintextSize(ofFileAt: url) == UInt64(model.count))
          f = try CryptoFile.open(at: url, key: key)
          try #require(f.chunkShift == shift && f.cipher == cipher)
        }
        try #require(f.size == UInt64(model.count), "seed \(seed) step \(step)")
        if step % 50 == 49 { try #require(try all(f) == model, "seed \(seed) step \(step)") }
      }
      try f.close()
      let g = try CryptoFile.open(at: url, key: key)
      #expect(try all(g) == model)
      try g.close()
    }
  }

  /// Writes covering whole chunks take their own path (sealed from the caller's bytes, several
  /// at a time on two threads): mixed with partial writes, reads, truncations and reopenings,
  /// the content must match a plain model.
  @Test(arguments: [false, true], testedChunkShifts)
  func wholeChunkWritesMatchModel(deferred: Bool, shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    // Chunks in more than one batch of whole chunks (1 MiB of plaintext).
    let most = max(20, (1 << 20) / CS + 3)
    for seed in UInt64(11)...14 {
      var rng = SplitMix64(seed: seed)
      let url = dir.appendingPathComponent("w\(seed)")
      var f = try CryptoFile.create(
        at: url, key: key, chunkShift: shift, deferringFirstChunk: deferred)
      var model = Data()
      for step in 0..<150 {
        switch Int.random(in: 0..<100, using: &rng) {
        case 0..<55:
          // Chunk-aligned, one to twenty chunks or up to more than a batch, sometimes with a
          // partial tail or head.
          let chunks = (model.count + 2 * CS) / CS
          var off = Int.random(in: 0...chunks, using: &rng) * CS
          var len = Int.random(in: 1...(Bool.random(using: &rng) ? 20 : most), using: &rng) * CS
          if Bool.random(using: &rng) { len += Int.random(in: 1..<CS, using: &rng) }
          if Int.random(in: 0..<4, using: &rng) == 0 { off += Int.random(in: 1..<CS, using: &rng) }
          let bytes = randomBytes(len, &rng)
          try f.write(bytes, at: UInt64(off))
          if model.count < off + len { model.append(Data(count: off + len - model.count)) }
          model.replaceSubrange(off..<(off + len), with: bytes)
        case 55..<70:
          let off = Int.random(in: 0...(model.count + 100), using: &rng)
          let bytes = randomBytes(Int.random(in: 1...3000, using: &rng), &rng)
          try f.write(bytes, at: UInt64(off))
          if model.count < off + bytes.count {
            model.append(Data(count: off + bytes.count - model.count))
          }
          model.replaceSubrange(off..<(off + bytes.count), with: bytes)
        case 70..<85:
          let off = Int.random(in: 0...(model.count + 100), using: &rng)
          let count = (Bool.random(using: &rng) ? 3 : most) * CS
          let got = try f.read(offset: UInt64(off), count: count)
          let lo = min(off, model.count)
          try #require(
            got == model.subdata(in: lo..<min(model.count, lo + count)),
            "seed \(seed) step \(step)")
        case 85..<92:
          let n = Int.random(in: 0...(model.count + CS), using: &rng)
          try f.truncate(to: UInt64(n))
          if n < model.count {
            model = model.prefix(n)
          } else {
            model.append(Data(count: n - model.count))
          }
        default:
          try f.close()
          f = try CryptoFile.open(at: url, key: key)
        }
        try #require(f.size == UInt64(model.count), "seed \(seed) step \(step)")
      }
      try f.close()
      let g = try CryptoFile.open(at: url, key: key)
      #expect(try all(g) == model)
      try g.close()
    }
  }

  @Test(arguments: testedChunkShifts) func sparseWritesLeaveHoles(shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    let S = CryptoFile.slotSize(chunkShift: shift)
    let url = dir.appendingPathComponent("sparse")
    let f = try CryptoFile.create(at: url, key: key, chunkShift: shift)
    try f.write(Data("end".utf8), at: UInt64(10 * CS + 5))
    try f.close()
    let raw = try Data(contentsOf: url)
    #expect(raw.count == 32 + 10 * S + 40 + 8)
    // Chunk 0 was the (empty) last chunk and became a full encrypted zero chunk; chunks 1...9
    // are holes, never encrypted.
    for i in 1..<10 {
      let slot = raw.subdata(in: (32 + i * S)..<(32 + (i + 1) * S))
      #expect(slot.allSatisfy { $0 == 0 }, "slot \(i) is a hole")
    }
    let g = try CryptoFile.open(at: url, key: key)
    #expect(g.size == UInt64(10 * CS + 8))
    var expected = Data(count: 10 * CS + 5)
    expected.append(Data("end".utf8))
    #expect(try all(g) == expected)
    // truncate up then write into the hole.
    try g.truncate(to: UInt64(20 * CS))
    try g.write(Data("mid".utf8), at: UInt64(15 * CS + 1))
    try g.close()
    let h = try CryptoFile.open(at: url, key: key)
    expected.append(Data(count: 20 * CS - expected.count))
    expected.replaceSubrange((15 * CS + 1)..<(15 * CS + 4), with: Data("mid".utf8))
    #expect(try all(h) == expected)
    try h.close()
  }

  @Test(arguments: testedChunkShifts, CryptoFile.Cipher.allCases)
  func holeAsLastSlotOrTamperedSlotIsRejected(shift: UInt8, cipher: CryptoFile.Cipher) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    let url = dir.appendingPathComponent("t")
    let f = try CryptoFile.create(at: url, key: key, chunkShift: shift, cipher: cipher)
    var rng = SplitMix64(seed: 1)
    let content = randomBytes(3 * CS + 100, &rng)
    try f.write(content, at: 0)
    try f.close()
    let raw = try Data(contentsOf: url)
    func check(_ bytes: Data, _ what: String) throws {
      try bytes.write(to: url)
      #expect(throws: (any Error).self, "\(what)") {
        let g = try CryptoFile.open(at: url, key: key)
        _ = try g.read(offset: 0, count: 4 * CS)
      }
    }
    let S = CryptoFile.slotSize(chunkShift: shift)
    // Zeroed final slot.
    var z = raw
    z.replaceSubrange((32 + 3 * S)..<raw.count, with: Data(count: raw.count - 32 - 3 * S))
    try check(z, "zeroed last slot")
    // Every byte of the header and of the first slot's nonce field (AES-256-GCM uses 12 of its
    // 24 bytes as the nonce and authenticates the others), and bytes further on.
    for p in Array(0..<56) + [32 + 60, 32 + S - 1, 32 + S + 100, raw.count - 1]
    where !(16..<32).contains(p) || p == 16 || p == 31 {
      var t = raw
      t[p] ^= 1
      try check(t, "flip at \(p)")
    }
    try check(raw.prefix(32 + 3 * S), "truncated at slot boundary")
    try check(raw.prefix(raw.count - 1), "truncated by one")
    try check(raw + Data([1]), "appended")
    var swapped = raw
    swapped.replaceSubrange((32)..<(32 + S), with: raw.subdata(in: (32 + S)..<(32 + 2 * S)))
    swapped.replaceSubrange((32 + S)..<(32 + 2 * S), with: raw.subdata(in: 32..<(32 + S)))
    try check(swapped, "swapped slots")
    // The documented allowance: a zeroed non-final slot reads as zeros.
    var hole = raw
    hole.replaceSubrange((32 + S)..<(32 + 2 * S), with: Data(count: S))
    try hole.write(to: url)
    let g = try CryptoFile.open(at: url, key: key)
    #expect(try g.read(offset: UInt64(CS), count: CS) == Data(count: CS))
    try g.close()
  }

  @Test(arguments: testedChunkShifts) func sequentialSmallWritesAndStreaming(shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    let url = dir.appendingPathComponent("seq")
    let f = try CryptoFile.create(at: url, key: key, chunkShift: shift)
    var rng = SplitMix64(seed: 8)
    let content = randomBytes(5 * CS + 1234, &rng)
    var off = 0
    while off < content.count {
      let n = min(4096, content.count - off)
      try f.write(content.subdata(in: off..<(off + n)), at: UInt64(off))
      off += n
    }
    var streamed = Data()
    try f.readAll { streamed.append($0) }
    #expect(streamed == content)
    // Feeding a CloudFile from the CryptoFile.
    let nodeKey = SecureRandom.nodeKey()
    var object = Data()
    try CloudFileEncoder(key: nodeKey).encode(data: f.cloudFileSource()) { object.append($0) }
    #expect(try decodeAll(key: nodeKey, object: object).2 == content)
    try f.close()
    #expect(throws: (any Error).self) { try f.read(offset: 0, count: 1) }
  }

  @Test(arguments: testedChunkShifts)
  func smallSequentialWritesEncryptEachChunkOnce(shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    let f = try CryptoFile.create(
      at: dir.appendingPathComponent("once"), key: key, chunkShift: shift)
    let base = f.chunkEncryptions  // the empty chunk written by create
    let block = Data(repeating: 0xAB, count: 4096)
    for i in 0..<(8 * CS / 4096) { try f.write(block, at: UInt64(i * 4096)) }
    try f.sync()
    #expect(f.chunkEncryptions - base == 8)
    // Sequential small reads decrypt each chunk once and need no re-encryption.
    var offset: UInt64 = 0
    while offset < f.size {
      #expect(try f.read(offset: offset, count: 4096) == block)
      offset += 4096
    }
    #expect(f.chunkEncryptions - base == 8)
    // Overwriting in place re-encrypts only the touched chunk.
    try f.write(Data([1]), at: UInt64(3 * CS + 7))
    try f.sync()
    #expect(f.chunkEncryptions - base == 9)
    try f.close()
  }

  /// Small sequential writes into small chunks write several sealed slots per call, not one
  /// call per chunk; content read back, after reopening too, is what was written.
  @Test func smallSequentialWritesWriteRunsOfSlots() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("run")
    let f = try CryptoFile.create(at: url, key: key, chunkShift: 12)
    var rng = SplitMix64(seed: 9)
    let content = randomBytes(64 * 4096 + 100, &rng)
    let writes = f.slotWrites
    var off = 0
    while off < content.count {
      let n = min(1000, content.count - off)
      try f.write(content.subdata(in: off..<(off + n)), at: UInt64(off))
      off += n
    }
    try f.flushBuffer()
    // 65 chunks in runs of up to 15 slots.
    #expect(f.slotWrites - writes <= 6)
    #expect(f.chunkEncryptions >= 65)
    #expect(try all(f) == content)
    // Rewriting in place in small pieces, with reads between, stays correct.
    var model = content
    for i in stride(from: 0, to: 40 * 4096, by: 3000) {
      let piece = randomBytes(700, &rng)
      try f.write(piece, at: UInt64(i))
      model.replaceSubrange(i..<(i + 700), with: piece)
      if i % 9000 == 0 {
        #expect(try f.read(offset: UInt64(i), count: 5000) == model[i..<(i + 5000)])
      }
    }
    try f.close()
    let g = try CryptoFile.open(at: url, key: key)
    #expect(try all(g) == model)
    try g.close()
  }

  @Test(arguments: testedChunkShifts) func concurrentWritersAndReaders(shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    let f = try CryptoFile.create(
      at: dir.appendingPathComponent("mt"), key: key, chunkShift: shift)
    let threads = 8
    let region = 3 * CS / 2
    DispatchQueue.concurrentPerform(iterations: threads) { t in
      let bytes = Data(repeating: UInt8(t + 1), count: 1000)
      var off = 0
      while off < region {
        let n = min(1000, region - off)
        try? f.write(bytes.prefix(n), at: UInt64(t * region + off))
        _ = try? f.read(offset: UInt64(((t + 3) % threads) * region), count: 5000)
        off += n
      }
    }
    #expect(f.size == UInt64(threads * region))
    for t in 0..<threads {
      let got = try f.read(offset: UInt64(t * region), count: region)
      #expect(got == Data(repeating: UInt8(t + 1), count: region), "thread \(t)")
    }
    try f.close()
  }

  /// Sealed chunks waiting in the run never land over a newer version of the same chunks:
  /// neither over whole chunks written since, nor over a truncation.
  @Test func pendingSlotsNeverOverwriteNewerContent() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("order")
    var rng = SplitMix64(seed: 12)
    let f = try CryptoFile.create(at: url, key: key, chunkShift: 12)
    var model = randomBytes(10 * 4096, &rng)
    try f.write(model, at: 0)
    // Chunk 0 changed, then sealed (the buffer moves on to chunk 1, written whole) but not
    // written yet.
    try f.write(Data("x".utf8), at: 100)
    try f.write(randomBytes(4096, &rng), at: 4096)
    // Whole chunks 0..<4 replaced.
    let whole = randomBytes(4 * 4096, &rng)
    try f.write(whole, at: 0)
    model.replaceSubrange(0..<whole.count, with: whole)
    #expect(try all(f) == model)
    // Chunks 5 and 6 changed (5 sealed), then the file cut inside chunk 5 and grown again.
    try f.write(Data("z".utf8), at: 5 * 4096 + 10)
    try f.write(randomBytes(4096, &rng), at: 6 * 4096)
    try f.truncate(to: 5 * 4096 + 5)
    try f.truncate(to: 8 * 4096)
    model = model.prefix(5 * 4096 + 5) + Data(count: 3 * 4096 - 5)
    #expect(try all(f) == model)
    try f.close()
    let g = try CryptoFile.open(at: url, key: key)
    #expect(try all(g) == model)
    try g.close()
  }

  /// New files record the default chunk shift in their header and are laid out in chunks of
  /// that size; a file keeps the shift it was made with across reopening and rewriting.
  @Test func chunkShiftIsChosenAtCreationAndKept() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    var rng = SplitMix64(seed: 3)
    let content = randomBytes(300_000, &rng)
    for shift in [nil] + CryptoFile.chunkShifts.map(Optional.some) {
      let expected = shift ?? CryptoFile.defaultChunkShift
      let url = dir.appendingPathComponent("s\(expected)")
      let f =
        try shift.map { try CryptoFile.create(at: url, key: key, chunkShift: $0) }
        ?? CryptoFile.create(at: url, key: key)
      #expect(f.chunkShift == expected)
      #expect(f.chunkSize == 1 << Int(expected))
      try f.write(content, at: 0)
      try f.close()
      let raw = try Data(contentsOf: url)
      #expect(raw[9] == expected)
      #expect(
        UInt64(raw.count) == CryptoFile.physicalSize(plaintextSize: 300_000, chunkShift: expected))
      #expect(
        CryptoFile.plaintextSize(physicalSize: UInt64(raw.count), chunkShift: expected) == 300_000)
      #expect(try CryptoFile.layout(ofFileAt: url) == (expected, 300_000))
      #expect(try CryptoFile.plaintextSize(ofFileAt: url) == 300_000)
      let g = try CryptoFile.open(at: url, key: key)
      #expect(g.chunkShift == expected)
      try g.write(Data("patch".utf8), at: 123_456)
      try g.truncate(to: 250_000)
      try g.close()
      let h = try CryptoFile.open(at: url, key: key)
      #expect(h.chunkShift == expected)
      var model = content.prefix(250_000)
      model.replaceSubrange(123_456..<123_461, with: Data("patch".utf8))
      #expect(try all(h) == model)
      try h.close()
    }
    #expect(CryptoFile.defaultChunkSize == 1 << Int(CryptoFile.defaultChunkShift))
  }

  /// The cipher is chosen at creation (AES-256-GCM by default where the processor has it),
  /// recorded in header byte 10 and kept by every later write; files of either cipher open, an
  /// unknown cipher is malformed, and a file read with the other cipher fails authentication.
  @Test func cipherIsChosenAtCreationAndKept() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    #expect(
      CryptoFile.defaultCipher
        == (AESGCMKey.isHardwareAccelerated ? .aes256gcm : .xchacha20poly1305))
    var rng = SplitMix64(seed: 5)
    let content = randomBytes(100_000, &rng)
    for cipher in [nil] + CryptoFile.Cipher.allCases.map(Optional.some) {
      let expected = cipher ?? CryptoFile.defaultCipher
      let url = dir.appendingPathComponent("c\(expected.rawValue)")
      let f =
        try cipher.map { try CryptoFile.create(at: url, key: key, cipher: $0) }
        ?? CryptoFile.create(at: url, key: key)
      #expect(f.cipher == expected)
      try f.write(content, at: 0)
      try f.close()
      var raw = try Data(contentsOf: url)
      #expect(raw[10] == expected.rawValue)
      let g = try CryptoFile.open(at: url, key: key)
      #expect(g.cipher == expected)
      try g.write(Data("patch".utf8), at: 70_000)
      try g.close()
      raw = try Data(contentsOf: url)
      #expect(raw[10] == expected.rawValue)
      var model = content
      model.replaceSubrange(70_000..<70_005, with: Data("patch".utf8))
      let h = try CryptoFile.open(at: url, key: key)
      #expect(try all(h) == model)
      try h.close()
      for id: UInt8 in [2, 3, 255] {
        var t = raw
        t[10] = id
        try t.write(to: url)
        #expect(throws: CryptoError.malformed("CryptoFile cipher \(id)")) {
          try CryptoFile.open(at: url, key: key)
        }
      }
      for other in CryptoFile.Cipher.allCases where other != expected {
        var t = raw
        t[10] = other.rawValue
        try t.write(to: url)
        #expect(throws: CryptoError.self) {
          let o = try CryptoFile.open(at: url, key: key)
          defer { try? o.close() }
          _ = try o.read(offset: 0, count: model.count)
        }
      }
    }
  }

  /// Chunk shifts outside the supported range are refused when creating a file and reported
  /// as malformed when opening one; a changed shift in the header of a file with content does
  /// not go unnoticed.
  @Test func unsupportedOrAlteredChunkShiftsAreRejected() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("bad")
    for shift: UInt8 in [0, 11, 17, 255] {
      #expect(throws: CryptoError.self) {
        try CryptoFile.create(
          at: dir.appendingPathComponent("c\(shift)"), key: key, chunkShift: shift)
      }
    }
    var rng = SplitMix64(seed: 4)
    let content = randomBytes(200_000, &rng)
    for made in testedChunkShifts {
      let f = try CryptoFile.create(at: url, key: key, chunkShift: made)
      try f.write(content, at: 0)
      try f.close()
      let raw = try Data(contentsOf: url)
      for shift: UInt8 in [0, 1, 11, 17, 32, 255] {
        var t = raw
        t[9] = shift
        try t.write(to: url)
        #expect(throws: CryptoError.malformed("CryptoFile chunk shift \(shift)")) {
          try CryptoFile.open(at: url, key: key)
        }
        #expect(throws: CryptoError.self) { try CryptoFile.layout(ofFileAt: url) }
      }
      for shift in CryptoFile.chunkShifts where shift != made {
        var t = raw
        t[9] = shift
        try t.write(to: url)
        #expect(throws: (any Error).self, "made with \(made), read as \(shift)") {
          let g = try CryptoFile.open(at: url, key: key)
          defer { try? g.close() }
          _ = try g.read(offset: 0, count: content.count)
        }
      }
    }
  }

  /// A small read of a big file decrypts only the chunk holding it: a 4 KiB random read of a
  /// new file costs one 4 KiB chunk, not 64 KiB.
  @Test func smallReadsOfNewFilesTouchOneSmallChunk() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("r")
    var rng = SplitMix64(seed: 5)
    let content = randomBytes(1 << 20, &rng)
    let f = try CryptoFile.create(at: url, key: key)
    try f.write(content, at: 0)
    try f.close()
    #expect(CryptoFile.defaultChunkSize <= 16 << 10)
    // Damage every chunk but the one at 512 KiB (and the last, checked on open): a 4 KiB read
    // there still succeeds, so it decrypted nothing else.
    let S = CryptoFile.slotSize()
    var raw = try Data(contentsOf: url)
    let target = (512 << 10) / CryptoFile.defaultChunkSize
    let last = (1 << 20) / CryptoFile.defaultChunkSize - 1
    for i in 0..<last where i != target { raw[32 + i * S + 30] ^= 1 }
    try raw.write(to: url)
    let g = try CryptoFile.open(at: url, key: key)
    #expect(
      try g.read(offset: 512 << 10, count: 4096) == content[(512 << 10)..<((512 << 10) + 4096)])
    #expect(throws: CryptoError.self) { try g.read(offset: (512 << 10) - 4096, count: 4096) }
    try g.close()
  }

  @Test func noPlaintextOnDisk() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("p")
    let f = try CryptoFile.create(at: url, key: key)
    let secret = "TOP-SECRET-CONTENT-\(UUID().uuidString)"
    try f.write(Data(String(repeating: secret, count: 3000).utf8), at: 0)
    try f.write(Data("SecretName-XYZZY".utf8), at: 1_000_000)
    try f.close()
    let raw = try Data(contentsOf: url)
    #expect(!contains(raw, secret))
    #expect(!contains(raw, "SecretName-XYZZY"))
    #expect(raw.range(of: key) == nil)
  }

  /// Reads run concurrently with one another and with writes: every chunk a read returns is
  /// one whole version of that chunk (never torn, never failing authentication), and reads
  /// see a write once it returned.
  @Test(arguments: testedChunkShifts)
  func concurrentReadsAndWritesStayConsistent(shift: UInt8) throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let CS = 1 << Int(shift)
    let chunks = 24
    let f = try CryptoFile.create(
      at: dir.appendingPathComponent("c"), key: key, chunkShift: shift)
    @Sendable func version(_ v: UInt8, _ count: Int) -> Data { Data(repeating: v, count: count) }
    try f.write(version(1, chunks * CS + 777), at: 0)
    let failures = Mutex<[String]>([])
    let writerDone = Mutex(false)
    DispatchQueue.concurrentPerform(iterations: 5) { worker in
      if worker == 0 {
        // Rewrites chunks with increasing versions, partly and wholly, then shrinks and
        // regrows the tail.
        for v in UInt8(2)...UInt8(120) {
          let c = Int(v) % chunks
          do {
            try f.write(version(v, CS), at: UInt64(c * CS))
            try f.write(version(v, 100), at: UInt64(((c + 5) % chunks) * CS + 1000))
            if v % 10 == 0 {
              try f.truncate(to: UInt64(chunks * CS - 5000))
              try f.write(version(v, 5777), at: UInt64(chunks * CS - 5000))
            }
          } catch { failures.withLock { $0.append("write: \(error)") } }
        }
        writerDone.withLock { $0 = true }
        return
      }
      var rng = SplitMix64(seed: UInt64(worker))
      var rounds = 0
      while rounds < 200 || !writerDone.withLock({ $0 }) {
        rounds += 1
        let whole = Bool.random(using: &rng)
        let first = Int.random(in: 0..<chunks, using: &rng)
        let offset = whole ? first * CS : first * CS + Int.random(in: 1..<CS, using: &rng)
        let count = whole ? CS * Int.random(in: 1...6, using: &rng) : 3000
        do {
          let got = try f.read(offset: UInt64(offset), count: count)
          // Within a chunk, bytes come from at most two writes of one version each (a whole
          // rewrite and a 100-byte patch): check that no byte is zero (torn or a hole).
          if got.contains(0) { failures.withLock { $0.append("zero byte at \(offset)") } }
        } catch { failures.withLock { $0.append("read at \(offset): \(error)") } }
      }
    }
    #expect(failures.withLock { $0 } == [])
    // After the writes returned, a read sees the last one.
    #expect(try f.read(offset: UInt64(chunks * CS - 5000), count: 5777) == version(120, 5777))
    try f.close()
  }
}

@Suite struct CryptoFileDescriptorTests {
  /// An open that fails after the file took its descriptor (the last chunk fails
  /// authentication) closes that descriptor once: a second close would close whatever another
  /// thread opened under the same number meanwhile. A sentinel thread keeps opening a file and
  /// checks that its descriptor stays open and names that file while opens fail beside it.
  @Test func failedOpenClosesItsDescriptorOnce() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let url = dir.appendingPathComponent("f")
    let f = try CryptoFile.create(at: url, key: SecureRandom.bytes(32))
    try f.write(Data(repeating: 7, count: 1000), at: 0)
    try f.close()
    let sentinel = dir.appendingPathComponent("sentinel").path
    #expect(FileManager.default.createFile(atPath: sentinel, contents: Data("s".utf8)))
    var st = stat()
    #expect(stat(sentinel, &st) == 0)
    let inode = st.st_ino
    let stop = Mutex(false)
    let damage = Mutex<[String]>([])
    let finished = DispatchSemaphore(value: 0)
    try Threads.start(name: "test.sentinel") {
      defer { finished.signal() }
      while !stop.withLock({ $0 }) {
        let fd = open(sentinel, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { continue }
        // Long enough for a stray close elsewhere to land while the descriptor is open.
        for _ in 0..<4 {
          var s = stat()
          if fstat(fd, &s) != 0 {
            damage.withLock { $0.append("fstat: errno \(errno)") }
            return
          }
          if s.st_ino != inode {
            damage.withLock { $0.append("descriptor now names another file") }
            return
          }
        }
        if close(fd) != 0 {
          damage.withLock { $0.append("close: errno \(errno)") }
          return
        }
      }
    }
    let wrongKey = SecureRandom.bytes(32)
    var failures = 0
    for _ in 0..<3000 {
      if damage.withLock({ !$0.isEmpty }) { break }
      do { _ = try CryptoFile.open(at: url, key: wrongKey) } catch { failures += 1 }
    }
    stop.withLock { $0 = true }
    finished.wait()
    #expect(failures > 0)
    #expect(damage.withLock { $0 } == [])
  }
}
