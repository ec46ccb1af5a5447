import Foundation
import Testing
import ZDCCore
import ZDCLocalStore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// One device of a shared account: its own state directory and mount point, the real `zdc`
/// binary, and a mount that is always unmounted (its process killed if it lingers) on release.
final class SyncDevice: @unchecked Sendable {
  // @unchecked: used by one test at a time.
  let name: String
  let state: URL
  let mnt: URL
  let store: MountStore
  let mountArguments: [String]
  let zdc = BuiltProducts.executable("zdc")
  var pid: pid_t?

  static let passphrase = "sync mount test passphrase"

  var env: [String: String] {
    ["ZDC_STATE_DIR": state.path, "ZDC_PASSPHRASE": Self.passphrase, "LC_ALL": "C"].merging(
      store.environment
    ) { $1 }
  }

  /// Creates the account (`join == false`) or joins it on a local-folder store, then mounts.
  convenience init(
    _ name: String, in dir: TemporaryDirectory, store: URL, join: Bool,
    mountArguments: [String] = ["--pull-interval", "3600"]
  ) throws {
    try self.init(
      name, in: dir, store: MountStore.local(store), join: join, mountArguments: mountArguments)
  }

  /// Creates the account (`join == false`) or joins it, then mounts; an S3 store is reached
  /// through `endpoint` (moto's own by default).
  init(
    _ name: String, in dir: TemporaryDirectory, store: MountStore, join: Bool,
    mountArguments: [String] = ["--pull-interval", "3600"], endpoint: String? = nil
  ) throws {
    self.name = name
    state = dir.path("state-\(name)")
    mnt = dir.path("mnt-\(name)")
    self.store = store
    self.mountArguments = mountArguments
    try FileManager.default.createDirectory(at: mnt, withIntermediateDirectories: true)
    var args =
      ["init", "--kdf", "minimum", "--device-name", name]
      + store.initArguments(endpoint: endpoint)
    if join { args.append("--join") }
    let r = try runProcess(zdc, args, environment: env)
    try #require(r.status == 0, "init of \(name) failed: \(r.stderr)")
    try mount()
  }

  deinit { unmount(wait: false) }

  var isMounted: Bool {
    let mounts = ProcFile.text("/proc/mounts")
    return mounts.split(separator: "\n").contains {
      $0.split(separator: " ").dropFirst().first.map(String.init) == mnt.path
    }
  }

  func mount() throws {
    let r = try runProcess(zdc, ["mount", mnt.path] + mountArguments, environment: env)
    try #require(r.status == 0, "mount of \(name) failed: \(r.stdout) \(r.stderr)")
    if let range = r.stdout.range(of: "process ") {
      pid = pid_t(r.stdout[range.upperBound...].prefix { $0.isNumber })
    }
    try #require(pid != nil)
    try #require(isMounted)
  }

  /// Unmounts (waiting for uploads unless `wait` is false), then lazily, then kills the
  /// serving process.
  @discardableResult
  func unmount(wait: Bool = true) -> ProcessResult? {
    var result: ProcessResult? = nil
    if isMounted {
      result = try? runProcess(
        zdc, ["unmount", mnt.path] + (wait ? [] : ["--no-wait"]), environment: env)
    }
    if isMounted {
      _ = try? runProcess(URL(fileURLWithPath: "/usr/bin/fusermount3"), ["-u", "-z", mnt.path])
    }
    if let pid {
      for _ in 0..<200 where Self.isAlive(pid) { usleep(50_000) }
      if Self.isAlive(pid) { kill(pid, SIGKILL) }
    }
    pid = nil
    return result
  }

  /// Two devices of a new account on `store`: "devA" creates it, "devB" joins, mounted with
  /// `bArguments`.
  static func pair(
    in dir: TemporaryDirectory, store: MountStore,
    bArguments: [String] = ["--pull-interval", "3600"]
  ) throws -> (SyncDevice, SyncDevice) {
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    do {
      return (
        a,
        try SyncDevice("devB", in: dir, store: store, join: true, mountArguments: bArguments)
      )
    } catch {
      a.unmount(wait: false)
      throw error
    }
  }

  /// ``pair(in:store:bArguments:)`` on a local-folder store.
  static func pair(
    in dir: TemporaryDirectory, store: URL, bArguments: [String] = ["--pull-interval", "3600"]
  ) throws -> (SyncDevice, SyncDevice) {
    try pair(in: dir, store: MountStore.local(store), bArguments: bArguments)
  }

  /// Unmounts each device without waiting for uploads (the end of a test).
  static func unmountAll(_ devices: [SyncDevice]) {
    for d in devices.reversed() { d.unmount(wait: false) }
  }

  /// Kills the serving process with SIGKILL (a crash), waits for it to end and clears the
  /// dead mount point, ready for `mount()`.
  func killServingProcess(sourceLocation: SourceLocation = #_sourceLocation) throws {
    let pid = try #require(pid, sourceLocation: sourceLocation)
    kill(pid, SIGKILL)
    for _ in 0..<200 where Self.isAlive(pid) { usleep(50_000) }
    self.pid = nil
    let u = try runProcess(URL(fileURLWithPath: "/usr/bin/fusermount3"), ["-u", mnt.path])
    #expect(u.status == 0, "\(u.stderr)", sourceLocation: sourceLocation)
  }

  /// True while the process exists and is not a zombie.
  static func isAlive(_ pid: pid_t) -> Bool {
    guard kill(pid, 0) == 0 else { return false }
    let stat = ProcFile.text("/proc/\(pid)/stat")
    guard let close = stat.lastIndex(of: ")") else { return false }
    return !stat[close...].hasPrefix(") Z")
  }

  /// Runs `zdc` with this device's state directory.
  @discardableResult
  func run(_ args: [String]) throws -> ProcessResult {
    try runProcess(zdc, args, environment: env)
  }

  /// `zdc sync`, expected to succeed.
  func sync(timeout: Int = 60, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let r = try run(["sync", "--timeout", String(timeout)])
    #expect(
      r.status == 0, "zdc sync on \(name): \(r.stdout) \(r.stderr)",
      sourceLocation: sourceLocation)
    #expect(r.stdout.contains("In sync"), sourceLocation: sourceLocation)
  }

  /// Runs a shell script inside the mount point.
  @discardableResult
  func sh(
    _ script: String, expect status: Int32 = 0, sourceLocation: SourceLocation = #_sourceLocation
  ) throws -> ProcessResult {
    let r = try runProcess(
      URL(fileURLWithPath: "/bin/sh"), ["-c", "cd '\(mnt.path)' && \(script)"], environment: env)
    #expect(
      r.status == status, "\(name): \(script)\nstdout: \(r.stdout)\nstderr: \(r.stderr)",
      sourceLocation: sourceLocation)
    return r
  }

  /// The names in a directory of the mount, as `ls -A` shows them (sorted).
  func ls(_ path: String = ".") throws -> [String] {
    try sh("ls -A '\(path)'").stdout.split(separator: "\n").map(String.init).sorted()
  }

  /// The listing of `path` once it is `expected` (a periodic pull brings it), or as it is
  /// after 10 s.
  func ls(eventually expected: [String], _ path: String = ".") throws -> [String] {
    var seen: [String] = []
    for _ in 0..<100 {
      seen = try ls(path)
      if seen == expected { break }
      usleep(100_000)
    }
    return seen
  }

  func file(_ path: String) -> URL { mnt.appendingPathComponent(path) }

  /// The files in this device's staging pool (content not uploaded yet).
  var stagedFiles: [String] {
    (try? FileManager.default.contentsOfDirectory(
      atPath: state.appendingPathComponent("staging").path))
      ?? []
  }

  /// The files in this device's cache pool.
  var cachedFiles: [String] {
    (try? FileManager.default.contentsOfDirectory(
      atPath: state.appendingPathComponent("cache").path))
      ?? []
  }

  /// Where ciphertext of this device lives outside the store (caches, staging, push work).
  var cacheDirectories: [URL] {
    ["cache", "staging", "push"].map { state.appendingPathComponent($0) }
  }
}

/// Two mounts of one store in two processes, driven with ordinary tools and `zdc sync`.
@Suite(.serialized, .motoServer) struct SyncMountTests {
  static func random(_ count: Int) throws -> Data {
    let h = try #require(FileHandle(forReadingAtPath: "/dev/urandom"))
    defer { try? h.close() }
    return h.readData(ofLength: count)
  }

  /// A marker that is easy to find if it ever reached a store or cache in plaintext.
  static func marker(_ label: String) -> Data {
    Data("zdc-plaintext-marker-\(label)-\(UUID().uuidString)\n".utf8)
  }

  static func expectNoPlaintext(
    _ needles: [Data], store: URL, devices: [SyncDevice],
    sourceLocation: SourceLocation = #_sourceLocation
  ) throws {
    try expectNoPlaintext(
      needles, store: .local(store), devices: devices, sourceLocation: sourceLocation)
  }

  static func expectNoPlaintext(
    _ needles: [Data], store: MountStore, devices: [SyncDevice],
    sourceLocation: SourceLocation = #_sourceLocation
  ) throws {
    var hits = try store.plaintext(needles)
    for d in devices {
      for dir in d.cacheDirectories { hits += try findPlaintext(needles, under: dir) }
      // The daemon logs at info level: never a name or content there either.
      let log = (try? Data(contentsOf: d.state.appendingPathComponent("mount.log"))) ?? Data()
      for needle in needles where !needle.isEmpty && log.range(of: needle) != nil {
        hits.append("mount.log of \(d.name) contains \(needle.count) plaintext bytes")
      }
    }
    #expect(hits.isEmpty, "plaintext found: \(hits)", sourceLocation: sourceLocation)
  }

  static func expectNoFuseMounts(under dir: TemporaryDirectory) {
    let mounts = ProcFile.text("/proc/mounts")
    #expect(!mounts.contains(dir.url.path), "mounts left: \(mounts)")
  }

  /// The DATA objects in a store.
  static func dataObjects(_ store: URL) -> [String] {
    let walker = FileManager.default.enumerator(at: store, includingPropertiesForKeys: nil)
    var out: [String] = []
    while let url = walker?.nextObject() as? URL {
      if url.pathExtension == "data" { out.append(url.path) }
    }
    return out
  }

  /// On a local folder and on S3 (moto).
  @Test(arguments: [false, true])
  func twoMountsSyncFilesRenamesDeletesAndConflicts(onS3: Bool) throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = onS3 ? try MountStore.s3() : .local(dir.path("store"))
    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }

    // A file written and closed on A reaches B through the store, without a remount of B.
    let content = try Self.random(300_000) + Self.marker("content")
    let secondName = "second-\(UUID().uuidString.prefix(8)).txt"
    let second = Self.marker("second")
    try a.sh("mkdir docs")
    try content.write(to: a.file("docs/report.bin"))
    try second.write(to: a.file(secondName))
    #expect(try b.ls() == [])
    try a.sync()
    try b.sync()
    #expect(try b.ls() == ["docs", secondName].sorted())
    #expect(try b.ls("docs") == ["report.bin"])
    #expect(try Data(contentsOf: b.file("docs/report.bin")) == content)
    #expect(try Data(contentsOf: b.file(secondName)) == second)

    // A rename and a delete on B reach A.
    try b.sh("mv docs/report.bin docs/renamed.bin && rm '\(secondName)'")
    try b.sync()
    #expect(try a.ls() == ["docs", secondName].sorted())
    try a.sync()
    #expect(try a.ls() == ["docs"])
    #expect(try a.ls("docs") == ["renamed.bin"])
    #expect(try Data(contentsOf: a.file("docs/renamed.bin")) == content)

    // Both edit one file without hearing of the other's edit: both versions survive on both.
    try Data("base version\n".utf8).write(to: a.file("shared.txt"))
    try a.sync()
    try b.sync()
    #expect(try Data(contentsOf: b.file("shared.txt")) == Data("base version\n".utf8))
    let fromA = Data("edited on device A\n".utf8)
    let fromB = Data("edited on device B, longer\n".utf8)
    try fromA.write(to: a.file("shared.txt"))
    try a.sync()
    try fromB.write(to: b.file("shared.txt"))
    try b.sync()
    try a.sync()
    for d in [a, b] {
      let names = try d.ls().filter { $0.hasPrefix("shared") }
      #expect(names.count == 2, "\(d.name): \(names)")
      #expect(names.contains("shared.txt"))
      let copy = names.first { $0.hasPrefix("shared (conflicted copy ") && $0.hasSuffix(".txt") }
      #expect(copy != nil, "\(d.name): \(names)")
      let versions = Set(try names.map { try Data(contentsOf: d.file($0)) })
      #expect(versions == [fromA, fromB], "\(d.name)")
      // Each version keeps its own size (the losing device's RCRD upload waits for its DATA
      // upload, which meets the conflict, instead of putting its size over the winner's RCRD).
      for n in names {
        let size = try FileManager.default.attributesOfItem(atPath: d.file(n).path)[.size]
        let bytes = try Data(contentsOf: d.file(n)).count
        #expect((size as? Int) == bytes, "\(d.name): size of \(n)")
      }
    }

    // B met the conflict (its upload came second): `zdc status` names the copy until the user
    // settles it by renaming (or deleting) it.
    let before = try b.run(["status"]).stdout
    #expect(before.contains("Conflicts: 1."), "\(before)")
    #expect(before.contains("conflicted copy: \(b.mnt.path)/shared (conflicted copy "), "\(before)")
    let copy = try #require(try b.ls().first { $0.hasPrefix("shared (conflicted copy ") })
    #expect(
      try b.sh("getfattr --only-values -n user.zdc.state '\(copy)'").stdout == "conflict")
    try b.sh("mv '\(copy)' shared-merged.txt")
    #expect(try b.run(["status"]).stdout.contains("Conflicts: 0."))

    #expect(a.unmount()?.status == 0)
    #expect(b.unmount()?.status == 0)
    try Self.expectNoPlaintext(
      [content.suffix(40), second, Data("report".utf8), Data(secondName.utf8), fromA, fromB],
      store: store, devices: [a, b])
  }

  /// One device removes a folder while the other adds files to it: the folder comes back with
  /// the files, and each device reads them (found by tools/fsx-sync: the device that had
  /// uploaded a file before it heard of the delete lost track of its content, EIO).
  /// A FIFO and a socket's name made on one device are the same on the other: names with
  /// their type and permission bits (the kernel of each carries their data).
  @Test func fifosAndSocketNamesSyncWithTheirType() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh(
      "mkfifo -m 0640 pipe && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\""
    )
    try a.sync()
    try b.sync()
    #expect(try b.sh("stat -c '%F %a' pipe sock").stdout == "fifo 640\nsocket 755\n")
    #expect(try b.sh("ls -l pipe sock | cut -c1").stdout == "p\ns\n")
  }

  @Test func filesAddedToAFolderAnotherDeviceRemovesStayReadableOnBoth() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh("mkdir d")
    try a.sync()
    try b.sync()
    try b.sh("rmdir d")
    try a.sh("echo hello > d/f && mkdir d/e && echo deeper > d/e/g")
    for _ in 0..<2 {
      try a.sync()
      try b.sync()
    }
    for d in [a, b] {
      #expect(try d.sh("cat d/f d/e/g").stdout == "hello\ndeeper\n", "\(d.name)")
    }
  }

  /// A file this device moved out of a folder that another device deleted meanwhile comes back
  /// where it was moved, with its content. Such a kept node had its content here only in the
  /// cache, under the version its catalog entry no longer named, and went up empty (found by
  /// tools/fsx-sync, seed 111).
  @Test func aFileMovedOutOfAFolderAnotherDeviceDeletesKeepsItsContent() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(
      in: dir, store: store,
      bArguments: ["--pull-interval", "3600", "--upload-delay", "600"])
    defer { SyncDevice.unmountAll([a, b]) }
    try b.sh("mkdir d e && seq 1 20000 > d/f")
    try b.sync()
    try a.sync()
    try b.sh("mv d/f e/f")
    try a.sh("rm -r d")
    try a.sync()
    for _ in 0..<2 {
      try b.sync()
      try a.sync()
    }
    for d in [a, b] {
      #expect(try d.ls() == ["e"], "\(d.name)")
      try d.sh("seq 1 20000 | cmp - e/f")
    }
  }

  /// The kernel keeps a directory's listing with the directory's inode (it opens directories
  /// without asking). A pull that deletes an entry whose name the kernel no longer holds as a
  /// dentry must still drop that listing.
  @Test func aPulledDeleteLeavesNoStaleNameInAListingTheKernelKeeps() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh("mkdir d && echo one > d/gone.txt && echo two > d/kept.txt")
    try a.sync()
    try b.sync()
    // A process working in the directory keeps its inode, and with it the listing, while the
    // kernel lets go of the entries' dentries.
    let holder = Process()
    holder.executableURL = URL(fileURLWithPath: "/bin/sleep")
    holder.arguments = ["300"]
    holder.currentDirectoryURL = b.file("d")
    try holder.run()
    defer {
      kill(holder.processIdentifier, SIGKILL)
      holder.waitUntilExit()
    }
    #expect(try b.ls("d") == ["gone.txt", "kept.txt"])
    if getuid() == 0 { try b.sh("sync && echo 2 > /proc/sys/vm/drop_caches") }
    try a.sh("rm d/gone.txt")
    try a.sync()
    try b.sync()
    #expect(try b.ls("d") == ["kept.txt"])
  }

  /// Names that differ only in case are kept side by side, as on a local file system, and
  /// reach the other device so; a tree holding such names copies in whole.
  @Test func namesThatDifferOnlyInCaseAreKeptAndSynced() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(in: dir, store: store)
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh(
      "echo upper > Makefile && echo lower > makefile && mkdir D d && echo in > d/x"
        + " && ln -s Makefile MAKEFILE && cp -r /usr/include/linux/netfilter nf"
        + " && diff -r /usr/include/linux/netfilter nf")
    #expect(try a.ls() == ["D", "MAKEFILE", "Makefile", "d", "makefile", "nf"])
    #expect(try a.sh("cat Makefile makefile MAKEFILE d/x").stdout == "upper\nlower\nupper\nin\n")
    // Renames: onto a case variant's exact name replaces it; onto a new spelling keeps both.
    try a.sh("echo third > tmp && mv tmp MakeFile && mv makefile mk && mv mk makefile")
    #expect(try a.sh("cat MakeFile makefile").stdout == "third\nlower\n")
    // The first spelling gone, the others are still found.
    try a.sh("rm Makefile && rmdir D")
    #expect(try a.sh("cat MakeFile makefile; ls d").stdout == "third\nlower\nx\n")
    try a.sync()
    try b.sync()
    #expect(try b.ls() == ["MAKEFILE", "MakeFile", "d", "makefile", "nf"])
    #expect(try b.sh("cat MakeFile makefile d/x").stdout == "third\nlower\nin\n")
    #expect(try b.sh("diff -r /usr/include/linux/netfilter nf").status == 0)
    // Back on A after a remount: the same.
    a.unmount(wait: true)
    try a.mount()
    #expect(try a.ls() == ["MAKEFILE", "MakeFile", "d", "makefile", "nf"])
    #expect(try a.sh("cat MakeFile makefile").stdout == "third\nlower\n")
  }

  /// Two devices that each create one spelling of a name before either syncs keep both,
  /// whether the second one learns of the first by its upload failing (the same cloudName) or
  /// by a pull: not a conflict, both names stay as typed.
  @Test(arguments: [false, true])
  func spellingsThatDifferOnlyInCaseFromTwoDevicesAreBothKept(pullFirst: Bool) throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(
      in: dir, store: store,
      bArguments: pullFirst
        ? ["--pull-interval", "1", "--upload-delay", "600"] : ["--pull-interval", "3600"])
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh("echo A > Makefile")
    try b.sh("echo B > makefile")
    try a.sync()
    if pullFirst {
      // B pulls A's spelling before it uploads its own.
      #expect(try b.ls(eventually: ["Makefile", "makefile"]) == ["Makefile", "makefile"])
    }
    try b.sync()
    try a.sync()
    for d in [a, b] {
      #expect(try d.ls() == ["Makefile", "makefile"], "\(d.name)")
      #expect(try d.sh("cat Makefile makefile").stdout == "A\nB\n", "\(d.name)")
    }
    #expect(try b.run(["status"]).stdout.contains("Conflicts: 0."))
  }

  /// One device renames its file to exactly the spelling another device kept as a case variant
  /// of it: the variant becomes `makefile 2` on both (a path conflict), so that no name changes
  /// later without a rename (found by tools/fsx-sync, where a variant shown escaped beside its
  /// own name was shown plain once that name went).
  @Test func aRenameOntoASpellingAnotherDeviceKeptAsAVariantIsAPathConflict() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(
      in: dir, store: store,
      bArguments: ["--pull-interval", "1", "--upload-delay", "600"])
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh("echo A > Makefile")
    try a.sync()
    try b.sh("echo B > makefile")
    // B pulls A's spelling before it uploads its own, which it keeps as a case variant.
    #expect(try b.ls(eventually: ["Makefile", "makefile"]) == ["Makefile", "makefile"])
    try a.sh("mv Makefile makefile")
    try a.sync()
    try b.sync()
    try a.sync()
    for d in [a, b] {
      #expect(try d.ls() == ["makefile", "makefile 2"], "\(d.name)")
      #expect(try d.sh("cat makefile 'makefile 2'").stdout == "A\nB\n", "\(d.name)")
    }
    // The plain name going leaves the other's name as it is.
    try a.sh("rm makefile")
    try a.sync()
    try b.sync()
    #expect(try b.ls() == ["makefile 2"])
  }

  @Test func periodicPullsShowRemoteChangesWithoutSync() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let (a, b) = try SyncDevice.pair(
      in: dir, store: store,
      bArguments: ["--pull-interval", "1"])
    defer { SyncDevice.unmountAll([a, b]) }
    #expect(try b.ls() == [])
    let content = Self.marker("periodic")
    try content.write(to: a.file("news.txt"))
    try a.sync()
    #expect(try b.ls(eventually: ["news.txt"]) == ["news.txt"])
    #expect(try Data(contentsOf: b.file("news.txt")) == content)
    // A change of content is seen too (the kernel's cached pages are invalidated).
    let changed = Self.marker("periodic-changed")
    try changed.write(to: a.file("news.txt"))
    try a.sync()
    var now = Data()
    for _ in 0..<100 {
      now = try Data(contentsOf: b.file("news.txt"))
      if now == changed { break }
      usleep(100_000)
    }
    #expect(now == changed)
    let status = try b.run(["status"])
    #expect(status.stdout.contains("Last pull: 20"), "\(status.stdout)")
    #expect(!status.stdout.contains("full scan"), "\(status.stdout)")
    // Every pull placed what it found: no full scan is due.
    let json =
      try JSONSerialization.jsonObject(
        with: Data(try b.run(["status", "--json"]).stdout.utf8)) as? [String: Any]
    #expect(json?["fullScanDue"] as? Bool == false, "\(String(describing: json))")
  }

  /// A device whose place in the change log another device compacted away catches up by a
  /// full scan of the store, through the mount: the kernel's listings and pages are
  /// invalidated as for an incremental pull, and `zdc sync` returns once the scan is done.
  @Test func aDeviceBehindACompactedChangeLogCatchesUpByAFullScan() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let storeURL = dir.path("store")
    let (a, b) = try SyncDevice.pair(in: dir, store: storeURL)
    defer { SyncDevice.unmountAll([a, b]) }
    try a.sh("mkdir d && echo one > d/x && echo keep > keep.txt && echo bye > gone.txt")
    try a.sync()
    try b.sync()
    // B's kernel keeps the listings and the pages it read.
    #expect(try b.ls() == ["d", "gone.txt", "keep.txt"])
    #expect(try b.sh("cat keep.txt d/x").stdout == "keep\none\n")
    try a.sh("echo changed > keep.txt && rm gone.txt && echo new > new.txt && mv d e")
    try a.sync()
    // Another device compacts the change log (every entry goes; the marker says up to when),
    // as one does with entries older than a week: B can no longer pull incrementally.
    let store = try LocalFolderStore(root: storeURL)
    let entries = try store.listAll(prefix: "").map(\.key).filter { $0.contains("/changes/") }
      .sorted()
    let last = try #require(entries.last)
    let changes = try #require(last.range(of: "/changes/"))
    let markerKey = String(last[..<changes.lowerBound]) + "/changes-compacted"
    let ulid = String(last[changes.upperBound...].prefix(26))
    for key in entries { try store.delete(key: key, condition: .none) }
    _ = try store.put(key: markerKey, body: .data(Data(ulid.utf8)), condition: .none)
    try b.sync()
    // Right after the sync, within the kernel's entry and attribute timeouts: only the
    // scan's invalidations make these right.
    #expect(try b.ls() == ["e", "keep.txt", "new.txt"])
    #expect(try b.sh("cat keep.txt e/x new.txt").stdout == "changed\none\nnew\n")
    #expect(try b.sh("test ! -e d && test ! -e gone.txt").status == 0)
    let json =
      try JSONSerialization.jsonObject(
        with: Data(try b.run(["status", "--json"]).stdout.utf8)) as? [String: Any]
    #expect(json?["fullScanDue"] as? Bool == false, "\(String(describing: json))")
    // And B's own changes still reach A afterwards (its cursor follows the log again).
    try b.sh("echo from-b > b.txt")
    try b.sync()
    try a.sync()
    #expect(
      try a.ls(eventually: ["b.txt", "e", "keep.txt", "new.txt"]) == [
        "b.txt", "e", "keep.txt", "new.txt",
      ])
    #expect(try a.sh("cat b.txt").stdout == "from-b\n")
    #expect(a.unmount()?.status == 0)
    #expect(b.unmount()?.status == 0)
  }

  @Test func unmountWaitsForUploads() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    var files: [String: Data] = [:]
    for i in 0..<5 {
      files["file \(i).bin"] =
        try Self.random(i == 0 ? 2_000_000 : 10_000 * i) + Self.marker("u\(i)")
    }
    for (name, data) in files { try data.write(to: a.file(name)) }
    let r = try #require(a.unmount())
    #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
    #expect(!r.stdout.contains("left queued"), "\(r.stdout)")
    #expect(Self.dataObjects(store).count >= files.count)
    // What was uploaded left staging for the cache (it is not downloaded again).
    #expect(a.stagedFiles == [], "\(a.stagedFiles)")
    #expect(a.cachedFiles.count >= files.count)
    let status = try a.run(["status"])
    #expect(status.stdout.contains("Pending uploads: 0 items"), "\(status.stdout)")

    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync()
    #expect(try b.ls() == files.keys.sorted())
    for (name, data) in files { #expect(try Data(contentsOf: b.file(name)) == data, "\(name)") }
    b.unmount()
    try Self.expectNoPlaintext(
      files.values.map { $0.suffix(40) }, store: store, devices: [a, b])
  }

  /// The mount records its state directory as its source in the mount table, so `zdc unmount
  /// MOUNTPOINT` reaches the right process (and waits for its uploads) without `--state-dir`,
  /// whatever the default state directory is.
  @Test func unmountFindsTheStateDirectoryFromTheMountPoint() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice(
      "devA", in: dir, store: store, join: false, mountArguments: ["--upload-delay", "600"])
    defer { a.unmount(wait: false) }
    let mounts = ProcFile.text("/proc/mounts")
    #expect(mounts.contains("zdcfs:\(a.state.path) \(a.mnt.path) fuse.zdc "), "\(mounts)")
    let pid = try #require(a.pid)
    let content = Self.marker("unmount-by-mount-point")
    try content.write(to: a.file("queued.txt"))
    #expect(Self.dataObjects(store).isEmpty)
    var env = a.env
    env["ZDC_STATE_DIR"] = nil
    env["HOME"] = dir.path("elsewhere").path
    let r = try runProcess(a.zdc, ["unmount", a.mnt.path], environment: env)
    #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
    // It waited for the upload and for the process to finish.
    #expect(!SyncDevice.isAlive(pid))
    #expect(Self.dataObjects(store).count == 1)
    #expect(!a.isMounted)
    try Self.expectNoPlaintext([content], store: store, devices: [a])
  }

  @Test func unmountNoWaitLeavesUploadsQueued() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    let content = try Self.random(100_000) + Self.marker("nowait")
    try content.write(to: a.file("late.bin"))
    let r = try #require(a.unmount(wait: false))
    #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
    // Whatever was not uploaded yet is uploaded by the next mount.
    try a.mount()
    try a.sync()
    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync()
    #expect(try Data(contentsOf: b.file("late.bin")) == content)
  }

  /// Unmounted from outside (`fusermount3 -u`, as a file manager does) while its store takes
  /// no uploads, the process does not linger for the hour it would wait for uploads that make
  /// progress: once they have failed without progress for `--drain-stall` seconds it leaves
  /// them queued and exits (so the account can be mounted again), and the next mount uploads
  /// them.
  @Test func unmountedWithTheStoreGoneItLeavesUploadsQueuedAndExits() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice(
      "devA", in: dir, store: store, join: false,
      mountArguments: ["--pull-interval", "3600", "--upload-delay", "600", "--drain-stall", "2"])
    defer { a.unmount(wait: false) }
    let pid = try #require(a.pid)
    let aside = try Self.takeAway(store, in: dir)
    let content = try Self.random(50_000) + Self.marker("stalled")
    try content.write(to: a.file("stalled.bin"))
    let started = Date()
    let r = try runProcess(URL(fileURLWithPath: "/bin/fusermount3"), ["-u", a.mnt.path])
    #expect(r.status == 0, "\(r.stderr)")
    for _ in 0..<600 where SyncDevice.isAlive(pid) { usleep(50_000) }
    #expect(!SyncDevice.isAlive(pid), "the process still waits for its uploads")
    #expect(Date().timeIntervalSince(started) < 25)
    a.pid = nil
    #expect(
      try String(contentsOf: a.state.appendingPathComponent("mount.log"), encoding: .utf8)
        .contains("uploads left queued for the next mount"))

    try Self.bringBack(store, from: aside, thenRemount: a, in: dir, expect: "stalled.bin", content)
  }

  /// Replaces the store's folder by a file (uploads cannot finish); returns where it went.
  static func takeAway(_ store: URL, in dir: TemporaryDirectory) throws -> URL {
    let aside = dir.path("store-aside")
    try FileManager.default.moveItem(at: store, to: aside)
    try Data("not a store".utf8).write(to: store)
    return aside
  }

  /// Puts the store's folder back (see ``takeAway(_:in:)``), mounts `a` again, and checks that
  /// its queued upload of `name` reaches a second device with `content`.
  static func bringBack(
    _ store: URL, from aside: URL, thenRemount a: SyncDevice, in dir: TemporaryDirectory,
    expect name: String, _ content: Data
  ) throws {
    try FileManager.default.removeItem(at: store)
    try FileManager.default.moveItem(at: aside, to: store)
    try a.mount()
    try a.sync()
    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync()
    #expect(try Data(contentsOf: b.file(name)) == content)
  }

  @Test func unmountShowsWhatItWaitsForAndNoWaitStopsWaiting() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    let aside = try Self.takeAway(store, in: dir)
    let content = try Self.random(50_000) + Self.marker("waiting")
    try content.write(to: a.file("waiting.bin"))
    let out = dir.path("unmount.out")
    let waiting = try ChildProcess(
      a.zdc.path, ["unmount", a.mnt.path], environment: a.env, stdout: .file(out.path))
    defer { waiting.stop() }
    var text = ""
    for _ in 0..<100 {
      text = (try? String(contentsOf: out, encoding: .utf8)) ?? ""
      if text.contains("Waiting for uploads: ") { break }
      usleep(100_000)
    }
    #expect(text.contains("Waiting for uploads: "), "\(text)")
    #expect(!a.isMounted)
    // A second unmount with --no-wait stops the waiting: the upload stays queued.
    let r = try a.run(["unmount", a.mnt.path, "--no-wait"])
    #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
    for _ in 0..<100 where waiting.isRunning { usleep(100_000) }
    #expect(!waiting.isRunning)
    #expect(waiting.wait() == 0)
    // Both say what they left for the next mount.
    #expect(r.stdout.contains("left queued for the next mount: 2 items"), "\(r.stdout)")
    text = (try? String(contentsOf: out, encoding: .utf8)) ?? ""
    #expect(text.contains("left queued for the next mount: 2 items"), "\(text)")
    if let pid = a.pid {
      for _ in 0..<100 where SyncDevice.isAlive(pid) { usleep(100_000) }
      #expect(!SyncDevice.isAlive(pid))
    }
    #expect(try a.run(["status"]).stdout.contains("Not mounted."))
    try Self.bringBack(store, from: aside, thenRemount: a, in: dir, expect: "waiting.bin", content)
  }

  /// On a terminal (a pty from script(1)), `zdc unmount` draws a progress bar in place.
  @Test func unmountDrawsAProgressBarOnATerminal() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    // Uploads cannot finish while the store's folder is a file.
    _ = try Self.takeAway(store, in: dir)
    try Self.random(80_000).write(to: a.file("big.bin"))
    let typescript = dir.path("typescript")
    let waiting = try ChildProcess(
      "/usr/bin/script",
      ["-q", "-f", "-e", "-c", "'\(a.zdc.path)' unmount '\(a.mnt.path)'", typescript.path],
      environment: a.env.merging(["TERM": "xterm"]) { $1 })
    defer { waiting.stop() }
    var text = ""
    for _ in 0..<100 {
      text = (try? String(contentsOf: typescript, encoding: .utf8)) ?? ""
      if text.contains("% ") { break }
      usleep(100_000)
    }
    #expect(text.contains("\rWaiting for uploads ["), "\(text.debugDescription)")
    #expect(text.contains("0/1 items") || text.contains("0/2 items"), "\(text.debugDescription)")
    #expect(!text.contains("Waiting for uploads: "), "line output on a terminal")
    #expect(try a.run(["unmount", a.mnt.path, "--no-wait"]).status == 0)
    for _ in 0..<100 where waiting.isRunning { usleep(100_000) }
    #expect(!waiting.isRunning)
  }

  @Test func killNineRightAfterCloseLosesNothing() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    let content = try Self.random(500_000) + Self.marker("kill9")
    // The daemon's process ID, as `zdc status` reports it.
    let json = try a.run(["status", "--json"]).stdout
    let obj = try #require(
      try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
    let pid = try #require((obj["pid"] as? Int).map { pid_t($0) })
    #expect(pid == a.pid)
    // The kill follows the last `close(2)` at once, from the writing process itself: the
    // kernel may not even have sent `release` yet.
    let source = dir.path("precious.src")
    try content.write(to: source)
    // Then metadata changes no `close(2)` follows (they are in the catalog's redo journal
    // when each call returns, their batch most likely not committed when the kill comes).
    let script = """
      import os, shutil, signal
      m = '\(a.mnt.path)'
      for i in range(5):
          shutil.copyfile('\(source.path)', m + '/small-%d.txt' % i)
      with open(m + '/precious.bin', 'wb') as f:
          f.write(open('\(source.path)', 'rb').read())
      os.mkdir(m + '/dir')
      with open(m + '/dir/a.txt', 'w') as f:
          f.write('hello')
      os.rename(m + '/dir/a.txt', m + '/dir/b.txt')
      os.chmod(m + '/dir/b.txt', 0o600)
      os.setxattr(m + '/dir/b.txt', 'user.k', b'v')
      os.utime(m + '/dir/b.txt', (1600000000, 1600000000))
      os.symlink('b.txt', m + '/dir/link')
      open(m + '/gone.txt', 'w').close()
      os.unlink(m + '/gone.txt')
      os.kill(\(pid), signal.SIGKILL)
      """
    let r = try runProcess(URL(fileURLWithPath: "/usr/bin/python3"), ["-c", script])
    #expect(r.status == 0, "\(r.stderr)")
    for _ in 0..<100 where SyncDevice.isAlive(pid) { usleep(50_000) }
    #expect(!SyncDevice.isAlive(pid))
    a.pid = nil
    let u = try runProcess(URL(fileURLWithPath: "/usr/bin/fusermount3"), ["-u", a.mnt.path])
    #expect(u.status == 0, "\(u.stderr)")
    #expect(!a.isMounted)

    try a.mount()
    #expect(try Data(contentsOf: a.file("precious.bin")) == content)
    for i in 0..<5 { #expect(try Data(contentsOf: a.file("small-\(i).txt")) == content) }
    let meta = try runProcess(
      URL(fileURLWithPath: "/usr/bin/python3"),
      [
        "-c",
        """
        import os
        m = '\(a.mnt.path)'
        st = os.stat(m + '/dir/b.txt')
        print(open(m + '/dir/b.txt').read(), oct(st.st_mode & 0o777), int(st.st_mtime),
              os.getxattr(m + '/dir/b.txt', 'user.k').decode(), os.readlink(m + '/dir/link'),
              os.path.exists(m + '/dir/a.txt'), os.path.exists(m + '/gone.txt'))
        """,
      ])
    #expect(meta.stdout == "hello 0o600 1600000000 v b.txt False False\n", "\(meta.stderr)")
    try a.sync()
    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync()
    #expect(try Data(contentsOf: b.file("precious.bin")) == content)
    for i in 0..<5 { #expect(try Data(contentsOf: b.file("small-\(i).txt")) == content) }
    a.unmount()
    b.unmount()
    try Self.expectNoPlaintext([content.suffix(40)], store: store, devices: [a, b])
  }

  @Test func syncFailsClearlyWhenNotMounted() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    a.unmount()
    let r = try a.run(["sync"])
    #expect(r.status != 0)
    #expect(r.stderr.contains("not mounted"))
  }

  @Test func syncFailsClearlyWhenTheStoreIsUnavailable() throws {
    let dir = try TemporaryDirectory("zdc-sync-mount")
    defer { Self.expectNoFuseMounts(under: dir) }
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }
    // The store's folder is replaced by a file: every request fails.
    let aside = try Self.takeAway(store, in: dir)
    try Data("x\n".utf8).write(to: a.file("stuck.txt"))
    let r = try a.run(["sync", "--timeout", "3"])
    #expect(r.status != 0, "\(r.stdout)")
    #expect(r.stderr.contains("zdc: "), "\(r.stderr)")
    #expect(r.stderr.contains("pending"), "\(r.stderr)")
    try FileManager.default.removeItem(at: store)
    try FileManager.default.moveItem(at: aside, to: store)
    try a.sync()
    #expect(a.unmount(wait: false)?.status == 0)
  }
}
