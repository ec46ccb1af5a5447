import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

/// `zdc mount --cache-size`: the local cache stays under the cap (content read longest ago is
/// evicted, and downloaded again when read), `zdc status` reports the cache's size and cap, and
/// a size that is not one is refused.
@Suite(.serialized) struct CacheSizeMountTests {
  static func status(_ m: MountFixture) throws -> [String: Any] {
    let r = try runProcess(m.zdc, ["status", "--json"], environment: m.env)
    try #require(r.status == 0, "status: \(r.stderr)")
    return try #require(
      try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any])
  }

  /// Waits (up to 10 s) until the cache is under its cap, by the mount's count and by the
  /// files in its directory (evicted files are deleted shortly after they leave the index).
  static func cacheSettles(_ m: MountFixture) throws -> (used: Int, onDisk: Int, cap: Int) {
    var (used, onDisk, cap) = (Int.max, Int.max, 0)
    for _ in 0..<200 {
      let s = try status(m)
      (used, cap) = (s["cacheBytes"] as? Int ?? Int.max, s["cacheCapBytes"] as? Int ?? 0)
      onDisk = try bytes(in: m.state.appendingPathComponent("cache"))
      if used <= cap && onDisk <= cap { break }
      usleep(50_000)
    }
    return (used, onDisk, cap)
  }

  /// Bytes of the files in a directory.
  static func bytes(in dir: URL) throws -> Int {
    try FileManager.default.contentsOfDirectory(at: dir, includingPropertiesForKeys: [.fileSizeKey])
      .reduce(0) { $0 + (try $1.resourceValues(forKeys: [.fileSizeKey]).fileSize ?? 0) }
  }

  static let write = """
    import hashlib, os, random
    random.seed(7)
    os.mkdir("files")
    for i in range(30):
        with open(f"files/f{i}", "wb") as f: f.write(random.randbytes(100_000))
    print(" ".join(hashlib.sha256(open(f"files/f{i}", "rb").read()).hexdigest() for i in range(30)))
    """

  static let read = """
    import hashlib
    print(" ".join(hashlib.sha256(open(f"files/f{i}", "rb").read()).hexdigest() for i in range(30)))
    """

  @Test func theCacheStaysUnderItsCapAndEvictedContentIsDownloadedAgain() throws {
    let cap = 1 << 20
    let m = try MountFixture(mountArguments: ["--cache-size", "1M"])
    defer { m.unmount() }
    // 3 MB written: more than the cap. Once uploaded, the content is the evictable cache.
    let written = try m.python(Self.write)
    try #require(written.status == 0, "write: \(written.stderr)")
    let sync = try runProcess(m.zdc, ["sync"], environment: m.env)
    try #require(sync.status == 0, "sync: \(sync.stdout) \(sync.stderr)")
    var settled = try Self.cacheSettles(m)
    #expect(settled.cap == cap)
    #expect(settled.used <= cap)
    #expect(settled.onDisk <= cap)

    // After a remount (the kernel's page cache is gone), reading everything downloads what was
    // evicted, intact, and the cache settles under the cap again.
    m.unmount()
    try m.mount()
    let read = try m.python(Self.read)
    try #require(read.status == 0, "read: \(read.stderr)")
    #expect(read.stdout == written.stdout)
    settled = try Self.cacheSettles(m)
    #expect(settled.cap == cap)
    #expect(settled.used <= cap)
    #expect(settled.onDisk <= cap)

    let text = try runProcess(m.zdc, ["status"], environment: m.env)
    #expect(text.stdout.contains("Local cache: "))
    #expect(text.stdout.contains(" of 1.0 MB."))
  }

  @Test(arguments: ["banana", "0", "12Q", "-5M", "1.5"])
  func aSizeThatIsNotOneIsRefused(size: String) throws {
    let (r, created) = try MountFixture.mountWithBadOption(["--cache-size", size])
    #expect(r.status == 64)
    #expect(r.stderr.contains("--cache-size"))
    #expect(!created)
  }
}
