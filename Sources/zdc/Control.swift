import Foundation
import Logging
import ZDCFileSystem

#if canImport(Glibc)
  import Glibc
#endif

/// The mount's local control socket (a Unix socket in the state directory, mode 0600): one JSON
/// request per line (`{"command":"status"}`), one JSON answer per line.
final class ControlServer: @unchecked Sendable {
  // @unchecked: `fd` and `stopped` are set before the accept thread starts or under `lock`.
  let path: String
  let mountpoint: String
  let fs: FileSystem
  let sync: (any MountSyncHooks)?
  let fd: Int32
  let lock = NSLock()
  var stopped = false

  init(
    socketPath: String, mountpoint: String, fileSystem: FileSystem,
    sync: (any MountSyncHooks)?
  ) throws {
    path = socketPath
    self.mountpoint = mountpoint
    fs = fileSystem
    self.sync = sync
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

  func start() {
    let t = Thread { [self] in acceptLoop() }
    t.name = "zdc.control"
    t.start()
  }

  func stop() {
    lock.withLock { stopped = true }
    unlink(path)
    shutdown(fd, Int32(SHUT_RDWR))
    close(fd)
  }

  func acceptLoop() {
    while true {
      let c = accept(fd, nil, nil)
      if c < 0 {
        if lock.withLock({ stopped }) { return }
        if errno == EINTR { continue }
        return
      }
      let h = FileHandle(fileDescriptor: c, closeOnDealloc: true)
      let line = h.readLine() ?? ""
      h.writeIgnoringErrors(Data((answer(line) + "\n").utf8))
    }
  }

  func answer(_ line: String) -> String {
    let request = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
    let command = request?["command"] as? String ?? "status"
    var out: [String: Any] = ["mounted": true, "mountpoint": mountpoint]
    switch command {
    case "status":
      if let s = try? fs.status() {
        out["pendingItems"] = s.pendingItems
        out["pendingBytes"] = s.pendingBytes
        out["conflicts"] = s.conflicts ?? NSNull()
        out["errors"] = s.errors
        out["openFiles"] = s.openFiles
      }
      out["sync"] = sync == nil ? "not running" : "running"
    case "sync":
      if let sync {
        do { try sync.syncNow() } catch { out["error"] = "sync failed: \(error)" }
      } else {
        out["error"] = "the sync engine is not running"
      }
    default:
      out["error"] = "unsupported command \(command)"
    }
    let data = (try? JSONSerialization.data(withJSONObject: out, options: [.sortedKeys])) ?? Data()
    return String(decoding: data, as: UTF8.self)
  }
}

/// The client side of the control socket.
enum ControlClient {
  /// Sends one command and returns the answer line, or `nil` when nothing listens.
  static func request(socketPath: String, command: String) -> String? {
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
    h.writeIgnoringErrors(Data("{\"command\":\"\(command)\"}\n".utf8))
    return h.readLine()
  }
}
