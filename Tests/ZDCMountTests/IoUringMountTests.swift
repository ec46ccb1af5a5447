import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The `fuse` module's switch for FUSE over io_uring: present on Linux 6.14+ built with it,
/// writable by the superuser.
let uringParameter = "/sys/module/fuse/parameters/enable_uring"

/// FUSE over io_uring (`zdc mount --io-uring-threads`): when the kernel offers it (the `fuse`
/// module's `enable_uring` parameter), requests come through one ring queue per CPU, served by
/// threads pinned to that CPU, and everything works as through /dev/fuse; the mount unmounts
/// cleanly; a request that waits long (a download) does not hold up its CPU's other requests;
/// `--io-uring-threads 0` refuses the offer.
///
/// The suite turns the kernel parameter on while it mounts and restores it afterwards. Mounts
/// made meanwhile by other suites may take the offer too; a mount keeps the transport it
/// started with.
@Suite(.serialized, .enabled(if: access(uringParameter, W_OK) == 0))
struct IoUringMountTests {
  static let parameter = uringParameter

  /// Runs `body` with the kernel's offer on, then puts the parameter back. `body` mounts and
  /// returns the mount points: the parameter stays on until each has answered a request, since
  /// the kernel reads it again when the server answers INIT.
  static func withTheTransportOn<T>(_ body: () throws -> (T, [URL])) throws -> T {
    let old = ProcFile.text(parameter).trimmingCharacters(in: .whitespacesAndNewlines)
    try Data("Y".utf8).write(to: URL(fileURLWithPath: parameter))
    defer { try? Data(old.utf8).write(to: URL(fileURLWithPath: parameter)) }
    let (value, mountpoints) = try body()
    for mnt in mountpoints {
      var st = stat()
      #expect(stat(mnt.path, &st) == 0, "\(mnt.path) does not answer")
    }
    return value
  }

  static func mountWithTheTransportOn(_ arguments: [String] = []) throws -> MountFixture {
    try withTheTransportOn {
      let m = try MountFixture(mountArguments: arguments)
      return (m, [m.mnt])
    }
  }

  /// The names of the mount daemon's threads.
  static func threadNames(_ pid: pid_t) throws -> [String] {
    try threads(pid).map(\.name)
  }

  /// The mount daemon's threads: name, and how often each went to sleep (a ring thread sleeps
  /// once per request it waits for).
  static func threads(_ pid: pid_t) throws -> [(name: String, sleeps: Int)] {
    let tasks = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")
    return tasks.map { task in
      let name = ProcFile.text("/proc/\(pid)/task/\(task)/comm")
        .trimmingCharacters(in: .whitespacesAndNewlines)
      let status = ProcFile.text("/proc/\(pid)/task/\(task)/status")
      let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches:") }
      let sleeps = line.flatMap { Int($0.split(separator: "\t").last ?? "") } ?? 0
      return (name, sleeps)
    }
  }

  static let cpus = Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))

  @Test func requestsComeThroughTheRingsAndTheMountWorksAsUsual() throws {
    let m = try Self.mountWithTheTransportOn()
    defer { m.unmount() }
    let pid = try #require(m.pid)
    // A tree copied in and compared, moved, listed, removed.
    try m.sh(
      "cp -r /usr/include/linux tree && diff -r /usr/include/linux tree && mv tree moved"
        + " && test \"$(find moved | wc -l)\" = \"$(find /usr/include/linux | wc -l)\""
        + " && ls -lR moved >/dev/null && du -s moved >/dev/null && rm -r moved && ! test -e moved")
    // Writes and reads of a megabyte at a time (the largest requests), sparse and at offsets.
    let source = m.dir.path("random.bin").path
    try m.sh(
      "head -c 9000000 /dev/urandom > '\(source)' && cp '\(source)' big && cmp '\(source)' big"
        + " && dd if='\(source)' of=big bs=4096 seek=3000 count=7 conv=notrunc status=none"
        + " && dd if=big bs=4096 skip=3000 count=7 status=none | cmp - '\(source)' -n 28672"
        + " && truncate -s 20M big && test \"$(stat -c %s big)\" = 20971520")
    // Attributes, extended attributes, links, an editor's save, git.
    try m.sh(
      "echo one > f && chmod 640 f && test \"$(stat -c %a f)\" = 640"
        + " && setfattr -n user.colour -v blue f && test \"$(getfattr --only-values -n user.colour f)\" = blue"
        + " && ln -s f link && test \"$(readlink link)\" = f && test \"$(cat link)\" = one"
        + " && sed -i s/one/two/ f && test \"$(cat f)\" = two"
        + " && git init -q g && cd g && echo x > a && git add a"
        + " && git -c user.email=t@example.com -c user.name=t commit -qm first"
        + " && test -z \"$(git status --porcelain)\"")
    // Senders on every CPU at once: each CPU's queue serves its own.
    let perCPU = (0..<Self.cpus).map { cpu in
      "taskset -c \(cpu) sh -c 'mkdir c\(cpu) && for i in $(seq 200); do echo $i > c\(cpu)/f$i;"
        + " mv c\(cpu)/f$i c\(cpu)/g$i; done; test $(ls c\(cpu) | wc -l) = 200' &"
    }
    try m.sh(
      "{ " + perCPU.joined(separator: " ") + " wait; } && test $(ls -d c* | wc -l) = \(Self.cpus)"
        + " && for c in c*; do test $(ls $c | wc -l) = 200; done")
    let features = try PermissionMountTests.kernelFeatures(m)
    #expect(features["ioUringOffered"] == true && features["ioUring"] == true, "\(features)")
    #expect(try Self.transportLine(m) == "Kernel transport: FUSE over io_uring.")
    // Each CPU's queue served its sender's requests (several per file).
    let threads = try Self.threads(pid)
    for cpu in 0..<Self.cpus {
      let served = threads.filter { $0.name == "zdc.uring.\(cpu)" }.map(\.sleeps).reduce(0, +)
      #expect(served > 400, "CPU \(cpu)'s ring threads waited \(served) times: \(threads)")
    }
    // Unmounted politely, the daemon ends by itself: the kernel ends the rings' commands.
    let r = try runProcess(m.zdc, ["unmount", m.mnt.path], environment: m.env)
    #expect(r.status == 0, "unmount: \(r.stdout) \(r.stderr)")
    var ended = false
    for _ in 0..<200 {
      if kill(pid, 0) != 0 {
        ended = true
        break
      }
      usleep(50_000)
    }
    #expect(ended, "the daemon still runs 10 s after unmount")
  }

  @Test func zeroThreadsRefuseTheOffer() throws {
    let m = try Self.mountWithTheTransportOn(["--io-uring-threads", "0"])
    defer { m.unmount() }
    try m.sh("echo kept > a && test \"$(cat a)\" = kept && mkdir d && mv a d/ && ls d")
    let features = try PermissionMountTests.kernelFeatures(m)
    #expect(features["ioUringOffered"] == true && features["ioUring"] == false, "\(features)")
    #expect(try !Self.threadNames(#require(m.pid)).contains { $0.hasPrefix("zdc.uring") })
    // Offered and refused: no advice to turn on what is on.
    #expect(try Self.transportLine(m) == "Kernel transport: /dev/fuse.")
  }

  /// The line of `zdc status` that says how requests reach the mount.
  static func transportLine(_ m: MountFixture) throws -> String {
    let r = try runProcess(m.zdc, ["status"], environment: m.env)
    let line = r.stdout.split(separator: "\n").first { $0.hasPrefix("Kernel transport:") }
    return String(try #require(line, "status: \(r.stdout) \(r.stderr)"))
  }

  /// A download that waits (its object in the store is a FIFO nobody writes to) holds one
  /// serving thread of CPU 0's queue; the queue gets another thread, and CPU 0's other
  /// requests go on. Once the object is back, the file reads intact.
  @Test func aLongRequestDoesNotHoldUpItsCPUsOtherRequests() throws {
    let dir = try TemporaryDirectory("zdc-uring")
    let store = dir.path("store")
    let (a, b) = try Self.withTheTransportOn {
      let (a, b) = try SyncDevice.pair(in: dir, store: store)
      return ((a, b), [a.mnt, b.mnt])
    }
    defer { SyncDevice.unmountAll([a, b]) }
    let source = dir.path("slow.bin").path
    try a.sh(
      "head -c 300000 /dev/urandom > '\(source)' && cp '\(source)' slow && echo fast > other")
    try a.sync()
    try b.sync()
    #expect(try b.ls() == ["other", "slow"])
    let objects = SyncMountTests.dataObjects(store)
    let slowObject = try #require(
      objects.first {
        ((try? FileManager.default.attributesOfItem(atPath: $0)[.size] as? Int) ?? 0) > 300000
      }, "objects: \(objects)")
    let saved = slowObject + ".saved"
    try FileManager.default.moveItem(atPath: slowObject, toPath: saved)
    #expect(mkfifo(slowObject, 0o600) == 0)
    var released = false
    // Lets the waiting download go on: it finds no object file and fails.
    func release() {
      guard !released else { return }
      released = true
      let fd = open(slowObject, O_WRONLY | O_NONBLOCK)
      if fd >= 0 { close(fd) }
    }
    defer { release() }

    let reader = Process()
    reader.executableURL = URL(fileURLWithPath: "/usr/bin/taskset")
    reader.arguments = ["-c", "0", "cat", b.file("slow").path]
    reader.standardOutput = FileHandle.nullDevice
    reader.standardError = FileHandle.nullDevice
    try reader.run()
    usleep(500_000)
    #expect(reader.isRunning, "the download did not wait")
    let start = Date()
    let r = try runProcess(
      URL(fileURLWithPath: "/usr/bin/timeout"),
      [
        "20", "taskset", "-c", "0", "sh", "-c",
        "cd '\(b.mnt.path)' && cat other && ls && stat -c %s other",
      ])
    let took = Date().timeIntervalSince(start)
    #expect(r.status == 0 && r.stdout.hasPrefix("fast\n"), "\(r.stdout) \(r.stderr)")
    #expect(took < 5, "CPU 0's requests waited \(took) s behind the download")
    let names = try Self.threadNames(#require(b.pid))
    #expect(names.filter { $0 == "zdc.uring.0" }.count >= 2, "threads: \(names)")

    release()
    reader.waitUntilExit()
    try FileManager.default.removeItem(atPath: slowObject)
    try FileManager.default.moveItem(atPath: saved, toPath: slowObject)
    try b.sh("cmp '\(source)' slow")
  }
}

extension IoUringMountTests {
  /// Where this process may not make io_uring rings (here: sysctl kernel.io_uring_disabled=2),
  /// the offer is left and /dev/fuse serves; nothing waits for rings that cannot come.
  @Test(.enabled(if: access("/proc/sys/kernel/io_uring_disabled", W_OK) == 0))
  func withoutRingsTheMountServesThroughTheDevice() throws {
    let sysctl = URL(fileURLWithPath: "/proc/sys/kernel/io_uring_disabled")
    let old = ProcFile.text(sysctl.path).trimmingCharacters(in: .whitespacesAndNewlines)
    try Data("2".utf8).write(to: sysctl)
    let m: MountFixture
    do {
      defer { try? Data(old.utf8).write(to: sysctl) }
      m = try Self.mountWithTheTransportOn()
    }
    defer { m.unmount() }
    try m.sh("echo kept > a && test \"$(cat a)\" = kept && mkdir d && mv a d/ && ls d")
    let features = try PermissionMountTests.kernelFeatures(m)
    #expect(features["ioUringOffered"] == true && features["ioUring"] == false, "\(features)")
  }
}

/// Counts outside their range (`--io-uring-threads` 0…64, `--transfers` 1…64) are refused
/// before anything is created.
@Suite struct MountCountOptionTests {
  @Test(arguments: [
    ("--io-uring-threads", "65"), ("--io-uring-threads", "-1"), ("--io-uring-threads", "two"),
    ("--transfers", "0"), ("--transfers", "65"), ("--transfers", "many"),
  ])
  func aCountOutOfRangeIsRefused(option: String, count: String) throws {
    let (r, created) = try MountFixture.mountWithBadOption([option, count])
    #expect(r.status == 64)
    #expect(r.stderr.contains(option), "\(r.stderr)")
    #expect(!created)
  }
}
