import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// `tools/mount.zdc`, the mount(8) helper: called directly as mount(8) calls it, and (as root)
/// through `mount -t fuse.zdc` and an fstab line.
@Suite(.serialized) struct MountHelperTests {
  static let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()
  static let helper = repo.appendingPathComponent("tools/mount.zdc")
  static let installed = URL(fileURLWithPath: "/sbin/mount.fuse.zdc")

  /// An account with a passphrase file and an empty mount point.
  struct Account {
    let dir: TemporaryDirectory
    let state: URL
    let mnt: URL
    let passFile: URL
    let zdc = BuiltProducts.executable("zdc")

    init() throws {
      dir = try TemporaryDirectory("zdc-helper")
      state = dir.path("state")
      mnt = dir.path("mnt")
      passFile = dir.path("pass")
      try FileManager.default.createDirectory(at: mnt, withIntermediateDirectories: true)
      try Data("helper passphrase\n".utf8).write(to: passFile)
      let r = try runProcess(
        zdc, ["init", "--kdf", "minimum", "--store", dir.path("store").path],
        environment: ["ZDC_STATE_DIR": state.path, "ZDC_PASSPHRASE": "helper passphrase"])
      try #require(r.status == 0, "init failed: \(r.stderr)")
    }

    /// The options a user puts in fstab, plus mount(8)'s own, which the helper must drop.
    var options: String {
      "rw,noauto,_netdev,nofail,nosuid,nodev,passphrase_file=\(passFile.path),zdc=\(zdc.path)"
    }

    var mountLine: Substring? {
      let mounts = ProcFile.text("/proc/mounts")
      return mounts.split(separator: "\n").first {
        $0.split(separator: " ").dropFirst().first.map(String.init) == mnt.path
      }
    }

    /// The serving process, from the control socket's answer.
    var daemonPID: pid_t? {
      let r = try? runProcess(
        zdc, ["status", "--json"], environment: ["ZDC_STATE_DIR": state.path])
      guard let data = r?.stdout.data(using: .utf8),
        let obj = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
      else { return nil }
      return (obj["pid"] as? Int).map { pid_t($0) }
    }

    /// Unmounts with umount(8) or fusermount3 and makes sure the daemon is gone.
    func cleanUp(_ pid: pid_t?) {
      if mountLine != nil {
        _ = try? runProcess(URL(fileURLWithPath: "/usr/bin/fusermount3"), ["-u", "-z", mnt.path])
      }
      guard let pid else { return }
      for _ in 0..<100 where kill(pid, 0) == 0 { usleep(50_000) }
      if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
    }
  }

  @Test func helperMountsWithFstabOptions() throws {
    let a = try Account()
    let r = try runProcess(
      URL(fileURLWithPath: "/bin/sh"),
      [
        Self.helper.path, a.state.path, a.mnt.path, "-o",
        a.options + ",cache_size=64M,io_uring_threads=3,transfers=9",
      ])
    let pid = a.daemonPID
    defer { a.cleanUp(pid) }
    try #require(r.status == 0, "mount.zdc: \(r.stdout) \(r.stderr)")
    let line = try #require(a.mountLine)
    #expect(line.split(separator: " ")[2] == "fuse.zdc")
    #expect(line.contains("nosuid") && line.contains("nodev"))
    // zdcfs's own option went to `zdc mount`, not to FUSE.
    #expect(
      !line.contains("cache_size") && !line.contains("io_uring") && !line.contains("transfers"))
    let daemon = ProcFile.text("/proc/\(try #require(pid))/cmdline")
      .split(separator: "\0").map(String.init)
    #expect(daemon.contains("--io-uring-threads") && daemon.contains("3"), "\(daemon)")
    #expect(
      zip(daemon, daemon.dropFirst()).contains { $0 == "--transfers" && $1 == "9" }, "\(daemon)")
    let status = try runProcess(
      a.zdc, ["status", "--json"], environment: ["ZDC_STATE_DIR": a.state.path])
    let obj = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
    #expect(obj?["cacheCapBytes"] as? Int == 64 << 20)
    try Data("through the helper".utf8).write(to: a.mnt.appendingPathComponent("note.txt"))
    let un = try runProcess(a.zdc, ["unmount", "--state-dir", a.state.path, a.mnt.path])
    #expect(un.status == 0, "\(un.stderr)")
    #expect(a.mountLine == nil)
  }

  @Test func helperRefusesAnUnknownProgramAndBadUsage() throws {
    let a = try Account()
    let sh = URL(fileURLWithPath: "/bin/sh")
    let usage = try runProcess(sh, [Self.helper.path, a.state.path])
    #expect(usage.status == 64)
    let missing = try runProcess(
      sh, [Self.helper.path, a.state.path, a.mnt.path, "-o", "zdc=/nonexistent/zdc"])
    #expect(missing.status != 0)
    #expect(missing.stderr.contains("cannot find the zdc program"))
    #expect(a.mountLine == nil)
  }

  /// Through mount(8) itself, with the helper installed where mount(8) looks for it. Needs root
  /// (to install the helper) and no other helper installed there; skipped (and reported as
  /// skipped) otherwise.
  @Test(
    .enabled(
      if: getuid() == 0
        && (try? FileManager.default.attributesOfItem(atPath: installed.path)) == nil
        && (try? FileManager.default.destinationOfSymbolicLink(atPath: installed.path)) == nil,
      "needs root and a free /sbin/mount.fuse.zdc"))
  func mountTypeFuseZdcAndAnFstabLine() throws {
    try FileManager.default.createSymbolicLink(at: Self.installed, withDestinationURL: Self.helper)
    defer { try? FileManager.default.removeItem(at: Self.installed) }
    let a = try Account()
    let mount = URL(fileURLWithPath: "/usr/bin/mount")
    let umount = URL(fileURLWithPath: "/usr/bin/umount")

    // mount -t fuse.zdc -o … SOURCE DIR
    var r = try runProcess(mount, ["-t", "fuse.zdc", "-o", a.options, a.state.path, a.mnt.path])
    var pid = a.daemonPID
    try #require(r.status == 0, "mount -t fuse.zdc: \(r.stderr)")
    try Data("written via mount -t".utf8).write(to: a.mnt.appendingPathComponent("one.txt"))
    r = try runProcess(umount, [a.mnt.path])
    #expect(r.status == 0, "\(r.stderr)")
    a.cleanUp(pid)

    // An fstab line (a private fstab file, as /etc/fstab would hold it): `mount DIR`.
    let fstab = a.dir.path("fstab")
    try Data("\(a.state.path) \(a.mnt.path) fuse.zdc \(a.options) 0 0\n".utf8).write(to: fstab)
    r = try runProcess(mount, ["-T", fstab.path, a.mnt.path])
    pid = a.daemonPID
    defer { a.cleanUp(pid) }
    try #require(r.status == 0, "mount with an fstab line: \(r.stderr)")
    // What the first mount wrote survived its umount(8).
    #expect(
      try Data(contentsOf: a.mnt.appendingPathComponent("one.txt"))
        == Data("written via mount -t".utf8))
    r = try runProcess(a.zdc, ["unmount", "--state-dir", a.state.path, a.mnt.path])
    #expect(r.status == 0, "\(r.stderr)")
    #expect(a.mountLine == nil)
  }
}
