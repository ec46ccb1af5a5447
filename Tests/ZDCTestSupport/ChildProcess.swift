import CSpawn
public import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// Where one standard stream of a ``ChildProcess`` goes.
public enum ChildStream: Sendable {
  /// `/dev/null`.
  case null
  /// A pipe to this process (``ChildProcess/stdinFD``, ``ChildProcess/stdoutFD``,
  /// ``ChildProcess/stderrFD``).
  case pipe
  /// A file, created or truncated (for standard input: opened for reading).
  case file(String)
  /// Wherever standard output goes (standard error only).
  case stdout
}

/// A child process started with `posix_spawn`, for tests that run programs.
///
/// Foundation's `Process` is not used: its Linux implementation shares run-loop state between
/// threads without locks, and the test process runs suites on many threads at once. Here the
/// child gets only the descriptors asked for (pipes are close-on-exec, everything from 3 up is
/// closed), default signal handling, and a process group of its own.
public final class ChildProcess: @unchecked Sendable {
  // @unchecked: `status` is only touched under `lock`; the rest is set once in `init`.

  /// The child's process id.
  public let pid: Int32
  /// This process's ends of the pipes asked for, else -1; closed when the object goes (or by
  /// ``closeStdin()`` for standard input).
  public private(set) var stdinFD: Int32 = -1
  public let stdoutFD: Int32
  public let stderrFD: Int32
  private let lock = NSLock()
  private var status: Int32?

  /// Starts `executable` (a path; with `searchPath`, a name looked up in `PATH`) with
  /// `arguments` and `environment` (this process's when `nil`).
  public init(
    _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
    stdin: ChildStream = .null, stdout: ChildStream = .null, stderr: ChildStream = .null,
    searchPath: Bool = false
  ) throws {
    // Pipes: [read, write], close-on-exec; the child gets its end by dup2.
    var pipes: [Int32: [Int32]] = [:]
    func closeAll() { for p in pipes.values { for fd in p where fd >= 0 { close(fd) } } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    for (fd, stream) in [(Int32(0), stdin), (1, stdout), (2, stderr)] {
      switch stream {
      case .null:
        posix_spawn_file_actions_addopen(
          &actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0)
      case .file(let path):
        let flags = fd == 0 ? O_RDONLY : O_WRONLY | O_CREAT | O_TRUNC
        posix_spawn_file_actions_addopen(&actions, fd, path, flags, 0o644)
      case .stdout:
        posix_spawn_file_actions_adddup2(&actions, 1, fd)
      case .pipe:
        var ends: [Int32] = [-1, -1]
        guard zdc_pipe_cloexec(&ends) == 0 else {
          closeAll()
          throw HelperError("pipe2: errno \(errno)")
        }
        pipes[fd] = ends
        posix_spawn_file_actions_adddup2(&actions, fd == 0 ? ends[0] : ends[1], fd)
      }
    }
    zdc_spawn_closefrom(&actions, 3)
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var noSignals = sigset_t()
    sigemptyset(&noSignals)
    var allSignals = sigset_t()
    sigfillset(&allSignals)
    posix_spawnattr_setsigmask(&attributes, &noSignals)
    posix_spawnattr_setsigdefault(&attributes, &allSignals)
    posix_spawnattr_setpgroup(&attributes, 0)
    posix_spawnattr_setflags(
      &attributes,
      Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))
    let env = environment ?? ProcessInfo.processInfo.environment
    var cArgs: [UnsafeMutablePointer<CChar>?] =
      ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for p in cArgs { free(p) } }
    var cEnv: [UnsafeMutablePointer<CChar>?] = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for p in cEnv { free(p) } }
    var pid: pid_t = 0
    let rc =
      searchPath
      ? posix_spawnp(&pid, executable, &actions, &attributes, &cArgs, &cEnv)
      : posix_spawn(&pid, executable, &actions, &attributes, &cArgs, &cEnv)
    guard rc == 0 else {
      closeAll()
      throw HelperError("cannot start \(executable): errno \(rc)")
    }
    self.pid = pid
    // The child's ends are the child's now.
    if let p = pipes[0] { close(p[0]) }
    if let p = pipes[1] { close(p[1]) }
    if let p = pipes[2] { close(p[1]) }
    stdinFD = pipes[0]?[1] ?? -1
    stdoutFD = pipes[1]?[0] ?? -1
    stderrFD = pipes[2]?[0] ?? -1
  }

  deinit {
    for fd in [stdinFD, stdoutFD, stderrFD] where fd >= 0 { close(fd) }
  }

  /// Writes `bytes` to the child's standard input pipe (stops early if the child closed it).
  public func writeStdin(_ bytes: [UInt8]) {
    var rest = bytes[...]
    while !rest.isEmpty, stdinFD >= 0 {
      let n = rest.withUnsafeBytes { write(stdinFD, $0.baseAddress, $0.count) }
      if n < 0 && errno == EINTR { continue }
      if n <= 0 { break }
      rest = rest.dropFirst(n)
    }
  }

  /// Closes the standard input pipe: the child reads end-of-file.
  public func closeStdin() {
    if stdinFD >= 0 {
      close(stdinFD)
      stdinFD = -1
    }
  }

  /// True until the child has exited (it is then reaped, and its status kept).
  public var isRunning: Bool {
    lock.withLock {
      guard status == nil else { return false }
      var raw: Int32 = 0
      let r = waitpid(pid, &raw, WNOHANG)
      if r == pid { status = Self.decode(raw) }
      return status == nil
    }
  }

  /// Waits for the child to exit; its exit status, or 128 + the signal that ended it.
  @discardableResult
  public func wait() -> Int32 {
    while true {
      if let known = lock.withLock({ status }) { return known }
      var raw: Int32 = 0
      let r = waitpid(pid, &raw, 0)
      if r == pid {
        let decoded = Self.decode(raw)
        lock.withLock { status = decoded }
        return decoded
      }
      if r < 0 && errno == EINTR { continue }
      // Reaped by another thread's `isRunning` or `wait`: its status is (about to be) kept.
      usleep(1000)
    }
  }

  /// Sends `signal` unless the child was already reaped (its pid may belong to another process
  /// by then).
  public func kill(_ signal: Int32 = SIGKILL) {
    lock.withLock {
      if status == nil { _ = Glibc.kill(pid, signal) }
    }
  }

  /// Kills the child (SIGKILL) if it still runs, and reaps it.
  public func stop() {
    kill()
    wait()
  }

  /// Everything the child writes to `fd` (one of its pipes) until it closes it.
  public static func readToEnd(_ fd: Int32) -> Data {
    var out = Data()
    forEachChunk(fd) { out.append($0) }
    return out
  }

  /// Calls `body` with each piece the child writes to `fd` (one of its pipes), as it comes,
  /// until the child closes it.
  public static func forEachChunk(_ fd: Int32, _ body: (Data) -> Void) {
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
      let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
      if n > 0 {
        body(Data(buffer[0..<n]))
      } else if n < 0 && errno == EINTR {
        continue
      } else {
        return
      }
    }
  }

  private static func decode(_ raw: Int32) -> Int32 {
    raw & 0x7f == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
  }
}
