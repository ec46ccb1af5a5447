import ArgumentParser
import CLinux
import Foundation
import Logging
import ZDCAccount
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCDisk
import ZDCFileSystem
import ZDCFuse
import ZDCS3Store
import ZDCSync

#if canImport(Glibc)
  import Glibc
#endif

extension ZDC {
  struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Mount your treesystem on a folder.",
      discussion: """
        Unlocks the account (creating it first if this state directory has none), mounts the \
        home trunk on MOUNTPOINT and, unless --foreground, keeps serving it in the background. \
        The command returns once the mount is live. Stop it with `zdc unmount MOUNTPOINT`.
        """)

    @OptionGroup var state: StateOptions
    @OptionGroup var pass: PassphraseOptions

    @Argument(help: "An existing, empty directory.")
    var mountpoint: String

    @Flag(help: "Serve in this process until unmounted (logs on standard error).")
    var foreground = false

    @Option(
      name: .customShort("o"), help: "FUSE mount options (comma-separated), e.g. allow_other.")
    var options: [String] = []

    @Flag(help: "Log debugging detail (never names or content).")
    var verbose = false

    @Option(
      help:
        "On first use only: where the encrypted objects live, a folder or s3://BUCKET/PREFIX (default ~/.local/share/zdcfs/store)."
    )
    var store: String?

    @OptionGroup(title: "On first use, with --store s3://BUCKET/PREFIX")
    var s3: S3StoreOptions

    @Option(help: .hidden)
    var kdf: String?

    @Flag(help: .hidden)
    var daemonChild = false

    @Option(
      help: ArgumentHelp(
        "How often to fetch other devices' changes, in seconds (default: 30).",
        valueName: "seconds"))
    var pullInterval: Double?

    @Option(
      help: ArgumentHelp(
        "The most disk space the local cache of downloaded and uploaded content may take, e.g. "
          + "500M or 20G (default: half of the free space where the state directory is).",
        discussion: "Past it, the content read longest ago is evicted (and downloaded again when "
          + "it is next read). Content not uploaded yet and open files are never evicted, so the "
          + "cache may stay above the cap while they wait.",
        valueName: "size"),
      transform: { text in
        guard let bytes = ByteSize.parse(text), bytes > 0 else {
          throw ValidationError("--cache-size takes a size such as 500M, 20G or 1073741824")
        }
        return bytes
      })
    var cacheSize: UInt64?

    /// log2 of the chunk size of new cache and staging files (tests and measurements).
    @Option(help: .hidden)
    var chunkShift: UInt8?

    /// After an unmount, how long uploads may go without progress while they keep failing
    /// before the process leaves them queued for the next mount (tests shorten it).
    @Option(help: .hidden)
    var drainStall: Double = 60

    @Option(
      help: ArgumentHelp(
        "Start uploading a file once it has been left alone this many seconds.",
        discussion: "Bursts of changes (a copy, a build, an editor's saves) then cost one upload "
          + "per file and leave the CPU to the work itself; `zdc sync` and `zdc unmount` do not "
          + "wait for it."))
    var uploadDelay: Double = 2

    @Option(
      help: ArgumentHelp(
        "How many uploads (and other changes to the store) run at once, 1 to 64.",
        discussion: "More of them speed up uploads to a store far away, where each object waits "
          + "for its own round trip (many small files to S3); an S3 store then also allows that "
          + "many requests at once.",
        valueName: "count"))
    var transfers: Int = PushConfiguration.defaultConcurrentOperations

    @Option(
      help: ArgumentHelp(
        "While requests come in a burst, poll for the next one this many microseconds before "
          + "sleeping (0: never).",
        discussion: "A sequential workload (a copy, a build, a script) then finds a running "
          + "thread instead of waking a sleeping one, which on a virtual machine costs about "
          + "as much as the request itself. The polling thread yields to any other thread that "
          + "wants its CPU, and the server's other threads wait off the device meanwhile; "
          + "nothing polls while the mount is idle, after a request that waited for the disk, "
          + "during a run of reads, or on a single CPU.",
        valueName: "microseconds"))
    var busyPoll: UInt32 = 200

    @Option(
      name: .customLong("io-uring-threads"),
      help: ArgumentHelp(
        "The most threads per CPU that serve requests through FUSE over io_uring, when the "
          + "kernel offers it (0: /dev/fuse only).",
        discussion: "Linux 6.14 and later offer the transport when the fuse module's "
          + "enable_uring parameter is on (echo Y > /sys/module/fuse/parameters/enable_uring, "
          + "as root). A request is then served by a thread on the CPU its sender runs on, "
          + "which makes metadata-heavy work (copies of many small files, builds, git) faster. "
          + "One thread per CPU serves at first; a CPU whose threads have all been busy with one "
          + "request for 20 ms gets another. "
          + "`zdc status --json` shows whether the mount uses it (kernel.ioUring).",
        valueName: "count"))
    var ioUringThreads: UInt32 = 2

    @Option(
      name: .customLong("readahead"),
      help: ArgumentHelp(
        "How far ahead of a sequential reader the kernel asks for data, in KiB "
          + "(1 to \(FuseMount.maxReadaheadKiB); 0: the kernel's default, 128).",
        discussion: "Larger read-ahead means fewer, larger reads: a sequential read of a large "
          + "file then costs the server about a third less CPU. Only the superuser may set it "
          + "(the mount's /sys/class/bdi/MAJOR:MINOR/read_ahead_kb); other users' mounts keep "
          + "the kernel's default.",
        valueName: "KiB"))
    var readahead: UInt32 = FuseMount.maxReadaheadKiB

    func validate() throws {
      if let pullInterval, !(pullInterval > 0) {
        throw ValidationError("--pull-interval takes a number of seconds above 0")
      }
      if !(1...64).contains(transfers) {
        throw ValidationError("--transfers takes a count from 1 to 64")
      }
      if ioUringThreads > 64 {
        throw ValidationError("--io-uring-threads takes a count from 0 to 64")
      }
      if readahead > FuseMount.maxReadaheadKiB {
        throw ValidationError(
          "--readahead takes a size in KiB from 0 to \(FuseMount.maxReadaheadKiB)")
      }
    }

    func run() throws {
      try runReportingErrors {
        let stateDirectory = state.stateDirectory
        let mp = URL(fileURLWithPath: mountpoint).standardizedFileURL.path
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: mp, isDirectory: &isDir), isDir.boolValue
        else { throw CLIError.usage("mount point \(mp) is not a directory") }
        let sock = stateDirectory.url.appendingPathComponent("control.sock").path
        if let obj = ControlClient.status(socketPath: sock) {
          let at = obj["mountpoint"] as? String ?? "?"
          throw CLIError.usage("this account is already mounted on \(at)")
        }
        let mounts = ProcFile.text("/proc/mounts")
        if mounts.split(separator: "\n").contains(where: {
          $0.split(separator: " ").dropFirst().first.map(String.init) == mp
        }) {
          throw CLIError.usage("\(mp) is already a mount point")
        }
        if foreground { Self.protectKeysInMemory() }
        let passphrase: String
        if daemonChild {
          passphrase = readLine(strippingNewline: true) ?? ""
        } else {
          passphrase = try pass.passphrase(
            prompt: stateDirectory.isInitialized ? "Passphrase: " : "New passphrase: ",
            confirm: !stateDirectory.isInitialized)
          if !stateDirectory.isInitialized {
            let location = try s3.prepare(
              try s3.location(store)
                ?? .localFolder(path: StateDirectory.defaultStoreFolder().path))
            let minimum = kdf == "minimum"
            let (account, recovery) = try Account.create(
              stateDirectory: stateDirectory, store: location, passphrase: passphrase,
              deviceName: ProcessInfo.processInfo.hostName,
              storeKDF: minimum ? .minimum : .moderate, localKDF: minimum ? .minimum : .interactive)
            print("Created user \(account.config.userID).")
            print("Recovery key (write it down; with it and the store, any device can join):")
            print("  \(recovery)")
          }
        }
        if !daemonChild, case .s3(let l) = try Account.readConfig(stateDirectory).store {
          // Credentials are looked up at every open: say now if there are none, not in a log.
          _ = try l.configuration()
        }
        if foreground {
          try serve(stateDirectory, passphrase: passphrase, mountpoint: mp)
        } else {
          try spawnDaemon(stateDirectory, passphrase: passphrase, mountpoint: mp)
        }
      }
    }

    /// The serving process holds the unlocked private keys. Like ssh-agent and gpg-agent, it
    /// makes itself not dumpable: a crash leaves no core dump, and no other process of the user
    /// can trace it or read its memory or environment. `ZDC_ALLOW_CORE_DUMPS=1` keeps it
    /// dumpable, to debug a crash.
    static func protectKeysInMemory() {
      guard ProcessInfo.processInfo.environment["ZDC_ALLOW_CORE_DUMPS"] != "1" else { return }
      if zdc_set_dumpable(0) != 0 {
        FileHandle.standardError.writeIgnoringErrors(
          Data("zdc: warning: could not turn off core dumps (errno \(errno))\n".utf8))
      }
    }

    /// Re-executes this program with `--foreground` in a new session, hands it the passphrase
    /// on a pipe and waits until it reports the mount live (or dies).
    func spawnDaemon(_ stateDirectory: StateDirectory, passphrase: String, mountpoint mp: String)
      throws
    {
      let logURL = stateDirectory.url.appendingPathComponent("mount.log")
      _ = FileManager.default.createFile(
        atPath: logURL.path, contents: nil, attributes: [.posixPermissions: 0o600])
      let log = try FileHandle(forWritingTo: logURL)
      log.seekToEndOfFile()
      let p = Process()
      p.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
      var args = [
        "mount", mp, "--foreground", "--daemon-child", "--state-dir", stateDirectory.url.path,
      ]
      for o in options { args += ["-o", o] }
      if verbose { args.append("--verbose") }
      if let pullInterval { args += ["--pull-interval", String(pullInterval)] }
      if let cacheSize { args += ["--cache-size", String(cacheSize)] }
      if let chunkShift { args += ["--chunk-shift", String(chunkShift)] }
      args += ["--drain-stall", String(drainStall)]
      args += ["--upload-delay", String(uploadDelay)]
      args += ["--transfers", String(transfers)]
      args += ["--busy-poll", String(busyPoll)]
      args += ["--io-uring-threads", String(ioUringThreads)]
      args += ["--readahead", String(readahead)]
      p.arguments = args
      let input = Pipe()
      let output = Pipe()
      p.standardInput = input
      p.standardOutput = output
      p.standardError = log
      try p.run()
      input.fileHandleForWriting.writeIgnoringErrors(Data((passphrase + "\n").utf8))
      try? input.fileHandleForWriting.close()
      let line = output.fileHandleForReading.readLine()
      if line == "ready" {
        print("Mounted on \(mp) (process \(p.processIdentifier)).")
        return
      }
      p.waitUntilExit()
      let tail =
        (try? String(contentsOf: logURL, encoding: .utf8))?
        .split(separator: "\n").suffix(3).joined(separator: "\n") ?? ""
      throw CLIError.usage("mount failed: \(tail)")
    }

    /// Opens everything and serves the mount in this process.
    func serve(_ stateDirectory: StateDirectory, passphrase: String, mountpoint mp: String) throws {
      if daemonChild {
        setsid()
        // Hold no directory of the caller's busy (paths here are absolute).
        _ = chdir("/")
      }
      // A write past a file size limit (`ulimit -f`) fails with EFBIG, which the file system
      // reports, instead of ending the process with SIGXFSZ.
      signal(SIGXFSZ, SIG_IGN)
      let level: Logger.Level = verbose ? .debug : .info
      LoggingSystem.bootstrap { label in
        var h = StreamLogHandler.standardError(label: label)
        h.logLevel = level
        return h
      }
      let logger = Logger(label: "zdc.mount")
      let account = try Account.open(
        stateDirectory: stateDirectory, passphrase: passphrase, transfers: transfers)
      if case .s3(let l) = account.config.store, l.unconditionalWritesAccepted == true {
        logger.warning(
          "the store does not honour conditional writes: changes made on two devices at once may overwrite each other"
        )
      }
      if !account.catalog.isJournaled {
        logger.warning(
          "another process has this account's catalog open: every change commits at once (slower)"
        )
      }
      let cacheKey = try KeyDerivation.key(
        for: .localCache, secret: account.keys.keyPair.boxSecretKey)
      let disk = try DiskManager(
        directory: stateDirectory.url, key: cacheKey, capBytes: cacheSize,
        chunkShift: chunkShift ?? CryptoFile.defaultChunkShift)
      let downloads = DownloadManager(
        store: account.store, disk: disk, catalog: account.catalog, userID: account.config.userID)
      let fs = try FileSystem(
        catalog: account.catalog, userID: account.config.userID, disk: disk, downloads: downloads)
      let sync = try makeSync(account: account, fileSystem: fs, stateDirectory: stateDirectory)
      let mount = FuseMount(
        fileSystem: fs, mountpoint: mp, options: options,
        stateDirectory: stateDirectory.url.standardizedFileURL.path, busyPollMicroseconds: busyPoll,
        ioUringThreads: ioUringThreads, readaheadKiB: readahead)
      try mount.mount()
      try sync.start(delegate: FileSystemSyncDelegate(fileSystem: fs))
      let control = try ControlServer(
        socketPath: stateDirectory.url.appendingPathComponent("control.sock").path,
        mountpoint: mp, fileSystem: fs, sync: sync,
        storeRequests: Self.requestCounter(account.store),
        kernelFeatures: { mount.kernelFeatures })
      try control.start()
      logger.info("mounted")
      if daemonChild {
        FileHandle.standardOutput.writeIgnoringErrors(Data("ready\n".utf8))
        let null = open("/dev/null", O_RDWR)
        if null >= 0 {
          dup2(null, STDIN_FILENO)
          dup2(null, STDOUT_FILENO)
          close(null)
        }
      }
      defer { control.stop() }
      try mount.run()
      do { try account.catalog.commitPending() } catch {
        logger.error("could not commit the last changes: \(error)")
      }
      control.setDraining(true)
      let drained = sync.drain(timeout: 3600, stall: drainStall) { items, bytes in
        logger.debug("waiting for uploads: \(items) items, \(bytes) bytes")
      }
      if !drained { logger.info("uploads left queued for the next mount") }
      sync.stop()
      disk.flush()
      disk.discardSpares()
      logger.info("unmounted")
    }

    /// The store's request counts by kind, for `zdc status` (S3 stores count their requests).
    static func requestCounter(_ store: any CloudStore) -> (@Sendable () -> [String: Int])? {
      guard let s3 = store as? S3Store else { return nil }
      return {
        var out: [String: Int] = [:]
        for (kind, n) in s3.requestCounts { out[kind.rawValue] = n }
        return out
      }
    }

    /// The sync engine for this mount: pushes to and pulls from the account's store, with
    /// multipart uploads staged in `push/` under the state directory.
    func makeSync(account: Account, fileSystem fs: FileSystem, stateDirectory: StateDirectory)
      throws -> EngineSyncHooks
    {
      let work = stateDirectory.url.appendingPathComponent("push", isDirectory: true)
      try FileManager.default.createDirectory(
        at: work, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
      let syncAccount = SyncAccount(
        userID: account.config.userID, keys: account.keys.keyPair,
        deviceID: account.config.deviceID, deviceName: account.config.deviceName)
      let catalog = account.catalog
      let store = account.store
      var pull = PullConfiguration()
      if let pullInterval { pull.pullInterval = pullInterval }
      let pullConfiguration = pull
      return EngineSyncHooks(
        make: { delegate, progress in
          try SyncEngine(
            catalog: catalog, store: store, account: syncAccount, delegate: delegate,
            push: PushConfiguration(
              workDirectory: work, maxConcurrentOperations: transfers,
              settleDelay: max(0, uploadDelay), workerNice: 10,
              activity: fs.activity),
            pull: pullConfiguration,
            progress: progress)
        },
        pending: {
          let s = try? fs.status()
          return (s?.pendingItems ?? 0, s?.pendingBytes ?? 0)
        })
    }
  }

  struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Unmount a zdcfs mount (waits for pending uploads and for its process to finish)."
    )

    @OptionGroup var state: StateOptions

    @Argument(help: "The mount point.")
    var mountpoint: String

    @Flag(help: "Detach now even if files are open; the mount goes away when they close.")
    var lazy = false

    @Flag(help: "Do not wait for pending uploads; they stay queued for the next mount.")
    var noWait = false

    func run() throws {
      try runReportingErrors {
        let mp = URL(fileURLWithPath: mountpoint).standardizedFileURL.path
        let dir = Self.stateDirectory(of: mp, given: state)
        let sock = dir.appendingPathComponent("control.sock").path
        let before = ControlClient.status(socketPath: sock)
        let server = (before?["pid"] as? Int).map { pid_t($0) }
        if before?["sync"] as? String == "draining" {
          // Already gone from the kernel and uploading: only wait (or stop waiting).
          waitForServer(sock, pid: server)
          print("Unmounted \(mp).")
          reportQueued(dir)
          return
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/fusermount3")
        p.arguments = lazy ? ["-u", "-z", mp] : ["-u", mp]
        let err = Pipe()
        p.standardError = err
        try p.run()
        let message = String(
          decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        if p.terminationStatus != 0 {
          if message.contains("busy") {
            FileHandle.standardError.write(
              Data(
                "zdc: \(mp) is busy: close the files open in it (see `fuser -m \(mp)`), or use --lazy\n"
                  .utf8))
            throw ExitCode(ExitStatus.temporaryFailure.rawValue)
          }
          throw CLIError.usage(
            "cannot unmount \(mp): \(message.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        waitForServer(sock, pid: server)
        print("Unmounted \(mp).")
        reportQueued(dir)
      }
    }

    /// Says how many uploads the server left queued for the next mount (`--no-wait`, or a store
    /// that stopped taking them), if any; not with `--lazy`, whose server may still be at work.
    func reportQueued(_ dir: URL) {
      guard !lazy, let count = queuedUploads(StateDirectory(url: dir)), count > 0 else { return }
      print("Pending uploads left queued for the next mount: \(count) items.")
    }

    /// The state directory of the mount at `mountpoint`: the one the mount recorded as its
    /// source, unless `--state-dir` names another whose process serves that mount point; else
    /// the given (or default) one.
    static func stateDirectory(of mountpoint: String, given: StateOptions) -> URL {
      let table = ProcFile.text("/proc/self/mountinfo")
      guard let recorded = FuseMount.stateDirectory(ofMountpoint: mountpoint, mountTable: table)
      else { return given.stateDirectory.url }
      if given.stateDir != nil {
        let sock = given.stateDirectory.url.appendingPathComponent("control.sock").path
        if ControlClient.status(socketPath: sock)?["mountpoint"] as? String == mountpoint {
          return given.stateDirectory.url
        }
      }
      return URL(fileURLWithPath: recorded, isDirectory: true)
    }

    /// Waits until the serving process (`pid`, when known) has uploaded what is pending (unless
    /// `--no-wait`), removed its control socket and finished (it closes the catalog last: a
    /// mount started meanwhile would find it still held), printing what is left while it
    /// uploads.
    func waitForServer(_ sock: String, pid: pid_t?) {
      if noWait { _ = ControlClient.request(socketPath: sock, command: "cancel-drain") }
      var deadline = Date().addingTimeInterval(lazy ? 0 : 15)
      let display = ProgressDisplay(
        label: "Waiting for uploads", hint: "(--no-wait to leave them queued)")
      defer { display.finish() }
      while FileManager.default.fileExists(atPath: sock), Date() < deadline {
        guard let obj = ControlClient.status(socketPath: sock) else { break }
        if noWait, obj["sync"] as? String == "draining" {
          // The process may have started draining after the first request: ask again.
          _ = ControlClient.request(socketPath: sock, command: "cancel-drain")
        } else if !lazy, obj["sync"] as? String == "draining" {
          // Waiting for uploads: no deadline while the process reports progress.
          deadline = Date().addingTimeInterval(15)
          display.update(
            items: obj["pendingItems"] as? Int ?? 0, bytes: Int64(obj["pendingBytes"] as? Int ?? 0))
        }
        usleep(100_000)
      }
      guard !lazy, let pid else { return }
      let end = Date().addingTimeInterval(15)
      while Self.isRunning(pid), Date() < end { usleep(20_000) }
    }

    /// True while `pid` runs (a process that has ended but not been reaped does not).
    static func isRunning(_ pid: pid_t) -> Bool {
      guard kill(pid, 0) == 0 else { return false }
      let stat = ProcFile.text("/proc/\(pid)/stat")
      guard let close = stat.lastIndex(of: ")") else { return false }
      return !stat[close...].hasPrefix(") Z")
    }
  }

  struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Show whether the treesystem is mounted and what waits for upload.")

    @OptionGroup var state: StateOptions

    @Flag(help: "Print the raw JSON answer.")
    var json = false

    /// The fuse module's switch for FUSE over io_uring (Linux 6.14 and later).
    static let uringParameter = "/sys/module/fuse/parameters/enable_uring"

    /// How requests reach the mount (the `kernel` part of the status), with how to make
    /// metadata-heavy work faster when the kernel could use io_uring and does not.
    static func transportLine(_ kernel: [String: Bool]) -> String {
      if kernel["ioUring"] == true { return "Kernel transport: FUSE over io_uring." }
      guard kernel["ioUringOffered"] != true, FileManager.default.fileExists(atPath: uringParameter)
      else { return "Kernel transport: /dev/fuse." }
      return """
        Kernel transport: /dev/fuse. This kernel can also serve requests through io_uring, \
        which makes metadata-heavy work (copies of many small files, builds, git) faster: \
        as root, `echo Y > \(uringParameter)`, then mount again.
        """
    }

    func run() throws {
      try runReportingErrors {
        let sock = state.stateDirectory.url.appendingPathComponent("control.sock").path
        guard let answer = ControlClient.request(socketPath: sock, command: "status") else {
          print("Not mounted.")
          if let count = queuedUploads(state.stateDirectory) {
            print("Pending uploads: \(count) items.")
          }
          return
        }
        if json {
          print(answer)
          return
        }
        guard let obj = try? JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: Any]
        else { throw CLIError.usage("unexpected answer from the mount") }
        print("Mounted on \(obj["mountpoint"] ?? "?").")
        print(
          "Pending uploads: \(obj["pendingItems"] ?? 0) items, \(obj["pendingBytes"] ?? 0) bytes.")
        let conflicts = obj["conflicts"] as? Int ?? 0
        print("Conflicts: \(conflicts). Errors: \(obj["errors"] ?? 0).")
        let mountpoint = obj["mountpoint"] as? String ?? "."
        for path in obj["conflictPaths"] as? [String] ?? [] {
          print("  conflicted copy: \(mountpoint)/\(path)")
        }
        if conflicts > 0 {
          print("  (both versions are kept; rename or delete a copy once you have merged it)")
        }
        print("Open files: \(obj["openFiles"] ?? 0).")
        if let kernel = obj["kernel"] as? [String: Bool] { print(Self.transportLine(kernel)) }
        if let used = obj["cacheBytes"] as? Int, let cap = obj["cacheCapBytes"] as? Int {
          print(
            "Local cache: \(ProgressDisplay.bytes(Int64(used))) of \(ProgressDisplay.bytes(Int64(cap)))."
          )
        }
        print("Sync engine: \(obj["sync"] ?? "not running") (process \(obj["pid"] ?? "?")).")
        if obj["sync"] as? String != "not running" {
          print(
            "Uploading: \(obj["uploading"] ?? 0) items. Downloading: \(obj["downloading"] ?? 0) items."
          )
          print("Last pull: \((obj["lastPull"] as? String) ?? "never").")
          if obj["fullScanDue"] as? Bool == true {
            print("A full scan of the store is due: the next pull reads the whole tree.")
          }
          if let e = obj["lastError"] as? String { print("Last error: \(e)") }
        }
        if let requests = obj["storeRequests"] as? [String: Int] {
          let total = requests.values.reduce(0, +)
          let detail = requests.filter { $0.value > 0 }.sorted { $0.key < $1.key }
            .map { "\($0.key) \($0.value)" }.joined(separator: ", ")
          print("Store requests since mount: \(total)\(detail.isEmpty ? "" : " (\(detail))").")
        }
      }
    }
  }
}

extension FileHandle {
  /// Reads one line (without the newline), or `nil` at end of file or on an error.
  func readLine() -> String? {
    var bytes: [UInt8] = []
    var b: UInt8 = 0
    while true {
      let n = Glibc.read(fileDescriptor, &b, 1)
      if n < 0, errno == EINTR { continue }
      guard n == 1 else { return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self) }
      if b == 0x0A { return String(decoding: bytes, as: UTF8.self) }
      bytes.append(b)
    }
  }

  /// Writes everything, ignoring errors (the peer may be gone).
  func writeIgnoringErrors(_ data: Data) {
    try? write(contentsOf: data)
  }
}

/// How many uploads wait in the catalog of an account that is not mounted (the catalog needs no
/// key), or nil when it cannot be read.
func queuedUploads(_ dir: StateDirectory) -> Int? {
  guard dir.isInitialized, let config = try? Account.readConfig(dir),
    let catalog = try? Catalog(path: dir.catalogURL.path)
  else { return nil }
  return try? catalog.read(config.userID, { try $0.operationCount() })
}
