import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// `zdc mount --busy-poll`: a worker thread polls the FUSE device only during bursts of
/// requests, never while the mount is idle; with 0 nothing polls, and the mount works the same.
@Suite(.serialized) struct BusyPollMountTests {
  /// User plus system CPU time of a process (all its threads), in seconds.
  static func cpuSeconds(_ pid: pid_t) throws -> Double {
    let stat = ProcFile.text("/proc/\(pid)/stat")
    // Fields after the command name (which may hold spaces) start at field 3.
    let afterName = try #require(stat.range(of: ") ")).upperBound
    let fields = stat[afterName...].split(separator: " ")
    let ticks = try #require(Double(fields[11])) + #require(Double(fields[12]))
    return ticks / Double(sysconf(Int32(_SC_CLK_TCK)))
  }

  static let burst = """
    import os
    os.mkdir("burst")
    for i in range(600):
        p = f"burst/f{i}"
        with open(p, "w") as f: f.write("x")
        os.stat(p)
        os.rename(p, p + ".r")
        os.unlink(p + ".r")
    print(len(os.listdir("burst")))
    """

  @Test(arguments: [nil, "0", "200"])
  func serverIsIdleAfterABurstAndTheBurstsOutcomeIsTheSame(busyPoll: String?) throws {
    let m = try MountFixture(mountArguments: busyPoll.map { ["--busy-poll", $0] } ?? [])
    defer { m.unmount() }
    let pid = try #require(m.pid)
    let r = try m.python(Self.burst)
    #expect(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0")
    // Idle: whatever polled during the burst has stopped. (A thread polling on would spend
    // about a second of CPU time per second here.)
    usleep(300_000)
    let before = try Self.cpuSeconds(pid)
    usleep(2_000_000)
    let idle = try Self.cpuSeconds(pid) - before
    #expect(idle < 0.5, "the idle server spent \(idle) s of CPU time in 2 s")
    try m.sh("echo kept > after.txt && cat after.txt && rm after.txt")
  }
}
