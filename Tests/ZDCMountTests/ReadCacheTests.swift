import Foundation
import Testing
import ZDCCrypto
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The kernel's page cache across opens (`keep_cache`): kept while a file's bytes are
/// unchanged, dropped when a write through another descriptor, or a pull, gave it new bytes.
@Suite(.serialized) struct ReadCacheTests {
  /// Pages of `path` in the kernel's page cache, as `fincore` (mincore(2)) counts them.
  /// `fincore` opens the file read-only, so this also shows what such an open keeps.
  static func residentPages(_ sh: (String) throws -> ProcessResult, _ path: String) throws -> Int {
    let out = try sh("fincore --noheadings --raw --output PAGES '\(path)'").stdout
    return Int(out.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
  }

  @Test func keptPagesFollowWritesThroughOtherDescriptors() throws {
    let m = try MountFixture()
    defer { m.unmount() }
    let size = 256 << 10
    let a = Data(repeating: UInt8(ascii: "a"), count: size)
    let b = Data(repeating: UInt8(ascii: "b"), count: size)
    try a.write(to: m.mnt.appendingPathComponent("f"))
    #expect(try Data(contentsOf: m.mnt.appendingPathComponent("f")) == a)
    // The second read-only open of unchanged content keeps what the first one cached.
    #expect(try Self.residentPages({ try m.sh($0) }, "f") == size / 4096)
    #expect(try Data(contentsOf: m.mnt.appendingPathComponent("f")) == a)

    // A descriptor open for reading across a write through another one sees the new bytes,
    // and so does every later open (same size: only the bytes tell).
    try m.python(
      """
      import os
      r = os.open("f", os.O_RDONLY)
      assert os.pread(r, \(size), 0) == b"a" * \(size)
      w = os.open("f", os.O_WRONLY)
      os.pwrite(w, b"b" * \(size), 0)
      os.close(w)
      assert os.pread(r, \(size), 0) == b"b" * \(size), "stale read through the open descriptor"
      os.close(r)
      """)
    #expect(try Data(contentsOf: m.mnt.appendingPathComponent("f")) == b)

    // In-place writes through a new descriptor, then truncation and a rewrite to the same
    // size: each later open reads the new bytes.
    try m.sh("printf cccc | dd of=f bs=4 seek=1 conv=notrunc 2>/dev/null")
    var expected = b
    expected.replaceSubrange(4..<8, with: Data("cccc".utf8))
    #expect(try Data(contentsOf: m.mnt.appendingPathComponent("f")) == expected)
    try m.sh("truncate -s 0 f && python3 -c 'import sys; sys.stdout.write(\"d\" * \(size))' > f")
    #expect(
      try Data(contentsOf: m.mnt.appendingPathComponent("f"))
        == Data(repeating: UInt8(ascii: "d"), count: size))
  }

  /// A read smaller than its chunk decrypts the whole chunk; the rest of it goes to the
  /// kernel's page cache, so random reads of its other pages need no request. New files have
  /// 4 KiB chunks (a 4 KiB read is a whole chunk); files of earlier versions have 64 KiB
  /// chunks (made here with the mount's chunk size option). Writes and truncations through
  /// other descriptors are still seen by the descriptor that keeps reading.
  @Test(arguments: [nil, 16] as [Int?])
  func randomReadsFillThePageCacheAndFollowWrites(chunkShift: Int?) throws {
    let m = try MountFixture(mountArguments: chunkShift.map { ["--chunk-shift", "\($0)"] } ?? [])
    defer { m.unmount() }
    let pagesPerChunk = (1 << (chunkShift ?? Int(CryptoFile.defaultChunkShift))) / 4096
    try m.python(
      """
      import os, random, subprocess, time
      size = 1 << 20
      pages_per_chunk = \(pagesPerChunk)
      data = bytes((i * 7 + (i >> 16)) & 0xff for i in range(size))
      with open("r.bin", "wb") as f:
          f.write(data)
      def resident():
          out = subprocess.run(["fincore", "--noheadings", "--raw", "--output", "PAGES", "r.bin"],
                               capture_output=True, text=True, check=True).stdout
          return int(out.strip())
      rng = random.Random(1)
      fd = os.open("r.bin", os.O_RDONLY)
      os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead by the kernel
      chunks = [3, 9, 14]
      # The writer's release reaches the daemon after close(2) returned; until then nothing is
      # stored (a writable handle is open): try again a few times.
      for attempt in range(100):
          os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
          before = resident()
          for c in chunks:
              off = c * 65536 + 8192
              assert os.pread(fd, 4096, off) == data[off:off + 4096], off
          after = resident()
          # Every page of each chunk a read decrypted, not only the pages read.
          if after - before >= pages_per_chunk * len(chunks):
              break
          time.sleep(0.05)
      assert after - before >= pages_per_chunk * len(chunks), (before, after)
      w = os.open("r.bin", os.O_WRONLY)
      os.pwrite(w, b"Z" * 100000, 300000)
      os.close(w)
      new = data[:300000] + b"Z" * 100000 + data[400000:]
      for _ in range(300):
          off = rng.randrange(0, size // 4096) * 4096
          assert os.pread(fd, 4096, off) == new[off:off + 4096], off
      os.truncate("r.bin", 70000)
      assert os.fstat(fd).st_size == 70000
      for _ in range(50):
          off = rng.randrange(0, size // 4096) * 4096
          assert os.pread(fd, 4096, off) == new[off:min(off + 4096, 70000)], off
      os.close(fd)
      assert os.stat("r.bin").st_size == 70000
      with open("r.bin", "rb") as f:
          assert f.read() == new[:70000]
      """)
  }

  @Test func keptPagesAreDroppedWhenAPullChangesTheFile() throws {
    let dir = try TemporaryDirectory("zdc-read-cache")
    defer { SyncMountTests.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }
    let size = 200_000
    let first = Data(repeating: UInt8(ascii: "1"), count: size)
    let second = Data(repeating: UInt8(ascii: "2"), count: size)
    try first.write(to: a.file("shared.bin"))
    try a.sync()
    try b.sync()
    // B reads it twice: its kernel now holds the pages, and keeps them across opens.
    #expect(try Data(contentsOf: b.file("shared.bin")) == first)
    #expect(try Data(contentsOf: b.file("shared.bin")) == first)
    #expect(try Self.residentPages({ try b.sh($0) }, "shared.bin") > 0)
    // A changes every byte, keeping the size; B pulls: the next open must not show the old
    // pages.
    try second.write(to: a.file("shared.bin"))
    try a.sync()
    try b.sync()
    #expect(try Data(contentsOf: b.file("shared.bin")) == second)
  }
}
