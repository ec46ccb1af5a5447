import Foundation
import Testing
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The state directory (catalog, staging, cache) on a small tmpfs that fills up: writers get
/// `ENOSPC`, the mount keeps serving, nothing written before is lost, and once space is freed
/// everything works and reaches the store.
@Suite(.serialized) struct FullDiskTests {
  @Test(.enabled(if: getuid() == 0, "mounting a tmpfs needs root"))
  func aFullStateDiskIsENOSPCNeverACrashOrALoss() throws {
    let dir = try TemporaryDirectory("zdc-full")
    let small = dir.path("small")
    try FileManager.default.createDirectory(at: small, withIntermediateDirectories: true)
    let tmpfs = try runProcess(
      URL(fileURLWithPath: "/usr/bin/mount"), ["-t", "tmpfs", "-o", "size=6m", "tmpfs", small.path])
    try #require(tmpfs.status == 0, "mount tmpfs: \(tmpfs.stderr)")
    defer { _ = try? runProcess(URL(fileURLWithPath: "/usr/bin/umount"), ["-l", small.path]) }

    let zdc = BuiltProducts.executable("zdc")
    let state = small.appendingPathComponent("state")
    let store = dir.path("store")  // on the ordinary disk
    let mnt = dir.path("mnt")
    try FileManager.default.createDirectory(at: mnt, withIntermediateDirectories: true)
    let env = ["ZDC_STATE_DIR": state.path, "ZDC_PASSPHRASE": "full disk", "LC_ALL": "C"]
    let sh = URL(fileURLWithPath: "/bin/sh")
    func run(_ script: String) throws -> ProcessResult {
      try runProcess(sh, ["-c", "cd '\(mnt.path)' && \(script)"], environment: env)
    }
    var r = try runProcess(
      zdc, ["init", "--kdf", "minimum", "--store", store.path], environment: env)
    try #require(r.status == 0, "init: \(r.stderr)")
    r = try runProcess(zdc, ["mount", mnt.path], environment: env)
    try #require(r.status == 0, "mount: \(r.stderr)")
    var pid: pid_t?
    if let range = r.stdout.range(of: "process ") {
      pid = pid_t(r.stdout[range.upperBound...].prefix { $0.isNumber })
    }
    defer {
      _ = try? runProcess(zdc, ["unmount", "--no-wait", mnt.path], environment: env)
      _ = try? runProcess(URL(fileURLWithPath: "/usr/bin/fusermount3"), ["-u", "-z", mnt.path])
      if let pid {
        for _ in 0..<100 where kill(pid, 0) == 0 { usleep(50_000) }
        if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
      }
    }

    r = try run("printf 'written before the disk filled\\n' > before.txt")
    #expect(r.status == 0, "\(r.stderr)")
    // More than the tmpfs holds.
    r = try run("head -c 12000000 /dev/urandom > big.bin")
    #expect(r.status != 0)
    #expect(r.stderr.contains("No space left on device"), "\(r.stderr)")
    let log =
      (try? String(contentsOf: state.appendingPathComponent("mount.log"), encoding: .utf8)) ?? ""
    #expect(log.contains("no space left"), "no log line for the full disk")

    // The failed write's staging version is discarded once the kernel's release (sent after
    // close(2) returned) reaches the daemon: wait for its space, or the filler below would
    // find the disk full and the discard would then free room for the catalog writes.
    func usedBytes() -> UInt64 {
      var s = statvfs()
      guard statvfs(small.path, &s) == 0 else { return 0 }
      return UInt64(s.f_blocks - s.f_bfree) * UInt64(s.f_frsize)
    }
    for _ in 0..<1000 where usedBytes() > 3 << 20 { usleep(10_000) }
    #expect(usedBytes() <= 3 << 20, "the failed write's staged bytes were not discarded")
    // The disk filled by something else: creating names (catalog writes) fails the same way.
    let filler = small.appendingPathComponent("filler")
    _ = try runProcess(sh, ["-c", "head -c 8000000 /dev/zero > '\(filler.path)'"])
    for _ in 0..<3 {
      r = try run("mkdir newdir && touch newdir/new.txt")
      if r.status != 0 { break }
      _ = try run("rm -r newdir")
    }
    #expect(r.status != 0)
    #expect(r.stderr.contains("No space left on device"), "\(r.stderr)")
    try FileManager.default.removeItem(at: filler)

    // Still serving; what was there is intact.
    r = try run("cat before.txt && ls")
    #expect(r.status == 0, "\(r.stderr)")
    #expect(r.stdout.contains("written before the disk filled"))

    // Freeing space: writing works again, and everything reaches the store.
    r = try run("rm -f big.bin && printf 'written after\\n' > after.txt && cat after.txt")
    #expect(r.status == 0, "\(r.stderr)")
    r = try runProcess(zdc, ["sync"], environment: env)
    #expect(r.status == 0, "sync: \(r.stdout) \(r.stderr)")
    r = try runProcess(zdc, ["unmount", mnt.path], environment: env)
    #expect(r.status == 0, "unmount: \(r.stderr)")

    // A second device sees both files.
    let env2 = [
      "ZDC_STATE_DIR": dir.path("state2").path, "ZDC_PASSPHRASE": "full disk", "LC_ALL": "C",
    ]
    r = try runProcess(
      zdc, ["init", "--join", "--kdf", "minimum", "--store", store.path], environment: env2)
    try #require(r.status == 0, "join: \(r.stderr)")
    r = try runProcess(zdc, ["mount", mnt.path], environment: env2)
    try #require(r.status == 0, "mount 2: \(r.stderr)")
    var pid2: pid_t?
    if let range = r.stdout.range(of: "process ") {
      pid2 = pid_t(r.stdout[range.upperBound...].prefix { $0.isNumber })
    }
    defer {
      _ = try? runProcess(zdc, ["unmount", "--no-wait", mnt.path], environment: env2)
      if let pid2 {
        for _ in 0..<100 where kill(pid2, 0) == 0 { usleep(50_000) }
        if kill(pid2, 0) == 0 { kill(pid2, SIGKILL) }
      }
    }
    _ = try runProcess(zdc, ["sync"], environment: env2)
    r = try runProcess(
      sh, ["-c", "cd '\(mnt.path)' && cat before.txt after.txt && ls"], environment: env2)
    #expect(
      r.stdout == "written before the disk filled\nwritten after\nafter.txt\nbefore.txt\n",
      "\(r.stderr)")
  }
}
