import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The mount's read-ahead (`zdc mount --readahead`): set for the superuser's mounts, where the
/// kernel lets it be set, and left alone with 0.
@Suite(.serialized) struct ReadaheadMountTests {
  /// The read-ahead of the mount at `mnt` in KiB, as the kernel shows it.
  static func readahead(_ mnt: URL) throws -> Int {
    var st = stat()
    try #require(stat(mnt.path, &st) == 0)
    let dev = UInt64(st.st_dev)
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~UInt64(0xfff))
    let minor = (dev & 0xff) | ((dev >> 12) & ~UInt64(0xff))
    let text = ProcFile.text("/sys/class/bdi/\(major):\(minor)/read_ahead_kb")
    return try #require(Int(text.trimmingCharacters(in: .whitespacesAndNewlines)), "\(text)")
  }

  @Test func theSuperusersMountReadsAheadAMebibyte() throws {
    let m = try MountFixture()
    let features = try PermissionMountTests.kernelFeatures(m)
    guard getuid() == 0 else {
      // Others may not set it: the kernel's default stays.
      #expect(features["readaheadSet"] == false)
      return
    }
    #expect(features["readaheadSet"] == true)
    #expect(try Self.readahead(m.mnt) == 1024)
    // Reads of a large file go through the larger requests intact.
    let file = m.mnt.appendingPathComponent("big")
    let content = Data((0..<(5 << 20) + 123).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ 17) })
    try content.write(to: file)
    let drop = try runProcess(
      URL(fileURLWithPath: "/bin/sh"), ["-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
    #expect(drop.status == 0)
    #expect(try Data(contentsOf: file) == content)
  }

  @Test func zeroLeavesTheKernelsDefault() throws {
    let m = try MountFixture(mountArguments: ["--readahead", "0"])
    #expect(try PermissionMountTests.kernelFeatures(m)["readaheadSet"] == false)
    #expect(try Self.readahead(m.mnt) == 128)
  }
}
