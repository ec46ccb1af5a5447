import Foundation
import Testing
import ZDCCore

@testable import ZDCCrypto

let C = CloudFileFormat.chunkSize

@Suite struct CloudFileTests {
  let key = SecureRandom.nodeKey()

  static let dataSizes: [Int] = [
    0, 1, 63, 64, C - 64 - 1, C - 64, C - 64 + 1, C - 1, C, C + 1, 2 * C - 64, 2 * C - 63,
    2 * C, 3 * C + 17,
  ]

  @Test(arguments: dataSizes)
  func roundTripDataOnly(size: Int) throws {
    var rng = SplitMix64(seed: UInt64(size))
    let data = randomBytes(size, &rng)
    let object = try encodeCloudFile(key: key, data: data)
    #expect(
      UInt64(object.count)
        == CloudFileEncoder.encodedSize(metadataSize: 0, thumbnailSize: 0, dataSize: UInt64(size)))
    let (m, t, d) = try decodeAll(key: key, object: object)
    #expect(m.isEmpty && t.isEmpty)
    #expect(d == data)
  }

  @Test func roundTripRandomSectionsAndSources() throws {
    var rng = SplitMix64(seed: 99)
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    for round in 0..<24 {
      let m = randomBytes(Int.random(in: 0...(round % 3 == 0 ? 70_000 : 300), using: &rng), &rng)
      let t = randomBytes(Int.random(in: 0...(round % 4 == 0 ? 140_000 : 500), using: &rng), &rng)
      let d = randomBytes(Int.random(in: 0...300_000, using: &rng), &rng)
      let expectedSize = CloudFileEncoder.encodedSize(
        metadataSize: UInt64(m.count), thumbnailSize: UInt64(t.count), dataSize: UInt64(d.count))
      let encoder = try CloudFileEncoder(key: key)
      var object = Data()
      switch round % 3 {
      case 0:
        try encoder.encode(metadata: m, thumbnail: t, data: .data(d)) { object.append($0) }
      case 1:
        let src = dir.appendingPathComponent("src\(round)")
        try d.write(to: src)
        let dst = dir.appendingPathComponent("dst\(round)")
        try encoder.encode(metadata: m, thumbnail: t, data: .file(src), toFileAt: dst)
        object = try Data(contentsOf: dst)
      default:
        var pos = 0
        try encoder.encode(
          metadata: m, thumbnail: t,
          data: .reader(size: UInt64(d.count)) { buf in
            // Deliberately short reads.
            let n = min(buf.count, d.count - pos, 5000)
            d.withUnsafeBytes {
              buf.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[pos..<(pos + n)]))
            }
            pos += n
            return n
          }
        ) { object.append($0) }
      }
      #expect(UInt64(object.count) == expectedSize)
      let (m2, t2, d2) = try decodeAll(key: key, object: object)
      #expect(m2 == m)
      #expect(t2 == t)
      #expect(d2 == d)
      // Streaming decode of each section.
      let reader = try CloudFileReader(
        key: key, ciphertextSize: UInt64(object.count), fetch: FetchLog(object).fetch)
      for (section, expected) in [(CloudFileSection.metadata, m), (.thumbnail, t), (.data, d)] {
        var streamed = Data()
        try reader.stream(section, chunksPerFetch: 1 + round % 3) { streamed.append($0) }
        #expect(streamed == expected)
      }
      #expect(
        reader.sizes
          == CloudFileSizes(
            metadataSize: UInt64(m.count), thumbnailSize: UInt64(t.count), dataSize: UInt64(d.count)
          ))
    }
  }

  @Test func readerSourceMustMatchDeclaredSize() throws {
    let encoder = try CloudFileEncoder(key: key)
    #expect(throws: CryptoError.self) {
      try encoder.encode(data: .reader(size: 10) { _ in 0 }) { _ in }
    }
    #expect(throws: CryptoError.self) {
      try encoder.encode(data: .reader(size: 0) { buf in buf.count }) { _ in }
    }
  }

  @Test func layoutArithmetic() {
    #expect(CloudFileFormat.chunkCount(plaintextSize: 64) == 1)
    #expect(CloudFileFormat.chunkCount(plaintextSize: UInt64(C)) == 1)
    #expect(CloudFileFormat.chunkCount(plaintextSize: UInt64(C + 1)) == 2)
    #expect(CloudFileFormat.chunks(forPlaintext: ByteRange(5, 5)).isEmpty)
    #expect(CloudFileFormat.chunks(forPlaintext: ByteRange(0, UInt64(C))) == 0..<1)
    #expect(CloudFileFormat.chunks(forPlaintext: ByteRange(UInt64(C) - 1, UInt64(C) + 1)) == 0..<2)
    let p = UInt64(3 * C + 100)
    #expect(
      CloudFileFormat.ciphertextRange(forChunks: 1..<3, plaintextSize: p)
        == ByteRange(32 + UInt64(C + 16), 32 + 3 * UInt64(C + 16)))
    #expect(
      CloudFileFormat.ciphertextRange(forChunks: 3..<4, plaintextSize: p)
        == ByteRange(32 + 3 * UInt64(C + 16), 32 + 3 * UInt64(C + 16) + 116))
    for size in [64, 65, C, C + 1, 5 * C + 3] {
      let total = CloudFileFormat.ciphertextSize(plaintextSize: UInt64(size))
      #expect(CloudFileFormat.plaintextSize(ciphertextSize: total) == UInt64(size))
    }
    #expect(CloudFileFormat.plaintextSize(ciphertextSize: 32 + UInt64(C + 16) + 16) == nil)
    #expect(CloudFileFormat.plaintextSize(ciphertextSize: 100) == nil)
    #expect(CloudFileFormat.plaintextSize(ciphertextSize: .max) == nil)
    #expect(CloudFileFormat.plaintextSize(metadataSize: .max, thumbnailSize: 1, dataSize: 0) == nil)
  }

  @Test func rangeReadsFetchOnlyNeededChunks() throws {
    var rng = SplitMix64(seed: 5)
    let m = randomBytes(1000, &rng)
    let t = randomBytes(C + 10, &rng)
    let d = randomBytes(6 * C + 333, &rng)
    let object = try encodeCloudFile(key: key, metadata: m, thumbnail: t, data: d)
    let log = FetchLog(object)
    let reader = try CloudFileReader(
      key: key, ciphertextSize: UInt64(object.count), fetch: log.fetch)
    #expect(log.ranges.count == 1)
    let sizes = reader.sizes
    for _ in 0..<300 {
      let section = CloudFileSection.allCases.randomElement(using: &rng)!
      let plain = section == .metadata ? m : section == .thumbnail ? t : d
      let lo = Int.random(in: 0...plain.count, using: &rng)
      let len = Int.random(in: 0...(Bool.random(using: &rng) ? 4096 : 3 * C), using: &rng)
      let hi = min(plain.count, lo + len)
      log.reset()
      let got = try reader.read(section, range: ByteRange(UInt64(lo), UInt64(lo + len)))
      #expect(got == plain.subdata(in: lo..<hi))
      // Exactly the chunks covering the window, chunk 0 excepted (kept from init), in one fetch.
      let s = sizes.streamRange(of: section)
      var chunks = CloudFileFormat.chunks(
        forPlaintext: ByteRange(s.lowerBound + UInt64(lo), s.lowerBound + UInt64(hi)))
      if chunks.lowerBound == 0 && !chunks.isEmpty { chunks = 1..<chunks.upperBound }
      if chunks.isEmpty {
        #expect(log.ranges.isEmpty)
      } else {
        #expect(
          log.ranges
            == [
              CloudFileFormat.ciphertextRange(
                forChunks: chunks, plaintextSize: reader.plaintextSize)
            ])
      }
    }
    // A read past the end is short, like a file read.
    #expect(try reader.read(.metadata, range: ByteRange(990, 5000)) == m.subdata(in: 990..<1000))
    #expect(
      try reader.read(.data, range: ByteRange(UInt64(d.count) + 1, UInt64(d.count) + 9)).isEmpty)
  }

  /// A multi-chunk object and its chunk boundaries for tamper tests.
  func tamperSubject() throws -> (object: Data, chunkStarts: [Int]) {
    var rng = SplitMix64(seed: 11)
    let object = try encodeCloudFile(
      key: key, metadata: randomBytes(10, &rng), thumbnail: randomBytes(20, &rng),
      data: randomBytes(3 * C + 500, &rng))
    let e = C + 16
    let starts = Array(stride(from: 32, to: object.count, by: e))
    #expect(starts.count == 4)
    return (object, starts)
  }

  func expectRejected(_ object: Data, key: Data? = nil, _ what: String) {
    #expect(throws: (any Error).self, "\(what)") {
      _ = try decodeAll(key: key ?? self.key, object: object)
    }
  }

  @Test func detectsBitFlipsEverywhere() throws {
    let (object, starts) = try tamperSubject()
    var positions = Array(0..<32)  // whole outer header
    for s in starts {
      let end = min(s + C + 16, object.count)
      positions += [s, s + 1, s + 64, (s + end) / 2, end - 17, end - 16, end - 8, end - 1]
    }
    var rng = SplitMix64(seed: 3)
    positions += (0..<64).map { _ in Int.random(in: 0..<object.count, using: &rng) }
    for p in positions {
      for bit in [0, 7] {
        var t = object
        t[p] ^= UInt8(1 << bit)
        expectRejected(t, "bit \(bit) of byte \(p)")
      }
    }
  }

  @Test func detectsStructuralTampering() throws {
    let (object, starts) = try tamperSubject()
    func chunk(_ i: Int) -> Data {
      object.subdata(in: starts[i]..<(i + 1 < starts.count ? starts[i + 1] : object.count))
    }
    let header = object.prefix(32)
    expectRejected(header + chunk(0) + chunk(2) + chunk(3), "dropped chunk 1")
    expectRejected(header + chunk(0) + chunk(1) + chunk(2), "dropped last chunk")
    expectRejected(header + chunk(0) + chunk(1) + chunk(1) + chunk(2) + chunk(3), "duplicated")
    expectRejected(header + chunk(0) + chunk(2) + chunk(1) + chunk(3), "reordered")
    expectRejected(header + chunk(1) + chunk(0) + chunk(2) + chunk(3), "reordered with 0")
    expectRejected(object.prefix(starts[3]), "truncated at a chunk boundary")
    expectRejected(object.prefix(starts[2] + 1000), "truncated mid-chunk")
    expectRejected(object.prefix(object.count - 1), "one byte short")
    expectRejected(object.prefix(40), "header only")
    expectRejected(Data(), "empty")
    for size in [UInt64.max, 1 << 62, UInt64(object.count) * 2] {
      #expect(throws: CryptoError.self, "claimed size \(size)") {
        _ = try CloudFileReader(key: key, ciphertextSize: size, fetch: FetchLog(object).fetch)
      }
    }
    expectRejected(object + Data([0]), "one byte appended")
    expectRejected(object + Data(count: 16), "16 bytes appended")
    expectRejected(object + chunk(3), "last chunk repeated")
    expectRejected(object, key: SecureRandom.nodeKey(), "wrong key")
    // Splicing a chunk from another version of the same content under the same key.
    let other = try tamperSubject().object
    expectRejected(object.prefix(starts[1]) + other.subdata(in: starts[1]..<other.count), "spliced")
  }

  @Test func streamingDecodeDetectsTampering() throws {
    let (object, starts) = try tamperSubject()
    for p in [starts[1] + 5, starts[2] + C, starts[3] + 20, object.count - 1] {
      var t = object
      t[p] ^= 0x80
      let reader = try CloudFileReader(
        key: key, ciphertextSize: UInt64(t.count), fetch: FetchLog(t).fetch)
      var got = Data()
      #expect(throws: CryptoError.self, "flip at \(p)") {
        try reader.stream(.data) { got.append($0) }
      }
      // Whatever was delivered before the error is a correct prefix.
      let good = try decodeAll(key: key, object: object).2
      #expect(good.prefix(got.count) == got)
    }
  }

  @Test func failedEncodeToFileLeavesNothing() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let dst = dir.appendingPathComponent("out")
    #expect(throws: CryptoError.self) {
      try CloudFileEncoder(key: key).encode(data: .reader(size: 100_000) { _ in 0 }, toFileAt: dst)
    }
    #expect(!FileManager.default.fileExists(atPath: dst.path))
  }

  @Test func encodeToFileIsPacedBeforeEachPieceAndStopsWhenPacingThrows() throws {
    let dir = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: dir) }
    let dst = dir.appendingPathComponent("out")
    let data = Data(repeating: 7, count: 3 * C)
    // The outer header, then one call per chunk (the inner header pushes the data into a
    // fourth chunk).
    var calls = 0
    try CloudFileEncoder(key: key).encode(data: .data(data), toFileAt: dst) { calls += 1 }
    #expect(calls == 1 + Int(CloudFileFormat.chunkCount(plaintextSize: UInt64(64 + 3 * C))))
    #expect(try decodeAll(key: key, object: Data(contentsOf: dst)).2 == data)
    struct Enough: Error {}
    calls = 0
    #expect(throws: Enough.self) {
      try CloudFileEncoder(key: key).encode(data: .data(data), toFileAt: dst) {
        calls += 1
        if calls == 3 { throw Enough() }
      }
    }
    #expect(!FileManager.default.fileExists(atPath: dst.path))
  }

  @Test func noPlaintextInObject() throws {
    let secret = "TOP-SECRET-CONTENT-\(UUID().uuidString)"
    let name = "SecretName-XYZZY"
    let data = Data(String(repeating: secret, count: 5000).utf8)
    let object = try encodeCloudFile(
      key: key, metadata: Data("{\"name\":\"\(name)\"}".utf8), thumbnail: Data(name.utf8),
      data: data)
    #expect(!contains(object, secret))
    #expect(!contains(object, name))
    #expect(!contains(object, "ZDCCLOUD"))
    #expect(object.range(of: key) == nil)
  }
}
