import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// Permission bits and set-user-ID clearing, as a local file system applies them, compared
/// step by step with a plain directory: for an unprivileged user who mounts and uses the mount
/// (the file system checks the bits itself then), and for the superuser.
@Suite(.serialized) struct PermissionMountTests {
  /// Each step prints its exit status or the resulting mode; only standard output is compared
  /// (error messages name the paths).
  static let script = """
    echo hi > f; chmod 0444 f; echo x > f; echo "write to 0444: $?"
    test -w f; echo "test -w: $?"; test -r f; echo "test -r: $?"; cat f
    chmod 0200 f; cat f; echo "read 0200: $?"; echo y >> f; echo "append 0200: $?"
    getfattr -n user.x f >/dev/null 2>&1; echo "getxattr 0200: $?"
    /usr/bin/python3 -c 'import os; os.listxattr("f")'; echo "listxattr 0200: $?"; ls -l f >/dev/null; echo "ls -l 0200: $?"
    chmod 0644 f; setfattr -n user.x -v 1 f; echo "setxattr 0644: $?"
    chmod 0444 f; setfattr -n user.y -v 1 f 2>/dev/null; echo "setxattr 0444: $?"
    touch -d @1000000000 f; echo "utime own 0444: $?"; : > f; echo "truncate 0444: $?"
    mkdir d; touch d/a; chmod 0500 d; touch d/b; echo "create in 0500: $?"
    rm d/a; echo "rm in 0500: $?"; mv d/a d/c; echo "mv in 0500: $?"; ls d
    mkdir d2; mv f d2/ 2>/dev/null; echo "mv to d2: $?"
    mkdir -p m/sub o; chmod 0555 m/sub; mv m/sub o/; echo "move 0555 dir: $?"; ls m o
    chmod 0755 m/sub; mv m/sub o/; echo "move 0755 dir: $?"; chmod 0555 o/sub
    mv o/sub o/renamed; echo "rename 0555 dir in place: $?"; ls o
    chmod 0300 d; ls d; echo "ls 0300: $?"; chmod 0600 d; cat d/a; echo "cat via 0600 dir: $?"
    cd d; echo "cd 0600: $?"; chmod 0755 d; cd d && cd ..; echo "cd 0755: $?"
    cp /bin/true t; ./t; echo "exec 0755: $?"; chmod 0644 t; ./t; echo "exec 0644: $?"
    test -x t; echo "test -x 0644: $?"
    echo s > s; chmod 4755 s; stat -c %a s; echo more >> s; stat -c %a s
    chmod 2775 s; echo more >> s; stat -c %a s; chmod 2745 s; echo more >> s; stat -c %a s
    chmod 6775 s; truncate -s 1 s; stat -c %a s
    chmod 4755 s; /usr/bin/python3 -c 'import os; os.truncate("s", 0)'; stat -c %a s
    chmod 4755 s; echo new > s; stat -c %a s; cat s
    /usr/bin/python3 -c 'import os
    os.umask(0); fd = os.open("cs", os.O_CREAT | os.O_WRONLY, 0o6775); os.write(fd, b"x"); os.close(fd)'
    stat -c %a cs
    echo y > fy; /usr/bin/python3 -c 'import os
    for name, flags in (("fx", os.O_CREAT | os.O_WRONLY), ("fy", os.O_WRONLY)):
        fd = os.open(name, flags, 0o644); os.fchmod(fd, 0o4755); os.write(fd, b"x"); os.close(fd)'
    stat -c %a fx fy
    echo m > mm; chmod 2750 mm; /usr/bin/python3 -c 'import mmap, os
    fd = os.open("mm", os.O_RDWR); m = mmap.mmap(fd, 2); m[0:1] = b"M"; m.flush(); m.close()'
    stat -c %a mm; cat mm
    """

  /// The script's standard output in `dir`, run by `user` (`nil`: this process's user).
  static func run(in dir: URL, as user: UInt32?) throws -> String {
    let prefix = user.map { ["setpriv", "--reuid=\($0)", "--regid=\($0)", "--clear-groups"] } ?? []
    let r = try runProcess(
      URL(fileURLWithPath: "/usr/bin/env"),
      prefix + ["bash", "-c", "cd '\(dir.path)' && { \(script)\n}"], environment: ["LC_ALL": "C"])
    return r.stdout
  }

  static let nobody: UInt32 = 65534

  @Test(.enabled(if: getuid() == 0, "needs root to act as another user"))
  func anUnprivilegedOwnerMeetsLocalPermissionRules() throws {
    let dir = try TemporaryDirectory("zdc-perm")
    // The user must reach the binary and own its directories; /dev/fuse must be open to it
    // (Debian makes it 0666; some containers keep it 0600, restored afterwards).
    chmod(dir.url.path, 0o755)
    let zdc = dir.path("zdc")
    try FileManager.default.copyItem(at: BuiltProducts.executable("zdc"), to: zdc)
    let home = dir.path("home")
    let reference = dir.path("reference")
    let mnt = dir.path("mnt")
    for d in [home, reference, mnt] {
      try FileManager.default.createDirectory(at: d, withIntermediateDirectories: true)
      try #require(chown(d.path, Self.nobody, Self.nobody) == 0)
    }
    var st = stat()
    try #require(stat("/dev/fuse", &st) == 0)
    let fuseMode = st.st_mode & 0o777
    if fuseMode & 0o006 != 0o006 { chmod("/dev/fuse", 0o666) }
    defer { if fuseMode & 0o006 != 0o006 { chmod("/dev/fuse", fuseMode) } }

    let env = [
      "HOME": home.path, "ZDC_STATE_DIR": home.path + "/state",
      "ZDC_PASSPHRASE": "permission test passphrase", "LC_ALL": "C",
    ]
    func asNobody(_ args: [String]) throws -> ProcessResult {
      try runProcess(
        URL(fileURLWithPath: "/usr/bin/setpriv"),
        ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups"] + args,
        environment: env)
    }
    let initResult = try asNobody([
      zdc.path, "init", "--kdf", "minimum", "--store", home.path + "/store",
    ])
    try #require(initResult.status == 0, "init: \(initResult.stderr)")
    let mounted = try asNobody([zdc.path, "mount", mnt.path])
    try #require(mounted.status == 0, "mount: \(mounted.stdout) \(mounted.stderr)")
    let pid = mounted.stdout.range(of: "process ").flatMap {
      pid_t(mounted.stdout[$0.upperBound...].prefix { $0.isNumber })
    }
    defer {
      _ = try? asNobody(["/usr/bin/fusermount3", "-u", "-z", mnt.path])
      if let pid {
        for _ in 0..<100 where kill(pid, 0) == 0 { usleep(50_000) }
        if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
      }
    }
    // The daemon holds the owner's unlocked keys: another process of the same user can read
    // neither its environment nor its memory (it is not dumpable, so /proc gives its files to
    // root), and a crash of it leaves no core dump.
    let daemon = try #require(pid)
    let peek = try asNobody(["/bin/cat", "/proc/\(daemon)/environ"])
    #expect(peek.status != 0 && peek.stderr.contains("Permission denied"), "\(peek.stderr)")
    // The check itself: the same user reads a dumpable process's environment.
    let other = try ChildProcess(
      "/usr/bin/setpriv",
      ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", "/bin/sleep", "30"])
    defer { other.stop() }
    usleep(200_000)
    let control = try asNobody(["/bin/cat", "/proc/\(other.pid)/environ"])
    #expect(control.status == 0, "the check itself: \(control.stderr)")
    // Everyday tools work for the owner (the file system's own checks in the way of each).
    let tools = try asNobody([
      "/bin/bash", "-c",
      """
      set -e; cd '\(mnt.path)'; cp -r /usr/include/X11 tree; diff -r /usr/include/X11 tree
      mkdir repo; cd repo; git init -q; git config user.email t@example.com; git config user.name t
      cp -r /usr/include/asm-generic .; git add -A; git commit -qm one
      sed -i 's/a/b/' asm-generic/errno.h; git commit -qam two; git checkout -q HEAD~1
      git checkout -q -; git gc -q; git fsck --no-progress; test -z "$(git status --porcelain)"
      cd ..; rm -r tree repo; test -z "$(ls -A)"
      """,
    ])
    #expect(tools.status == 0, "tools as the owner: \(tools.stdout) \(tools.stderr)")
    let expected = try Self.run(in: reference, as: Self.nobody)
    let got = try Self.run(in: mnt, as: Self.nobody)
    #expect(
      expected.contains("test -w: 1") && expected.hasSuffix("new\n775\n755\n755\n2750\nM\n"),
      "the reference run went wrong: \(expected)")
    #expect(got == expected)

    // Random operations, modes that refuse the owner among them (tools/fsx), against the
    // same user's local directory.
    let fsx = dir.path("fsx")
    try FileManager.default.copyItem(at: DifferentialMountTests.fsx, to: fsx)
    for seed in [21, 22] {
      let t = mnt.appendingPathComponent("fsx\(seed)")
      let r = reference.appendingPathComponent("fsx\(seed)")
      #expect(try asNobody(["/bin/mkdir", t.path, r.path]).status == 0)
      let run = try asNobody([
        "/usr/bin/python3", fsx.path, t.path, r.path, "--seed", "\(seed)", "--ops", "2000",
      ])
      #expect(run.status == 0, "fsx as the owner: \(run.stdout) \(run.stderr)")
    }
  }

  /// The options the kernel shows for a mount point.
  static func mountOptions(_ mnt: URL) throws -> [String] {
    let mounts = ProcFile.text("/proc/mounts")
    let line = mounts.split(separator: "\n").map { $0.split(separator: " ") }
      .first { $0.count > 3 && $0[1] == mnt.path }
    return try #require(line)[3].split(separator: ",").map(String.init)
  }

  /// The `kernel` part of `zdc status --json`.
  static func kernelFeatures(_ m: MountFixture) throws -> [String: Bool] {
    let r = try runProcess(m.zdc, ["status", "--json"], environment: m.env)
    let object = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any]
    return try #require(object?["kernel"] as? [String: Bool], "status: \(r.stdout) \(r.stderr)")
  }

  @Test func theKernelChecksPermissionBitsOnlyWhenOthersAreLetIn() throws {
    let own = try MountFixture()
    #expect(try !Self.mountOptions(own.mnt).contains("default_permissions"))
    let features = try Self.kernelFeatures(own)
    // `zdc status` says how requests come, and how to have them come through io_uring when the
    // kernel could and the fuse module's switch is off (the io_uring suite may turn it on).
    let transport = try IoUringMountTests.transportLine(own)
    if features["ioUring"] == true {
      #expect(transport == "Kernel transport: FUSE over io_uring.")
    } else if features["ioUringOffered"] != true, access(uringParameter, F_OK) == 0 {
      #expect(transport.hasPrefix("Kernel transport: /dev/fuse. This kernel can also serve"))
      #expect(transport.contains("`echo Y > \(uringParameter)`"), "\(transport)")
    } else {
      #expect(transport == "Kernel transport: /dev/fuse.")
    }
    #expect(features["kernelChecksPermissions"] == false)
    // Kernels from 5.11 on offer FUSE_HANDLE_KILLPRIV_V2; an offer is taken.
    var name = utsname()
    uname(&name)
    let release = withUnsafeBytes(of: name.release) {
      String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
    }
    let version = release.split(separator: ".").prefix(2).compactMap {
      Int($0.prefix { $0.isNumber })
    }
    if version.count == 2, version[0] > 5 || (version[0] == 5 && version[1] >= 11) {
      #expect(features["handleKillprivV2Offered"] == true, "kernel \(release)")
    }
    #expect(features["handleKillprivV2"] == features["handleKillprivV2Offered"])
    // Kernels from 6.6 on offer FUSE_DIRECT_IO_ALLOW_MMAP; an offer is taken.
    if version.count == 2, version[0] > 6 || (version[0] == 6 && version[1] >= 6) {
      #expect(features["directIOAllowMmapOffered"] == true, "kernel \(release)")
    }
    #expect(features["directIOAllowMmap"] == features["directIOAllowMmapOffered"])
    // Kernels from 5.1 on open directories without OPENDIR when the file system asks.
    if version.count == 2, version[0] > 5 || (version[0] == 5 && version[1] >= 1) {
      #expect(features["opendirSkipped"] == true, "kernel \(release)")
    }
    let shared = try MountFixture(mountArguments: ["-o", "allow_other"])
    let options = try Self.mountOptions(shared.mnt)
    #expect(options.contains("default_permissions") && options.contains("allow_other"))
    #expect(try Self.kernelFeatures(shared)["kernelChecksPermissions"] == true)
  }

  @Test func theSuperuserMeetsLocalPermissionRules() throws {
    let m = try MountFixture()
    let reference = m.dir.path("reference")
    try FileManager.default.createDirectory(at: reference, withIntermediateDirectories: true)
    let expected = try Self.run(in: reference, as: nil)
    let got = try Self.run(in: m.mnt, as: nil)
    #expect(got == expected)
  }
}
