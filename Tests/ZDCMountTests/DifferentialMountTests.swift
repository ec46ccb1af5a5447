import Foundation
import Testing
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// The mount against a local directory: `tools/fsx` applies one seeded random sequence of
/// POSIX operations to both and compares every outcome and both whole trees. The trees must
/// then stay equal across a `kill -9` of the daemon and a remount, and on a second device after
/// both synced.
@Suite(.serialized) struct DifferentialMountTests {
  static let fsx = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("tools/fsx")
  static let seeds = [11, 12, 13, 14]

  static func fsx(
    _ test: URL, _ reference: URL, _ options: [String],
    sourceLocation: SourceLocation = #_sourceLocation
  ) throws {
    let r = try runProcess(fsx, [test.path, reference.path] + options)
    #expect(
      r.status == 0, "fsx \(options): \(r.stdout)\n\(r.stderr)", sourceLocation: sourceLocation)
  }

  @Test func randomOperationsMatchALocalDirectoryAndSurviveKillAndSync() throws {
    let dir = try TemporaryDirectory("zdc-fsx")
    defer { SyncMountTests.expectNoFuseMounts(under: dir) }
    let reference = dir.path("reference")
    let store = dir.path("store")
    let a = try SyncDevice("devA", in: dir, store: store, join: false)
    defer { a.unmount(wait: false) }

    for seed in Self.seeds {
      let test = a.file("s\(seed)")
      let ref = reference.appendingPathComponent("s\(seed)")
      for d in [test, ref] {
        try FileManager.default.createDirectory(at: d, withIntermediateDirectories: true)
      }
      try Self.fsx(test, ref, ["--seed", "\(seed)", "--ops", "2000", "--check-every", "100"])
    }

    // Every descriptor was closed: all of it survives a kill -9 of the daemon.
    try a.killServingProcess()
    try a.mount()
    for seed in Self.seeds {
      try Self.fsx(
        a.file("s\(seed)"), reference.appendingPathComponent("s\(seed)"), ["--compare-only"])
    }

    // Names, kinds, modes, sparse contents, symlinks and xattrs all reach another device.
    try a.sync()
    let b = try SyncDevice("devB", in: dir, store: store, join: true)
    defer { b.unmount(wait: false) }
    try b.sync()
    for seed in Self.seeds {
      try Self.fsx(
        b.file("s\(seed)"), reference.appendingPathComponent("s\(seed)"), ["--compare-only"])
    }
    #expect(a.unmount()?.status == 0)
    #expect(b.unmount()?.status == 0)
  }
}
