public import Foundation
public import Testing
import ZDCCore
public import ZDCS3Store

#if canImport(Glibc)
  import Glibc
#endif

/// Errors of the test helpers.
public struct HelperError: Error, CustomStringConvertible {
  public var description: String
  public init(_ d: String) { description = d }
}

/// A free TCP port on 127.0.0.1 (bound, read back, released).
public func freeLoopbackPort() throws -> UInt16 {
  let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
  guard fd >= 0 else { throw HelperError("socket: errno \(errno)") }
  defer { close(fd) }
  var addr = loopbackAddress(port: 0)
  let rc = withUnsafePointer(to: &addr) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
      bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
    }
  }
  guard rc == 0 else { throw HelperError("bind: errno \(errno)") }
  var out = sockaddr_in()
  var len = socklen_t(MemoryLayout<sockaddr_in>.size)
  _ = withUnsafeMutablePointer(to: &out) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
  }
  return UInt16(bigEndian: out.sin_port)
}

public func loopbackAddress(port: UInt16) -> sockaddr_in {
  var addr = sockaddr_in()
  addr.sin_family = sa_family_t(AF_INET)
  addr.sin_port = port.bigEndian
  addr.sin_addr.s_addr = inet_addr("127.0.0.1")
  return addr
}

/// Opens a TCP connection to 127.0.0.1:port; returns the socket or -1.
public func connectLoopback(port: UInt16) -> Int32 {
  let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
  guard fd >= 0 else { return -1 }
  var addr = loopbackAddress(port: port)
  let rc = withUnsafePointer(to: &addr) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
      connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
    }
  }
  if rc != 0 {
    close(fd)
    return -1
  }
  return fd
}

/// A `moto_server` process on 127.0.0.1, started by a test suite and stopped by its PID.
public final class MotoServer: Sendable {
  private let process: ChildProcess
  public var pid: pid_t { process.pid }
  public let port: UInt16
  public let tls: Bool
  /// The credentials stores on this server use.
  public let credentials: S3Credentials
  public var endpoint: String { "\(tls ? "https" : "http")://127.0.0.1:\(port)" }

  /// The server of the running suite (see the `.motoServer` trait).
  @TaskLocal public static var current: MotoServer?

  private init(
    process: ChildProcess, port: UInt16, tls: Bool,
    credentials: S3Credentials = S3Credentials(accessKeyID: "testing", secretAccessKey: "testing")
  ) {
    self.process = process
    self.port = port
    self.tls = tls
    self.credentials = credentials
  }

  /// The same server, used with other credentials (stop the original, not this).
  public func using(_ credentials: S3Credentials) -> MotoServer {
    MotoServer(process: process, port: port, tls: tls, credentials: credentials)
  }

  /// The command that starts moto: `$MOTO_SERVER`, else `moto_server` on `PATH`.
  public static func command() -> [String] {
    let env = ProcessInfo.processInfo.environment
    if let explicit = env["MOTO_SERVER"], !explicit.isEmpty { return [explicit] }
    for dir in (env["PATH"] ?? "").split(separator: ":") {
      let candidate = "\(dir)/moto_server"
      if access(candidate, X_OK) == 0 { return [candidate] }
    }
    return ["python3", "-m", "moto.server"]
  }

  /// Starts moto on a free port (with a self-signed certificate if `tls`) and waits until it
  /// accepts connections.
  public static func start(tls: Bool = false, environment extra: [String: String] = [:]) throws
    -> MotoServer
  {
    // The free port can be taken between its choice and moto's bind (another test run on the
    // machine): moto then exits at start, and another port is tried.
    var attempt = 0
    while true {
      attempt += 1
      do {
        return try start(port: try freeLoopbackPort(), tls: tls, environment: extra)
      } catch is PortTaken where attempt < 5 {
        continue
      }
    }
  }

  struct PortTaken: Error {}

  private static func start(port: UInt16, tls: Bool, environment extra: [String: String]) throws
    -> MotoServer
  {
    let argv = command() + ["-H", "127.0.0.1", "-p", String(port)] + (tls ? ["-s"] : [])
    let log = logPath(port: port)
    var env = ProcessInfo.processInfo.environment
    env.merge(extra) { $1 }
    let process = try ChildProcess(
      argv[0], Array(argv.dropFirst()), environment: env, stdout: .file(log), stderr: .stdout,
      searchPath: true)
    let server = MotoServer(process: process, port: port, tls: tls)
    let deadline = Date().addingTimeInterval(30)
    while Date() < deadline {
      if !process.isRunning {
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        if output.contains("in use") {
          unlink(log)
          throw PortTaken()
        }
        throw HelperError("moto_server exited at start (status \(process.wait())); see \(log)")
      }
      // Only our server's socket counts (another program may listen on the port).
      if listens(pid: process.pid, port: port) { return server }
      usleep(100_000)
    }
    server.stop()
    throw HelperError("moto_server did not answer on port \(port) within 30 s; see \(log)")
  }

  /// True when process `pid` holds a TCP socket listening on `port` (from `/proc`).
  static func listens(pid: pid_t, port: UInt16) -> Bool {
    let hex = String(port, radix: 16, uppercase: true)
    let hexPort = ":" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    let table = ProcFile.text("/proc/net/tcp")
    // Fields: sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode.
    let inodes = table.split(separator: "\n").dropFirst().compactMap { line -> String? in
      let f = line.split(separator: " ", omittingEmptySubsequences: true)
      guard f.count > 9, f[1].hasSuffix(hexPort), f[3] == "0A" else { return nil }
      return "socket:[\(f[9])]"
    }
    guard !inodes.isEmpty,
      let fds = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")
    else { return false }
    return fds.contains { fd in
      let target = try? FileManager.default.destinationOfSymbolicLink(
        atPath: "/proc/\(pid)/fd/\(fd)")
      return target.map(inodes.contains) ?? false
    }
  }

  /// Stops the server: SIGTERM, then SIGKILL after 5 s, and reaps it; removes its log.
  public func stop() {
    defer { unlink(Self.logPath(port: port)) }
    process.kill(SIGTERM)
    for _ in 0..<50 {
      if !process.isRunning { return }
      usleep(100_000)
    }
    process.stop()
  }

  public static func logPath(port: UInt16) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("zdc-moto-\(port).log").path
  }

  /// A configuration for a new, unique bucket on this server (or on `endpoint`).
  public func configuration(
    prefix: String = "", endpoint: String? = nil, transport: S3TransportOptions = .init(),
    addressingStyle: S3AddressingStyle = .path
  ) throws -> S3Configuration {
    var config = S3Configuration(
      bucket: "zdc-\(UUID().uuidString.lowercased().prefix(18))", prefix: prefix,
      endpoint: URL(string: endpoint ?? self.endpoint), region: "us-east-1",
      addressingStyle: addressingStyle,
      credentials: credentials)
    config.transport = transport
    return config
  }

  /// A store on a new, unique bucket (created).
  public func makeStore(
    prefix: String = "", endpoint: String? = nil, transport: S3TransportOptions = .init(),
    addressingStyle: S3AddressingStyle = .path
  ) throws -> S3Store {
    let store = S3Store(
      configuration: try configuration(
        prefix: prefix, endpoint: endpoint, transport: transport,
        addressingStyle: addressingStyle))
    try store.createBucket()
    store.resetRequestCounts()
    return store
  }

  /// The running suite's server.
  public static func require() throws -> MotoServer {
    guard let s = current else { throw HelperError("no moto server: add the .motoServer trait") }
    return s
  }
}

/// Starts one moto server around a whole suite and stops it when the suite is done.
public struct MotoServerTrait: SuiteTrait, TestScoping {
  public var tls = false
  /// Make moto verify signatures and IAM permissions, with an IAM user's keys made at start.
  public var authenticated = false
  public var isRecursive: Bool { false }

  public func provideScope(
    for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
  ) async throws {
    let server = try MotoServer.start(
      tls: tls,
      environment: authenticated ? ["INITIAL_NO_AUTH_ACTION_COUNT": "\(iamSetupActions)"] : [:])
    defer { server.stop() }
    let current = authenticated ? server.using(try createIAMUser(on: server)) : server
    try await MotoServer.$current.withValue(current) { try await function() }
  }
}

extension Trait where Self == MotoServerTrait {
  /// Runs the suite against its own `moto_server`.
  public static var motoServer: Self { MotoServerTrait() }
  /// Runs the suite against its own `moto_server` speaking HTTPS (self-signed certificate).
  public static var motoServerTLS: Self { MotoServerTrait(tls: true) }
  /// Runs the suite against its own `moto_server` that checks every request's signature.
  public static var motoServerAuthenticated: Self { MotoServerTrait(authenticated: true) }
}

/// Transport options that retry fast, for tests.
public func fastRetries(attempts: Int = 5) -> S3TransportOptions {
  var o = S3TransportOptions()
  o.maxAttempts = attempts
  o.initialBackoff = 0.01
  o.maxBackoff = 0.05
  o.connectTimeout = 2
  return o
}
