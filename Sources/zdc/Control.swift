import CLinux
import Foundation
import Logging
import ZDCCore
import ZDCFileSystem
import ZDCSync

#if canImport(Glibc)
  import Glibc
#endif

/// The mount's local control socket (a Unix socket in the state directory, mode 0600): one JSON
/// request per line (`{"command":"status"}`), one JSON answer per line. `sync` first answers
/// with progress lines (`{"progress":…}`) while it runs.
final class ControlServer: @unchecked Sendable {
  // @unchecked: `fd` is set before the accept thread starts; `stopped`, `draining` and
  // `socketClosed` are only touched under `lock`.
  let path: String
  let mountpoint: String
  let fs: FileSystem
  let sync: (any MountSyncHooks)?
  /// The store's HTTP requests so far, by kind (S3 stores only).
  let storeRequests: (@Sendable () -> [String: Int])?
  /// How the kernel and the file system share the work (see `FuseMount.kernelFeatures`).
  let kernelFeatures: (@Sendable () -> [String: Bool])?
  let fd: Int32
  let lock = NSLock()
  var stopped = false
  var draining = false
  /// Set when the accept loop has closed `fd`.
  var socketClosed = false

  /// Reports the mount as gone from the kernel and waiting for uploads.
  func setDraining(_ on: Bool) { lock.withLock { draining = on } }

  init(
    socketPath: String, mountpoint: String, fileSystem: FileSystem,
    sync: (any MountSyncHooks)?, storeRequests: (@Sendable () -> [String: Int])? = nil,
    kernelFeatures: (@Sendable () -> [String: Bool])? = nil
  ) throws {
    path = socketPath
    self.mountpoint = mountpoint
    fs = fileSystem
    self.sync = sync
    self.storeRequests = storeRequests
    self.kernelFeatures = kernelFeatures
    unlink(path)
    fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw CLIError.usage("cannot create the control socket") }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else {
      throw CLIError.usage("state directory path too long for a control socket")
    }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
      raw.copyBytes(from: bytes)
      raw[bytes.count] = 0
    }
    let rc = withUnsafePointer(to: &addr) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
      }
    }
    guard rc == 0, listen(fd, 8) == 0 else { throw CLIError.usage("cannot bind \(path)") }
    chmod(path, 0o600)
  }

  func start() throws {
    try Threads.start(name: "zdc.control") { [self] in acceptLoop() }
  }

  func stop() {
    unlink(path)
    // Wakes the accept loop, which closes the socket: closing it here could let another
    // thread open a file under its number before the loop calls `accept` again.
    lock.withLock {
      stopped = true
      if !socketClosed { shutdown(fd, Int32(SHUT_RDWR)) }
    }
  }

  func acceptLoop() {
    defer {
      lock.withLock {
        socketClosed = true
        close(fd)
      }
    }
    while true {
      let c = accept(fd, nil, nil)
      if c < 0 {
        if lock.withLock({ stopped }) { return }
        if errno == EINTR { continue }
        return
      }
      // One thread per connection: a long `sync` must not hold up `status`.
      do {
        try Threads.start(name: "zdc.control.connection") { [self] in
          let h = FileHandle(fileDescriptor: c, closeOnDealloc: true)
          let line = h.readLine() ?? ""
          let writeLock = NSLock()
          let out = answer(line) { progress in
            writeLock.withLock { h.writeIgnoringErrors(Data((progress + "\n").utf8)) }
          }
          writeLock.withLock { h.writeIgnoringErrors(Data((out + "\n").utf8)) }
        }
      } catch {
        // No thread for it: the client sees the connection close without an answer.
        close(c)
      }
    }
  }

  /// The answer to one request line; `sync` sends progress lines through `emit` first.
  func answer(_ line: String, emit: @escaping @Sendable (String) -> Void = { _ in }) -> String {
    let request = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
    let command = request?["command"] as? String ?? "status"
    var out: [String: Any] = ["mounted": true, "mountpoint": mountpoint]
    switch command {
    case "status":
      out.merge(statusFields()) { $1 }
    case "sync":
      guard let sync else {
        out["error"] = "the sync engine is not running"
        break
      }
      let timeout = (request?["timeout"] as? Double) ?? 120
      let done = DispatchSemaphore(value: 0)
      // Without a reporter thread the sync runs all the same, with no progress lines.
      try? Threads.start(name: "zdc.control.progress") { [self] in
        while done.wait(timeout: .now() + 0.5) == .timedOut {
          emit(Self.json(["progress": statusFields()]))
        }
      }
      do {
        if try sync.syncNow(timeout: timeout) {
          // The pull posted its kernel notifications without waiting for them: a listing the
          // caller reads next must not race them.
          fs.deliverPostedNotifications()
          out["inSync"] = true
        } else {
          out["error"] = "not in sync after \(Int(timeout)) s"
        }
      } catch {
        out["error"] = "sync failed: \(error)"
      }
      done.signal()
      out.merge(statusFields()) { $1 }
    case "cancel-drain":
      sync?.cancelDrain()
    default:
      out["error"] = "unsupported command \(command)"
    }
    return Self.json(out)
  }

  /// What `status` reports: the catalog's counts and the sync engine's progress.
  func statusFields() -> [String: Any] {
    var out: [String: Any] = ["pid": Int(getpid()), "dumpable": zdc_is_dumpable() == 1]
    if let s = try? fs.status() {
      out["pendingItems"] = s.pendingItems
      out["pendingBytes"] = s.pendingBytes
      out["conflicts"] = s.conflicts
      out["conflictPaths"] = s.conflictPaths
      out["errors"] = s.errors
      out["openFiles"] = s.openFiles
      out["cacheBytes"] = s.cacheBytes
      out["cacheCapBytes"] = s.cacheCapBytes
    }
    let draining = lock.withLock { self.draining }
    if let sync {
      let p = sync.progress
      out["sync"] = draining ? "draining" : "running"
      out["uploading"] = p.push.inFlightItems
      out["uploadBytes"] = p.push.inFlightBytes
      out["uploadDoneBytes"] = p.push.inFlightDoneBytes
      out["uploadFailed"] = p.push.failedItems
      out["downloading"] = p.download.inFlightItems
      // The Swift-native ISO 8601 style (corelibs' ISO8601DateFormatter goes through
      // CFDateFormatter, which is not safe to create from concurrent requests on Linux).
      out["lastPull"] = p.lastPull.map { $0.formatted(.iso8601) } ?? NSNull()
      out["lastError"] = p.lastError ?? NSNull()
      out["fullScanDue"] = sync.fullScanDue
    } else {
      out["sync"] = "not running"
    }
    if let storeRequests { out["storeRequests"] = storeRequests() }
    if let kernelFeatures { out["kernel"] = kernelFeatures() }
    return out
  }

  static func json(_ object: [String: Any]) -> String {
    let data =
      (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
    return String(decoding: data, as: UTF8.self)
  }
}

/// The client side of the control socket.
enum ControlClient {
  /// Sends one command and returns the answer line, or `nil` when nothing listens.
  static func request(socketPath: String, command: String) -> String? {
    request(socketPath: socketPath, ["command": command])
  }

  /// The mount's `status` answer as an object (empty when it is not one), or `nil` when
  /// nothing listens.
  static func status(socketPath: String) -> [String: Any]? {
    guard let answer = request(socketPath: socketPath, command: "status") else { return nil }
    return (try? JSONSerialization.jsonObject(with: Data(answer.utf8))) as? [String: Any] ?? [:]
  }

  /// Sends one request and returns the final answer line, or `nil` when nothing listens;
  /// progress lines before it go to `progress`.
  static func request(
    socketPath: String, _ body: [String: Any], progress: ([String: Any]) -> Void = { _ in }
  ) -> String? {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return nil }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(socketPath.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else {
      close(fd)
      return nil
    }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
      raw.copyBytes(from: bytes)
      raw[bytes.count] = 0
    }
    let rc = withUnsafePointer(to: &addr) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
      }
    }
    let h = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    guard rc == 0 else { return nil }
    signal(SIGPIPE, SIG_IGN)
    h.writeIgnoringErrors(Data((ControlServer.json(body) + "\n").utf8))
    while let line = h.readLine() {
      if let obj = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any],
        let p = obj["progress"] as? [String: Any]
      {
        progress(p)
        continue
      }
      return line
    }
    return nil
  }
}
