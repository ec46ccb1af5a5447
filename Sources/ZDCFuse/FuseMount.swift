import CFuse
import Foundation
import Logging
import Synchronization
import ZDCCore
public import ZDCFileSystem

#if canImport(Glibc)
  import Glibc
#endif

/// Errors of mounting.
public enum FuseMountError: Error, Sendable, CustomStringConvertible {
  /// libfuse refused the arguments or could not create the session.
  case session
  /// The kernel mount failed (not a directory, not empty with `nonempty`, no permission…).
  case mount(String)
  /// The session loop ended with an error.
  case loop(Int32)

  public var description: String {
    switch self {
    case .session: return "cannot create the FUSE session (bad -o options?)"
    case .mount(let p): return "cannot mount on \(p)"
    case .loop(let rc): return "FUSE loop failed (\(rc))"
    }
  }
}

/// Shared by every callback through the session's userdata.
final class FuseContext: @unchecked Sendable {
  // @unchecked: `session` is set once before the loop starts and only read afterwards.
  let fs: FileSystem
  var session: OpaquePointer?
  /// True when the kernel checks permission bits (`default_permissions`); otherwise the
  /// callbacks do, for callers other than the superuser. Set once before the mount.
  var kernelChecksPermissions = false
  /// True once the kernel opens directories without asking (`FUSE_CAP_NO_OPENDIR_SUPPORT`):
  /// the read check moves from OPENDIR to READDIR. Set by INIT, before any other request.
  let kernelSkipsOpendir = Atomic<Bool>(false)
  let log = Logger(label: "zdc.fuse")
  /// Entry and attribute cache lifetime. Changes made through the mount go through the
  /// kernel, and a pull that changes what the kernel may hold invalidates it explicitly; the
  /// timeout bounds what a missed invalidation could cost.
  let timeout: Double = 5.0
  /// Page-cache stores run here, one at a time, never on a FUSE worker: a store waits for the
  /// kernel's locks on the pages it fills, which a request in flight holds until a worker
  /// answers it — with every worker waiting for stores, nothing would answer.
  let storeQueue = DispatchQueue(label: "zdc.fuse.page-store")
  // Guards `storing` and `queuedStores`; signalled when a store ends.
  private let storeCondition = NSCondition()
  /// Inodes with a store in progress, and whether a writer arrived meanwhile.
  nonisolated(unsafe) private var storing: [fuse_ino_t: Bool] = [:]
  nonisolated(unsafe) private var queuedStores = 0
  /// Stores waiting beyond this many are skipped (they only save later reads a request).
  static let maxQueuedStores = 8

  /// Counts a store to queue; false when too many wait already.
  func reserveStore() -> Bool {
    storeCondition.withLock {
      guard queuedStores < Self.maxQueuedStores else { return false }
      queuedStores += 1
      return true
    }
  }

  /// A queued store of `ino` starts.
  func beginStore(_ ino: fuse_ino_t) {
    storeCondition.withLock {
      queuedStores -= 1
      storing[ino] = false
    }
  }

  /// A store of `ino` ends; true when a writer arrived while it ran (what it stored may be
  /// older than what the writer wrote: the caller drops it).
  func endStore(_ ino: fuse_ino_t) -> Bool {
    storeCondition.withLock {
      let interrupted = storing.removeValue(forKey: ino) ?? false
      storeCondition.broadcast()
      return interrupted
    }
  }

  /// Called after the engine counted a writable open or a size change of `ino`, before the
  /// kernel hears of it: waits for a store of that inode in progress (a store that starts
  /// later sees the writer and stores nothing). The wait is bounded; a store still running
  /// then drops what it stored when it ends.
  func waitForStores(_ ino: fuse_ino_t) {
    storeCondition.withLock {
      guard storing[ino] != nil else { return }
      storing[ino] = true
      let deadline = Date().addingTimeInterval(1)
      while storing[ino] != nil, storeCondition.wait(until: deadline) {}
    }
  }

  init(fs: FileSystem) { self.fs = fs }
}

/// A FUSE mount of a filesystem engine: session, kernel mount, multithreaded loop, and the
/// kernel invalidations the engine asks for.
public final class FuseMount: @unchecked Sendable {
  // @unchecked: configured on one thread before `run`; the context is immutable afterwards.
  /// The engine.
  public let fileSystem: FileSystem
  /// Where it is mounted.
  public let mountpoint: String
  let context: FuseContext
  let extraOptions: [String]
  /// How long a worker thread polls for the next request during a burst, in microseconds.
  let busyPollMicroseconds: UInt32
  /// The most threads per CPU serving requests through FUSE over io_uring, when the kernel
  /// offers it.
  let ioUringThreads: UInt32
  /// The read-ahead asked for, in KiB (0: the kernel's default).
  let readaheadKiB: UInt32
  /// Whether the kernel let the mount's read-ahead be set to `readaheadKiB` (see `init`).
  public private(set) var readaheadSet = false
  var args: UnsafeMutablePointer<fuse_args>?
  var ops = fuse_lowlevel_ops()

  /// Prepares a mount; `options` are `-o` values (e.g. `allow_other`).
  /// `stateDirectory`, when given, is recorded as the mount's source (`zdcfs:PATH` in
  /// `/proc/mounts`), so that tools find the mount's state from its mount point (see
  /// ``stateDirectory(ofMountpoint:mountTable:)``).
  /// With `busyPollMicroseconds` > 0 and more than one CPU, while the previous request came in
  /// less than a millisecond ago, the worker thread that reads the device polls for the next
  /// request for up to that long (yielding between polls) before it sleeps: a sequential
  /// workload (a copy, a build, a script) then finds a running thread instead of waking a
  /// sleeping one, which costs about as much as the request's own work on a virtual machine.
  /// The other workers meanwhile wait off the device (the kernel would wake one of them per
  /// request, and it would take the request from the poller); the reader hands the device on
  /// before serving a request that may take long, and after a short one reads the next itself.
  /// Outside bursts, and during a run of reads, nothing polls.
  /// With `ioUringThreads` > 0, the mount takes the kernel's offer of FUSE over io_uring (made
  /// when the `fuse` module's `enable_uring` parameter is on): requests then come through one
  /// ring queue per CPU, served by a thread pinned to that CPU, so that a request is served on
  /// the CPU its sender runs on; a CPU whose threads all wait on one request for a while gets
  /// another, up to `ioUringThreads`.
  /// With `readaheadKiB` > 0 (at most ``maxReadaheadKiB``), the mount's read-ahead — how far
  /// ahead of a sequential reader the kernel asks for data, and so the size of its reads — is
  /// set to that many KiB (the kernel starts every FUSE mount at 128 KiB). Only the superuser
  /// may set it (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`); for others the mount keeps the
  /// kernel's default (``readaheadSet`` stays false).
  public init(
    fileSystem: FileSystem, mountpoint: String, options: [String] = [],
    stateDirectory: String? = nil, busyPollMicroseconds: UInt32 = 0, ioUringThreads: UInt32 = 0,
    readaheadKiB: UInt32 = 0
  ) {
    self.fileSystem = fileSystem
    self.mountpoint = mountpoint
    self.extraOptions = options
    self.busyPollMicroseconds = busyPollMicroseconds
    self.ioUringThreads = ioUringThreads
    self.readaheadKiB = min(readaheadKiB, Self.maxReadaheadKiB)
    self.source = Self.source(stateDirectory: stateDirectory)
    context = FuseContext(fs: fileSystem)
  }

  deinit {
    context.storeQueue.sync {}  // no store may use the session once destroyed
    if let s = context.session { fuse_session_destroy(s) }
    if let args { zdc_fuse_args_delete(args) }
  }

  /// Creates the session and mounts it; the mount is live when this returns.
  public func mount() throws {
    // Memory SQLite and the file handles free is kept for the next request instead of being
    // handed back to the kernel (and faulted in again) after nearly every file operation.
    zdc_malloc_keep_freed(64 << 20)
    guard let a = zdc_fuse_args_new() else { throw FuseMountError.session }
    args = a
    // With other users let in (`allow_other`), the kernel checks permission bits itself
    // (`default_permissions`). Without, only the mounting user (and root with `allow_root`)
    // can reach the mount, and the adapter checks the owner's bits (see `FuseContext`): the
    // kernel would otherwise ask for the parent's attributes before each path lookup that
    // follows a change to the directory.
    var opts = ["fsname=\(source)", "subtype=zdc"]
    let requested = extraOptions.flatMap { $0.split(separator: ",").map(String.init) }
    if requested.contains("default_permissions") {
      context.kernelChecksPermissions = true
    } else if requested.contains("allow_other") {
      opts.append("default_permissions")
      context.kernelChecksPermissions = true
    }
    opts += extraOptions
    for arg in ["zdc", "-o", opts.joined(separator: ",")] {
      _ = zdc_fuse_args_add(a, arg)
    }
    FuseOperations.fill(&ops)
    let userdata = Unmanaged.passUnretained(context).toOpaque()
    guard let se = zdc_fuse_session_new(a, &ops, userdata) else { throw FuseMountError.session }
    context.session = se
    // libfuse installs its handlers only over the default disposition; a parent (a test runner,
    // nohup) may have left these ignored, and ignored signals survive exec.
    // Likewise for a blocked mask (Foundation's Process starts children with signals blocked);
    // the loop's worker threads inherit this thread's mask.
    var unblock = sigset_t()
    sigemptyset(&unblock)
    for sig in [SIGINT, SIGTERM, SIGHUP] {
      signal(sig, SIG_DFL)
      sigaddset(&unblock, sig)
    }
    pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
    guard fuse_set_signal_handlers(se) == 0 else { throw FuseMountError.session }
    // The mount table shows the canonical path. (Resolved before mounting: once mounted, a
    // look at the mount point asks this process, which serves nothing until `run`.)
    let canonical = realpath(mountpoint, nil).map { p in
      defer { free(p) }
      return String(cString: p)
    }
    guard fuse_session_mount(se, mountpoint) == 0 else {
      fuse_remove_signal_handlers(se)
      throw FuseMountError.mount(mountpoint)
    }
    if readaheadKiB > 0 { setReadahead(mountpoint: canonical ?? mountpoint) }
    let deviceIO = zdc_fuse_session_install_device_io(se)
    if deviceIO != 0 {
      context.log.warning(
        "device I/O wrappers not set up (errno \(-deviceIO)): no FUSE_HANDLE_KILLPRIV_V2, no busy polling"
      )
    }
    // (Polling on the only CPU would only keep the request's sender from running.)
    zdc_fuse_set_busy_poll(
      ProcessInfo.processInfo.activeProcessorCount > 1 ? busyPollMicroseconds : 0)
    zdc_fuse_set_uring(deviceIO == 0 ? ioUringThreads : 0)
    fileSystem.notifier = KernelNotifications(context: context)
  }

  /// How the kernel and the file system share the work, once the kernel has initialised the
  /// session: whether the kernel offered and was given `FUSE_HANDLE_KILLPRIV_V2` (it then asks
  /// for `security.capability` once per file instead of before every write), and
  /// `FUSE_DIRECT_IO_ALLOW_MMAP` (a newly created file's descriptor then writes past the page
  /// cache, and the kernel asks nothing before its first write), whether it
  /// checks permission bits itself (`default_permissions`), whether it opens directories
  /// without asking (`FUSE_CAP_NO_OPENDIR_SUPPORT`; it then keeps their listings), whether
  /// it offered FUSE over io_uring and requests come through the rings, and whether the
  /// mount's read-ahead was set (see `init`).
  public var kernelFeatures: [String: Bool] {
    let state = zdc_fuse_killpriv_v2_state()
    let dioMmap = zdc_fuse_direct_io_mmap_state()
    let uring = zdc_fuse_uring_state()
    return [
      "handleKillprivV2Offered": state & 1 != 0, "handleKillprivV2": state & 2 != 0,
      "directIOAllowMmapOffered": dioMmap & 1 != 0, "directIOAllowMmap": dioMmap & 2 != 0,
      "ioUringOffered": uring != Int32(ZDC_URING_UNOFFERED),
      "ioUring": uring == Int32(ZDC_URING_ACTIVE),
      "kernelChecksPermissions": context.kernelChecksPermissions,
      "opendirSkipped": context.kernelSkipsOpendir.load(ordering: .acquiring),
      "readaheadSet": readaheadSet,
    ]
  }

  /// The mount's source as `/proc/mounts` shows it.
  let source: String

  /// The largest read-ahead a mount takes, in KiB: what the kernel may ask for in one read
  /// (`max_readahead` and the reply buffers are 1 MiB).
  public static let maxReadaheadKiB: UInt32 = 1024

  /// Sets the read-ahead of the new mount at `mountpoint` (see `init`); best effort.
  private func setReadahead(mountpoint: String) {
    // (The new mount is the table's last line: past the 4 KiB `String(contentsOfFile:)` reads
    // of a /proc file on a machine with a few dozen mounts.)
    let table = ProcFile.text("/proc/self/mountinfo")
    guard let device = Self.deviceNumber(ofMountpoint: mountpoint, mountTable: table) else {
      context.log.info("read-ahead not set: the mount is not in /proc/self/mountinfo")
      return
    }
    let path = "/sys/class/bdi/\(device)/read_ahead_kb"
    do {
      try "\(readaheadKiB)\n".write(toFile: path, atomically: false, encoding: .utf8)
      readaheadSet = true
      context.log.debug("read-ahead set to \(readaheadKiB) KiB")
    } catch {
      context.log.debug(
        "read-ahead left at the kernel's default (setting \(path) needs the superuser): \(error)")
    }
  }

  /// The device number (`MAJOR:MINOR`) of the zdcfs mount at `mountpoint` in a mount table in
  /// `/proc/self/mountinfo` form (the one on top, when there are several), or `nil`.
  static func deviceNumber(ofMountpoint mountpoint: String, mountTable: String) -> String? {
    zdcMounts(at: mountpoint, mountTable: mountTable).last.map { String($0.device) }
  }

  /// `zdcfs:PATH` for a state directory whose path survives mount options unchanged (no comma,
  /// backslash, control character or whitespace), else plain `zdcfs`.
  static func source(stateDirectory: String?) -> String {
    guard let path = stateDirectory, path.hasPrefix("/"),
      !path.unicodeScalars.contains(where: {
        $0 == "," || $0 == "\\" || $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7f
      })
    else { return "zdcfs" }
    return "zdcfs:" + path
  }

  /// The state directory recorded as the source of the zdcfs mount at `mountpoint` in a mount
  /// table in `/proc/self/mountinfo` form, or `nil` (no such mount, or none recorded).
  public static func stateDirectory(ofMountpoint mountpoint: String, mountTable: String) -> String?
  {
    guard let mount = zdcMounts(at: mountpoint, mountTable: mountTable).first else { return nil }
    let source = unescape(mount.source)
    guard source.hasPrefix("zdcfs:/") else { return nil }
    return String(source.dropFirst("zdcfs:".count))
  }

  /// The zdcfs mounts at `mountpoint` in a mount table in `/proc/self/mountinfo` form, in its
  /// order (a later one is mounted over an earlier one): device number and source field.
  static func zdcMounts(at mountpoint: String, mountTable: String) -> [(
    device: Substring, source: Substring
  )] {
    var found: [(device: Substring, source: Substring)] = []
    for line in mountTable.split(separator: "\n") {
      // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
      let fields = line.split(separator: " ", omittingEmptySubsequences: false)
      guard fields.count > 4, unescape(fields[4]) == mountpoint,
        let dash = fields.firstIndex(of: "-"), dash + 2 < fields.count,
        fields[dash + 1] == "fuse.zdc"
      else { continue }
      found.append((fields[2], fields[dash + 2]))
    }
    return found
  }

  /// A mount table field with its octal escapes (`\040` for a space) undone.
  static func unescape(_ field: Substring) -> String {
    var bytes: [UInt8] = []
    var i = field.utf8.startIndex
    let u = field.utf8
    while i < u.endIndex {
      if u[i] == UInt8(ascii: "\\"), u.distance(from: i, to: u.endIndex) >= 4 {
        let digits = u[u.index(after: i)..<u.index(i, offsetBy: 4)]
        if let v = UInt8(String(decoding: digits, as: UTF8.self), radix: 8) {
          bytes.append(v)
          i = u.index(i, offsetBy: 4)
          continue
        }
      }
      bytes.append(u[i])
      i = u.index(after: i)
    }
    return String(decoding: bytes, as: UTF8.self)
  }

  /// Serves requests on several threads until unmounted or signalled (SIGINT, SIGTERM, SIGHUP),
  /// then unmounts.
  public func run() throws {
    guard let se = context.session else { throw FuseMountError.session }
    let rc = zdc_fuse_session_loop_mt(se, 0, 10)
    context.storeQueue.sync {}  // page-cache stores queued by the last reads
    fileSystem.notifier = nil
    fuse_remove_signal_handlers(se)
    fuse_session_unmount(se)
    zdc_fuse_uring_stop()
    if rc != 0, rc != -EINTR, rc != SIGTERM, rc != SIGINT, rc != SIGHUP {
      throw FuseMountError.loop(rc)
    }
  }
}

/// Kernel invalidations through libfuse's notify calls.
final class KernelNotifications: KernelNotifier, @unchecked Sendable {
  // @unchecked: the context is immutable while the loop runs.
  let context: FuseContext
  init(context: FuseContext) { self.context = context }

  func invalidateInode(_ inode: Inode) {
    guard let se = context.session else { return }
    _ = fuse_lowlevel_notify_inval_inode(se, fuse_ino_t(inode), 0, 0)
  }

  func invalidateEntry(parent: Inode, name: String) {
    guard let se = context.session else { return }
    _ = name.withCString {
      fuse_lowlevel_notify_inval_entry(se, fuse_ino_t(parent), $0, strlen($0))
    }
  }

  func invalidateAttributes(_ inode: Inode) {
    guard let se = context.session else { return }
    _ = fuse_lowlevel_notify_inval_inode(se, fuse_ino_t(inode), -1, 0)
  }

  func deleteEntry(parent: Inode, child: Inode, name: String) {
    guard let se = context.session else { return }
    _ = name.withCString {
      fuse_lowlevel_notify_delete(se, fuse_ino_t(parent), fuse_ino_t(child), $0, strlen($0))
    }
  }
}
