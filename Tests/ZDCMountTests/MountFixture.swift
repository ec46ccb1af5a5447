import Foundation
import Testing
import ZDCCore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// A fresh account, mounted with the real `zdc` binary in a temporary directory; always
/// unmounted (and its process killed if it lingers) when released.
final class MountFixture: @unchecked Sendable {
  // @unchecked: used by one test at a time.
  let dir: TemporaryDirectory
  let state: URL
  let store: URL
  let mnt: URL
  let zdc = BuiltProducts.executable("zdc")
  var pid: pid_t?

  var env: [String: String] {
    ["ZDC_STATE_DIR": state.path, "ZDC_PASSPHRASE": "mount test passphrase", "LC_ALL": "C"]
  }

  /// Extra arguments of `zdc mount`.
  let mountArguments: [String]
  /// The serving process's `RLIMIT_FSIZE` (bytes), when it has one.
  let fileSizeLimit: UInt64?

  init(mountArguments: [String] = [], fileSizeLimit: UInt64? = nil) throws {
    self.mountArguments = mountArguments
    self.fileSizeLimit = fileSizeLimit
    dir = try TemporaryDirectory("zdc-mount")
    state = dir.path("state")
    store = dir.path("store")
    mnt = dir.path("mnt")
    try FileManager.default.createDirectory(at: mnt, withIntermediateDirectories: true)
    let r = try runProcess(
      zdc, ["init", "--kdf", "minimum", "--store", store.path], environment: env)
    try #require(r.status == 0, "init failed: \(r.stderr)")
    try mount()
  }

  deinit { unmount() }

  var isMounted: Bool {
    let mounts = ProcFile.text("/proc/mounts")
    return mounts.split(separator: "\n").contains {
      $0.split(separator: " ").dropFirst().first.map(String.init) == mnt.path
    }
  }

  func mount() throws {
    let arguments = ["mount", mnt.path] + mountArguments
    let r =
      try fileSizeLimit.map {
        try runProcess(
          URL(fileURLWithPath: "/usr/bin/prlimit"), ["--fsize=\($0)", zdc.path] + arguments,
          environment: env)
      } ?? runProcess(zdc, arguments, environment: env)
    try #require(r.status == 0, "mount failed: \(r.stdout) \(r.stderr)")
    if let range = r.stdout.range(of: "process ") {
      pid = pid_t(r.stdout[range.upperBound...].prefix { $0.isNumber })
    }
    try #require(isMounted)
  }

  /// Unmounts politely, then lazily, then kills the serving process.
  func unmount() {
    if isMounted { _ = try? runProcess(zdc, ["unmount", mnt.path], environment: env) }
    if isMounted {
      _ = try? runProcess(URL(fileURLWithPath: "/usr/bin/fusermount3"), ["-u", "-z", mnt.path])
    }
    if let pid {
      for _ in 0..<100 where kill(pid, 0) == 0 { usleep(50_000) }
      if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
      var status: Int32 = 0
      _ = waitpid(pid, &status, WNOHANG)
    }
    pid = nil
  }

  /// Runs a shell script inside the mount point.
  @discardableResult
  func sh(
    _ script: String, expect status: Int32 = 0, sourceLocation: SourceLocation = #_sourceLocation
  )
    throws -> ProcessResult
  {
    let r = try runProcess(
      URL(fileURLWithPath: "/bin/sh"), ["-c", "cd '\(mnt.path)' && \(script)"], environment: env)
    #expect(
      r.status == status,
      "script: \(script)\nstdout: \(r.stdout)\nstderr: \(r.stderr)\(r.status == status ? "" : daemonProblems())",
      sourceLocation: sourceLocation)
    return r
  }

  /// The warnings and errors the mount daemon logged, to explain a failed step.
  func daemonProblems() -> String {
    let log =
      (try? String(contentsOf: state.appendingPathComponent("mount.log"), encoding: .utf8)) ?? ""
    let lines = log.split(separator: "\n").filter {
      $0.contains(" warning ") || $0.contains(" error ")
    }
    return lines.isEmpty ? "" : "\nmount.log:\n" + lines.suffix(20).joined(separator: "\n")
  }

  /// Runs a Python script inside the mount point.
  @discardableResult
  func python(_ script: String, sourceLocation: SourceLocation = #_sourceLocation) throws
    -> ProcessResult
  {
    let file = dir.path("script-\(UUID().uuidString.prefix(6)).py")
    try Data(script.utf8).write(to: file)
    return try sh("python3 '\(file.path)'", sourceLocation: sourceLocation)
  }

  func cloudID(_ path: String) throws -> String {
    try sh("getfattr --only-values -n user.zdc.cloudid '\(path)'").stdout
  }
}

extension MountFixture {
  /// `zdc mount ARGUMENTS MOUNTPOINT` for an account that does not exist yet (a bad option is
  /// refused before `mount` creates one): its result, and whether a config was created.
  static func mountWithBadOption(_ arguments: [String]) throws -> (
    result: ProcessResult, createdAnAccount: Bool
  ) {
    let dir = try TemporaryDirectory("zdc-bad-option")
    let mnt = dir.path("mnt")
    try FileManager.default.createDirectory(at: mnt, withIntermediateDirectories: true)
    let r = try runProcess(
      BuiltProducts.executable("zdc"), ["mount"] + arguments + [mnt.path],
      environment: ["ZDC_STATE_DIR": dir.path("state").path, "ZDC_PASSPHRASE": "p"])
    let created = FileManager.default.fileExists(
      atPath: dir.path("state").appendingPathComponent("config.json").path)
    return (r, created)
  }
}
