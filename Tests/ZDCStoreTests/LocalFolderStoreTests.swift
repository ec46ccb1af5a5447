import Foundation
import Testing
import ZDCCore
@_spi(Testing) import ZDCLocalStore
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// What is particular to the local-folder store: its file format, crash leftovers, and several
/// processes sharing one folder.
@Suite("LocalFolderStore")
struct LocalFolderStoreTests {
  @Test func objectFileFormat() throws {
    let parent = try makeTemporaryDirectory()
    defer { removeDirectory(parent) }
    let dir = parent.appendingPathComponent("store")
    let store = try LocalFolderStore(root: dir)
    let eTag = try store.put(key: "u/t/obj", body: .data(Data("abc".utf8)), condition: .none)
    // BLAKE2b-128("abc"), as 32 lower-case hex digits.
    #expect(eTag == "cf4ab791c62b8d2b2109c90275287816")
    let raw = try Data(contentsOf: dir.appendingPathComponent("u/t/obj"))
    #expect(raw == Data("ZDCLOBJ1\(eTag)abc".utf8))
    let mode = try FileManager.default.attributesOfItem(atPath: dir.path)[.posixPermissions] as? Int
    #expect(mode == 0o700)

    // The eTag lives in the file, so it survives copying the folder.
    let copy = parent.appendingPathComponent("copy")
    try FileManager.default.copyItem(at: dir, to: copy)
    let copied = try LocalFolderStore(root: copy)
    #expect(try copied.head(key: "u/t/obj").eTag == eTag)
    _ = try copied.put(key: "u/t/obj", body: .data(Data("d".utf8)), condition: .ifMatch(eTag))

    // Deleting the last object of a directory removes the empty directories.
    try store.delete(key: "u/t/obj", condition: .none)
    #expect(!FileManager.default.fileExists(atPath: dir.appendingPathComponent("u").path))
  }

  /// A streamed put writes what it is handed as it comes, into the object a `put` of the same
  /// bytes makes (same file, same eTag), under its condition; a producer that fails leaves
  /// nothing behind, not even a temporary file.
  @Test func streamedPutWritesTheObjectAPutWould() throws {
    let parent = try makeTemporaryDirectory()
    defer { removeDirectory(parent) }
    let dir = parent.appendingPathComponent("store")
    let store = try LocalFolderStore(root: dir)
    var bytes = Data(count: 3 << 20)
    var rng = SplitMix64(seed: 11)
    bytes.withUnsafeMutableBytes { b in
      for i in 0..<b.count { b[i] = UInt8(truncatingIfNeeded: rng.next()) }
    }
    func produce(_ sink: (UnsafeRawBufferPointer) throws -> Void) throws {
      try bytes.withUnsafeBytes { b in
        var at = 0
        // Uneven pieces, as an encoder hands them.
        while at < b.count {
          let n = min(65_552, b.count - at)
          try sink(UnsafeRawBufferPointer(rebasing: b[at..<(at + n)]))
          at += n
        }
      }
    }
    let streamed = try store.put(key: "u/t/big", condition: .ifNoneMatch, producing: produce)
    let plain = try store.put(key: "u/t/plain", body: .data(bytes), condition: .none)
    #expect(streamed == plain)
    #expect(try store.head(key: "u/t/big").size == UInt64(bytes.count))
    #expect(try store.get(key: "u/t/big", range: nil) == bytes)
    #expect(
      try Data(contentsOf: dir.appendingPathComponent("u/t/big"))
        == Data(contentsOf: dir.appendingPathComponent("u/t/plain")))

    // Its condition holds as a put's does; a refused put leaves the object as it was.
    #expect(throws: StoreError.preconditionFailed(key: "u/t/big")) {
      try store.put(key: "u/t/big", condition: .ifNoneMatch) { sink in
        try Data("other".utf8).withUnsafeBytes { try sink($0) }
      }
    }
    #expect(try store.get(key: "u/t/big", range: nil) == bytes)
    let replaced = try store.put(key: "u/t/big", condition: .ifMatch(streamed)) { sink in
      try Data("other".utf8).withUnsafeBytes { try sink($0) }
    }
    #expect(try store.head(key: "u/t/big").eTag == replaced)
    #expect(try store.get(key: "u/t/big", range: nil) == Data("other".utf8))

    // A producer that fails midway: rethrown, nothing stored, no temporary file left.
    struct Stop: Error {}
    #expect(throws: Stop.self) {
      try store.put(key: "u/t/failed", condition: .none) { sink in
        try bytes.withUnsafeBytes { try sink(UnsafeRawBufferPointer(rebasing: $0[0..<100_000])) }
        throw Stop()
      }
    }
    #expect(throws: StoreError.notFound(key: "u/t/failed")) {
      try store.head(key: "u/t/failed")
    }
    let temporaries = try FileManager.default.contentsOfDirectory(
      atPath: dir.appendingPathComponent(".zdc-tmp").path)
    #expect(temporaries.isEmpty)
  }

  /// A copy is another name of the source's file (objects are never written in place): no
  /// byte is copied, whatever the size, and each key goes its own way afterwards.
  @Test func copyLinksTheSourcesFile() throws {
    let parent = try makeTemporaryDirectory()
    defer { removeDirectory(parent) }
    let dir = parent.appendingPathComponent("store")
    let store = try LocalFolderStore(root: dir)
    let bytes = Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
    let eTag = try store.put(key: "u/a/obj", body: .data(bytes), condition: .none)
    #expect(try store.copy(from: "u/a/obj", to: "u/b/obj", condition: .ifNoneMatch) == eTag)
    var a = stat()
    var b = stat()
    #expect(lstat(dir.appendingPathComponent("u/a/obj").path, &a) == 0)
    #expect(lstat(dir.appendingPathComponent("u/b/obj").path, &b) == 0)
    #expect(a.st_ino == b.st_ino && a.st_nlink == 2)
    #expect(try store.head(key: "u/b/obj").eTag == eTag)
    #expect(try store.get(key: "u/b/obj", range: nil) == bytes)

    // A condition that fails leaves the destination as it was and no temporary name behind.
    #expect(throws: StoreError.preconditionFailed(key: "u/b/obj")) {
      try store.copy(from: "u/a/obj", to: "u/b/obj", condition: .ifNoneMatch)
    }
    let temporaries = try FileManager.default.contentsOfDirectory(
      atPath: dir.appendingPathComponent(".zdc-tmp").path)
    #expect(temporaries.isEmpty)

    // Writing or deleting one key leaves the other's object alone.
    _ = try store.put(key: "u/a/obj", body: .data(Data("new".utf8)), condition: .ifMatch(eTag))
    #expect(try store.get(key: "u/b/obj", range: nil) == bytes)
    try store.delete(key: "u/b/obj", condition: .ifMatch(eTag))
    #expect(try store.get(key: "u/a/obj", range: nil) == Data("new".utf8))
  }

  /// A store folder that went away (an unmounted disk, a folder moved aside) is unavailable:
  /// writes never recreate it empty, where what they wrote would be lost when it comes back.
  @Test func aVanishedStoreFolderIsUnavailableNotRecreated() throws {
    let parent = try makeTemporaryDirectory()
    defer { removeDirectory(parent) }
    let dir = parent.appendingPathComponent("store")
    let store = try LocalFolderStore(root: dir)
    _ = try store.put(key: "u/t/a", body: .data(Data("a".utf8)), condition: .none)
    let aside = parent.appendingPathComponent("aside")
    try FileManager.default.moveItem(at: dir, to: aside)
    #expect {
      try store.put(key: "u/t/b", body: .data(Data("b".utf8)), condition: .ifNoneMatch)
    } throws: { error in
      if case StoreError.unavailable = error { return true }
      return false
    }
    #expect(throws: (any Error).self) { try store.createMultipartUpload(key: "u/t/c") }
    #expect(!FileManager.default.fileExists(atPath: dir.path))
    try FileManager.default.moveItem(at: aside, to: dir)
    _ = try store.put(key: "u/t/b", body: .data(Data("b".utf8)), condition: .ifNoneMatch)
    #expect(try store.get(key: "u/t/a") == Data("a".utf8))
  }

  @Test func temporaryFilesAreHiddenAndCleaned() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let store = try LocalFolderStore(root: dir)
    _ = try store.put(key: "k", body: .data(Data("v".utf8)), condition: .none)
    let tmp = dir.appendingPathComponent(".zdc-tmp")
    let stale = tmp.appendingPathComponent("1234-stale")
    let fresh = tmp.appendingPathComponent("1234-fresh")
    try Data("ZDCLOBJ1".utf8).write(to: stale)
    try Data("ZDCLOBJ1".utf8).write(to: fresh)
    let old = Date().addingTimeInterval(-2 * 24 * 3600)
    try FileManager.default.setAttributes([.modificationDate: old], ofItemAtPath: stale.path)
    #expect(try store.listAll(prefix: "").map(\.key) == ["k"])

    _ = try LocalFolderStore(root: dir)
    #expect(!FileManager.default.fileExists(atPath: stale.path))
    #expect(FileManager.default.fileExists(atPath: fresh.path))
    #expect(try store.listAll(prefix: "").map(\.key) == ["k"])
  }

  /// An object being written has no name (a writer killed meanwhile leaves nothing behind), and
  /// a name given just before the rename is removed at the next open once no writer holds it.
  @Test func writersThatDieLeaveNothingBehind() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let store = try LocalFolderStore(root: dir)
    let tmp = dir.appendingPathComponent(".zdc-tmp")
    func names() throws -> [String] {
      try FileManager.default.contentsOfDirectory(atPath: tmp.path).sorted()
    }
    // This machine's temporary folder allows unnamed files (ext4, tmpfs, xfs, btrfs do).
    #expect(store.unnamedTemporaries)
    var seenWhileWriting: [String]? = nil
    let eTag = try store.put(key: "u/t/big", condition: .ifNoneMatch) { sink in
      let piece = Data(repeating: 7, count: 1 << 20)
      for _ in 0..<3 { try piece.withUnsafeBytes { try sink($0) } }
      seenWhileWriting = try names()
    }
    #expect(seenWhileWriting == [])
    #expect(try store.head(key: "u/t/big").eTag == eTag)
    #expect(try names() == [])

    // What a writer killed between naming its file and renaming it leaves, what a live writer
    // (here: this test, holding the lock) has named, and a file written under a name.
    let left = tmp.appendingPathComponent("l-0123456789ab0123456789ab")
    let live = tmp.appendingPathComponent("l-ba9876543210ba9876543210")
    let named = tmp.appendingPathComponent("w-00112233445566778899aabb")
    for url in [left, live, named] { try Data("ZDCLOBJ1".utf8).write(to: url) }
    let fd = open(live.path, O_RDONLY)
    #expect(fd >= 0)
    defer { close(fd) }
    #expect(flock(fd, LOCK_EX) == 0)
    _ = try LocalFolderStore(root: dir)
    #expect(try names() == [live.lastPathComponent, named.lastPathComponent])
    // Once its writer is gone, the next open removes it too.
    #expect(flock(fd, LOCK_UN) == 0)
    _ = try LocalFolderStore(root: dir)
    #expect(try names() == [named.lastPathComponent])
    #expect(try store.listAll(prefix: "").map(\.key) == ["u/t/big"])

    // Where files cannot be unnamed, they are written under a `w-` name (which a crash leaves
    // until it is a day old), and the writes are the same.
    try FileManager.default.removeItem(at: named)
    let namedStore = try LocalFolderStore(root: dir, unnamedTemporaries: false)
    #expect(!namedStore.unnamedTemporaries)
    let again = try namedStore.put(key: "u/t/again", condition: .ifNoneMatch) { sink in
      let piece = Data(repeating: 7, count: 1 << 20)
      for _ in 0..<3 { try piece.withUnsafeBytes { try sink($0) } }
      seenWhileWriting = try names()
    }
    #expect(again == eTag)
    #expect(seenWhileWriting?.count == 1)
    #expect(seenWhileWriting?.first?.hasPrefix("w-") == true)
    _ = try namedStore.copy(from: "u/t/again", to: "u/t/copy", condition: .ifNoneMatch)
    #expect(try namedStore.get(key: "u/t/copy") == Data(repeating: 7, count: 3 << 20))
    #expect(try names() == [])
  }

  @Test func corruptObjectsAreReportedNotListed() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let store = try LocalFolderStore(root: dir)
    _ = try store.put(key: "a/good", body: .data(Data("fine".utf8)), condition: .none)
    let eTag = try store.put(
      key: "a/truncated", body: .data(Data("content".utf8)), condition: .none)
    let truncated = dir.appendingPathComponent("a/truncated")
    try Data("ZDCLOBJ1\(eTag.prefix(10))".utf8).write(to: truncated)
    try Data("NOTMAGIC\(eTag)content".utf8).write(to: dir.appendingPathComponent("a/badmagic"))
    try Data().write(to: dir.appendingPathComponent("a/empty"))
    try Data("ZDCLOBJ1\(String(repeating: "Z", count: 32))x".utf8).write(
      to: dir.appendingPathComponent("a/badtag"))

    for key in ["a/truncated", "a/badmagic", "a/empty", "a/badtag"] {
      for call in [{ _ = try store.get(key: key) }, { _ = try store.head(key: key) }] {
        let error = storeError(call)
        guard case .malformedResponse = error else {
          Issue.record("\(key): expected malformedResponse, got \(String(describing: error))")
          continue
        }
      }
      #expect(
        isPreconditionFailed(
          storeError {
            _ = try store.put(key: key, body: .data(Data()), condition: .ifMatch(eTag))
          }))
    }
    #expect(try store.listAll(prefix: "").map(\.key) == ["a/good"])
    // A corrupt object can be overwritten and deleted.
    _ = try store.put(key: "a/truncated", body: .data(Data("again".utf8)), condition: .none)
    #expect(try store.get(key: "a/truncated") == Data("again".utf8))
    try store.delete(key: "a/badmagic", condition: .none)
    #expect(try store.listAll(prefix: "").map(\.key) == ["a/good", "a/truncated"])
  }

  @Test func fileSystemKeyLimits() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let store = try LocalFolderStore(root: dir)
    let key = "a/" + String(repeating: "k", count: 256)
    // Too long a component, and the store's own names.
    for bad in [key, ".zdc-tmp/x", "a/.zdc-locks", ".zdc-multipart"] {
      guard case .invalidKey = storeError({ _ = try store.head(key: bad) }) else {
        Issue.record("expected invalidKey for \(bad)")
        continue
      }
    }
    _ = try store.put(key: String(key.dropLast()), body: .data(Data()), condition: .none)
  }

  @Test func objectAndPrefixConflictIsAnError() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let store = try LocalFolderStore(root: dir)
    _ = try store.put(key: "x/y", body: .data(Data()), condition: .none)
    for key in ["x", "x/y/z"] {
      let error = storeError { _ = try store.put(key: key, body: .data(Data()), condition: .none) }
      guard case .unsupported = error else {
        Issue.record("\(key): expected unsupported, got \(String(describing: error))")
        continue
      }
    }
    #expect(isNotFound(storeError { _ = try store.get(key: "x") }))
    try store.delete(key: "x", condition: .none)
    #expect(try store.listAll(prefix: "").map(\.key) == ["x/y"])
    #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path + "/.zdc-tmp").isEmpty)
  }

  // MARK: Several processes

  /// The helper executable, built next to the test bundle.
  static func helperURL() throws -> URL {
    var candidates: [URL] = []
    candidates.append(URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent())
    if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
      candidates.append(URL(fileURLWithPath: exe).deletingLastPathComponent())
    }
    var dir = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    while dir.path != "/" {
      let build = dir.appendingPathComponent(".build")
      if let triples = try? FileManager.default.contentsOfDirectory(atPath: build.path) {
        candidates += triples.map {
          build.appendingPathComponent($0).appendingPathComponent("debug")
        }
        break
      }
      dir.deleteLastPathComponent()
    }
    for candidate in candidates {
      let url = candidate.appendingPathComponent("zdc-testhelper")
      if FileManager.default.isExecutableFile(atPath: url.path) { return url }
    }
    throw StoreError.notFound(key: "zdc-testhelper (looked in \(candidates.map(\.path)))")
  }

  /// Runs the helper in `count` processes at once; returns each one's standard output.
  static func runHelpers(_ count: Int, arguments: (Int) -> [String]) throws -> [String] {
    let helper = try helperURL()
    var processes: [(ChildProcess, URL)] = []
    defer {
      for (process, errURL) in processes {
        process.stop()
        try? FileManager.default.removeItem(at: errURL)
      }
    }
    for i in 0..<count {
      let errURL = FileManager.default.temporaryDirectory.appendingPathComponent(
        "zdc-helper-\(UUID().uuidString).err")
      let process = try ChildProcess(
        helper.path, arguments(i), stdout: .pipe, stderr: .file(errURL.path))
      processes.append((process, errURL))
    }
    var outputs: [String] = []
    for (process, errURL) in processes {
      // Read to the end first, so that a full pipe cannot block the helper.
      let data = ChildProcess.readToEnd(process.stdoutFD)
      let status = process.wait()
      let err = (try? String(contentsOf: errURL, encoding: .utf8)) ?? ""
      #expect(status == 0, "helper failed: \(err)")
      outputs.append(String(decoding: data, as: UTF8.self))
    }
    return outputs
  }

  @Test func processesRacingCreatesHaveOneWinnerPerKey() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let rounds = 300
    let ids = ["p0", "p1", "p2", "p3"]
    let outputs = try Self.runHelpers(ids.count) {
      ["race-create", dir.path, "race/keys", String(rounds), ids[$0]]
    }
    let store = try LocalFolderStore(root: dir)
    var winner: [String: String] = [:]
    for (i, output) in outputs.enumerated() {
      for key in output.split(separator: "\n").map(String.init) {
        #expect(winner[key] == nil, "\(key) won by \(winner[key] ?? "") and \(ids[i])")
        winner[key] = ids[i]
      }
    }
    #expect(winner.count == rounds)
    for round in 0..<rounds {
      let key = "race/keys/\(round)"
      guard let id = winner[key] else {
        Issue.record("nobody won \(key)")
        continue
      }
      #expect(try store.get(key: key) == Data(id.utf8))
    }
    #expect(try store.listAll(prefix: "race/").count == rounds)
  }

  @Test func processesRacingUpdatesLoseNothing() throws {
    let dir = try makeTemporaryDirectory()
    defer { removeDirectory(dir) }
    let store = try LocalFolderStore(root: dir)
    let key = "race/counter"
    _ = try store.put(key: key, body: .data(Data("0 init".utf8)), condition: .ifNoneMatch)
    let rounds = 300
    let outputs = try Self.runHelpers(4) {
      ["race-update", dir.path, key, String(rounds), "p\($0)"]
    }
    let eTags = outputs.flatMap { $0.split(separator: "\n") }.compactMap { line -> String? in
      line.hasPrefix("WIN ") ? String(line.dropFirst(4)) : nil
    }
    #expect(!eTags.isEmpty)
    // Every successful update produced a distinct version, and none was lost.
    #expect(Set(eTags).count == eTags.count)
    let text = String(decoding: try store.get(key: key), as: UTF8.self)
    #expect(Int(text.split(separator: " ").first ?? "") == eTags.count)
    #expect(eTags.contains(try store.head(key: key).eTag))
  }
}
