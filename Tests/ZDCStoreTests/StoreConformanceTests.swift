import Foundation
import Testing
import ZDCCore

/// What every `CloudStore` must do, whatever its transport.
@Suite("CloudStore conformance", .motoServer)
struct StoreConformanceTests {
  @Test(arguments: allStoreFactories)
  func putGetHeadDelete(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let key = "user/tree/0123456789ABCDEF0123456789ABCDEF/abc.rcrd"
      let content = Data("hello, store".utf8)
      let before = Date().addingTimeInterval(-5)
      let eTag = try store.put(key: key, body: .data(content), condition: .none)
      #expect(!eTag.isEmpty)
      #expect(!eTag.contains("\""))
      #expect(try store.get(key: key) == content)
      let info = try store.head(key: key)
      #expect(info.key == key)
      #expect(info.size == UInt64(content.count))
      #expect(info.eTag == eTag)
      #expect(info.lastModified > before)
      #expect(info.lastModified < Date().addingTimeInterval(5))
      // The bytes and their info at once.
      let (data, both) = try store.getWithInfo(key: key)
      #expect(data == content)
      #expect(both.key == key && both.size == info.size && both.eTag == eTag)
      #expect(abs(both.lastModified.timeIntervalSince(info.lastModified)) < 1)

      try store.delete(key: key, condition: .none)
      #expect(isNotFound(storeError { _ = try store.getWithInfo(key: key) }))
      #expect(isNotFound(storeError { _ = try store.get(key: key) }))
      #expect(isNotFound(storeError { _ = try store.head(key: key) }))
      #expect(try store.listAll(prefix: "").isEmpty)
      // Deleting a missing object without a condition is fine.
      try store.delete(key: key, condition: .none)
    }
  }

  @Test(arguments: allStoreFactories)
  func emptyAndOverwrittenObjects(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let e0 = try store.put(key: "k/empty", body: .data(Data()), condition: .none)
      #expect(try store.get(key: "k/empty") == Data())
      #expect(try store.head(key: "k/empty").size == 0)
      let e1 = try store.put(key: "k/x", body: .data(Data("one".utf8)), condition: .none)
      let e2 = try store.put(key: "k/x", body: .data(Data("two".utf8)), condition: .none)
      #expect(e1 != e2)
      #expect(e0 != e1)
      #expect(try store.get(key: "k/x") == Data("two".utf8))
      // Equal content, equal eTag, whatever the key.
      let e3 = try store.put(key: "k/y", body: .data(Data("two".utf8)), condition: .none)
      #expect(e3 == e2)
      let e4 = try store.put(key: "k/x", body: .data(Data("one".utf8)), condition: .none)
      #expect(e4 == e1)
    }
  }

  @Test(arguments: allStoreFactories)
  func ranges(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let content = testBytes(100_000, seed: 1)
      _ = try store.put(key: "r/obj", body: .data(content), condition: .none)
      #expect(try store.get(key: "r/obj", range: ByteRange(0, 10)) == content[0..<10])
      #expect(try store.get(key: "r/obj", range: ByteRange(500, 70_000)) == content[500..<70_000])
      // An end past the object is clamped.
      #expect(try store.get(key: "r/obj", range: ByteRange(99_990, 200_000)) == content[99_990...])
      // A start at or after the end is invalid.
      for range in [ByteRange(100_000, 100_010), ByteRange(200_000, 300_000)] {
        let error = storeError { _ = try store.get(key: "r/obj", range: range) }
        guard case .invalidRange = error else {
          Issue.record("expected invalidRange for \(range), got \(String(describing: error))")
          continue
        }
      }
      #expect(isNotFound(storeError { _ = try store.get(key: "r/none", range: ByteRange(0, 1)) }))
    }
  }

  @Test(arguments: allStoreFactories)
  func getToFile(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let dir = try makeTemporaryDirectory()
      defer { removeDirectory(dir) }
      let content = testBytes(3_000_000, seed: 2)
      let eTag = try store.put(key: "f/big", body: .data(content), condition: .none)
      let out = dir.appendingPathComponent("out")
      try Data("previous longer content that must be truncated".utf8).write(to: out)
      let info = try store.get(key: "f/big", range: nil, to: out)
      #expect(info.eTag == eTag)
      #expect(info.size == UInt64(content.count))
      #expect(try Data(contentsOf: out) == content)

      _ = try store.get(key: "f/big", range: ByteRange(1_000_000, 1_000_100), to: out)
      #expect(try Data(contentsOf: out) == content[1_000_000..<1_000_100])

      let missing = dir.appendingPathComponent("missing")
      #expect(isNotFound(storeError { _ = try store.get(key: "f/none", range: nil, to: missing) }))
    }
  }

  @Test(arguments: allStoreFactories)
  func putFromFile(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let dir = try makeTemporaryDirectory()
      defer { removeDirectory(dir) }
      let content = testBytes(2_500_000, seed: 3)
      let file = dir.appendingPathComponent("in")
      try content.write(to: file)
      let whole = try store.put(key: "p/whole", body: .file(file, range: nil), condition: .none)
      #expect(try store.get(key: "p/whole") == content)
      let direct = try store.put(key: "p/direct", body: .data(content), condition: .none)
      #expect(whole == direct)
      _ = try store.put(
        key: "p/part", body: .file(file, range: ByteRange(1_000, 2_000_000)), condition: .none)
      #expect(try store.get(key: "p/part") == content[1_000..<2_000_000])
    }
  }

  @Test(arguments: allStoreFactories)
  func conditionalPut(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let e1 = try store.put(key: "c/k", body: .data(Data("1".utf8)), condition: .ifNoneMatch)
      #expect(
        isPreconditionFailed(
          storeError {
            _ = try store.put(key: "c/k", body: .data(Data("x".utf8)), condition: .ifNoneMatch)
          }))
      let e2 = try store.put(key: "c/k", body: .data(Data("2".utf8)), condition: .ifMatch(e1))
      #expect(
        isPreconditionFailed(
          storeError {
            _ = try store.put(key: "c/k", body: .data(Data("3".utf8)), condition: .ifMatch(e1))
          }))
      #expect(try store.get(key: "c/k") == Data("2".utf8))
      #expect(try store.head(key: "c/k").eTag == e2)
      // If-Match on a missing key fails.
      #expect(
        isPreconditionFailed(
          storeError {
            _ = try store.put(key: "c/none", body: .data(Data()), condition: .ifMatch(e2))
          }))
      #expect(isNotFound(storeError { _ = try store.head(key: "c/none") }))
    }
  }

  @Test(arguments: allStoreFactories)
  func conditionalDelete(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let e1 = try store.put(key: "d/k", body: .data(Data("1".utf8)), condition: .none)
      let e2 = try store.put(key: "d/k", body: .data(Data("2".utf8)), condition: .none)
      #expect(
        isPreconditionFailed(storeError { try store.delete(key: "d/k", condition: .ifMatch(e1)) }))
      #expect(try store.get(key: "d/k") == Data("2".utf8))
      try store.delete(key: "d/k", condition: .ifMatch(e2))
      #expect(isNotFound(storeError { _ = try store.head(key: "d/k") }))
      // A missing object is not the expected version (If-Match fails) and is what
      // If-None-Match asks for (nothing to delete); found by the sync tests on S3.
      #expect(
        isPreconditionFailed(storeError { try store.delete(key: "d/k", condition: .ifMatch(e2)) }))
      try store.delete(key: "d/k", condition: .ifNoneMatch)
      _ = try store.put(key: "d/k", body: .data(Data("3".utf8)), condition: .none)
      #expect(
        isPreconditionFailed(storeError { try store.delete(key: "d/k", condition: .ifNoneMatch) }))
      #expect(try store.get(key: "d/k") == Data("3".utf8))
    }
  }

  @Test(arguments: allStoreFactories)
  func copyObjects(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let content = testBytes(1_500_000, seed: 4)
      let source = try store.put(key: "s/src", body: .data(content), condition: .none)
      let copied = try store.copy(from: "s/src", to: "t/dst", condition: .ifNoneMatch)
      #expect(copied == source)
      #expect(try store.get(key: "t/dst") == content)
      #expect(try store.get(key: "s/src") == content)
      // The destination's condition is honoured.
      #expect(
        isPreconditionFailed(
          storeError { _ = try store.copy(from: "s/src", to: "t/dst", condition: .ifNoneMatch) }))
      let other = try store.put(key: "t/other", body: .data(Data("o".utf8)), condition: .none)
      #expect(
        isPreconditionFailed(
          storeError {
            _ = try store.copy(from: "s/src", to: "t/other", condition: .ifMatch(source))
          }))
      #expect(try store.get(key: "t/other") == Data("o".utf8))
      _ = try store.copy(from: "s/src", to: "t/other", condition: .ifMatch(other))
      #expect(try store.get(key: "t/other") == content)
      #expect(
        isNotFound(storeError { _ = try store.copy(from: "s/none", to: "t/x", condition: .none) }))
    }
  }

  @Test(arguments: allStoreFactories)
  func invalidKeys(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let bad = [
        "", "/abs", "a//b", "a/", "./a", "a/./b", "a/../b", "..",
        String(repeating: "k", count: 1025),
      ]
      for key in bad {
        let error = storeError {
          _ = try store.put(key: key, body: .data(Data()), condition: .none)
        }
        guard case .invalidKey = error else {
          Issue.record(
            "put \(key.debugDescription): expected invalidKey, got \(String(describing: error))")
          continue
        }
        guard case .invalidKey = storeError({ _ = try store.get(key: key) }) else {
          Issue.record("get \(key.debugDescription): expected invalidKey")
          continue
        }
      }
      // The longest valid key, and keys that only look odd.
      let longest = Array(repeating: String(repeating: "k", count: 204), count: 5)
        .joined(separator: "/")
      #expect(longest.utf8.count == 1024)
      for key in [longest, "a/.hidden", "a/..b", "é/ü"] {
        _ = try store.put(key: key, body: .data(Data(key.utf8)), condition: .none)
        #expect(try store.get(key: key) == Data(key.utf8))
      }
    }
  }

  @Test(arguments: allStoreFactories)
  func listingOrderAndPrefixes(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let keys = [
        "a-c", "a/b.rcrd", "a/b.data", "a/bc/x", "a/b/y", "a/b-z", "a0", "b", "a/b/yz",
        "A", "a/é", "a/z", "ab/c", "u/t/changes/01J0-dev2", "u/t/changes/01J0-dev1",
      ]
      for key in keys.shuffled() {
        _ = try store.put(key: key, body: .data(Data(key.utf8)), condition: .none)
      }
      let byteOrder = keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
      #expect(try store.listAll(prefix: "").map(\.key) == byteOrder)
      #expect(try store.listAll(prefix: "", pageSize: 1).map(\.key) == byteOrder)

      func expectPrefix(
        _ prefix: String, after: String? = nil, sourceLocation: SourceLocation = #_sourceLocation
      ) throws {
        let expected = byteOrder.filter { key in
          key.hasPrefix(prefix)
            && (after.map { $0.utf8.lexicographicallyPrecedes(key.utf8) } ?? true)
        }
        let listed = try store.listAll(prefix: prefix, startAfter: after, pageSize: 2).map(\.key)
        #expect(
          listed == expected, "prefix \(prefix) after \(after ?? "-")",
          sourceLocation: sourceLocation)
      }
      try expectPrefix("a/b")
      try expectPrefix("a/b/")
      try expectPrefix("a")
      try expectPrefix("a/b.")
      try expectPrefix("u/t/changes/")
      try expectPrefix("nothing")
      try expectPrefix("a/b/y")
      for after in ["a", "a-c", "a/", "a/b", "a/b.rcrd", "a/b/", "a/b/y", "a/bb", "a/c", "zz", "0"]
      {
        try expectPrefix("", after: after)
        try expectPrefix("a/", after: after)
      }
      #expect(
        try store.listAll(prefix: "u/t/changes/", startAfter: "u/t/changes/01J0-dev1").map(\.key)
          == ["u/t/changes/01J0-dev2"])

      let info = try #require(
        try store.list(prefix: "a/b.rcrd", startAfter: nil, continuationToken: nil, maxKeys: 10)
          .objects.first)
      #expect(info.key == "a/b.rcrd")
      #expect(info.size == UInt64("a/b.rcrd".utf8.count))
      #expect(info.eTag == (try store.head(key: "a/b.rcrd")).eTag)

      // A full page says so; the last page has no token.
      let first = try store.list(prefix: "", startAfter: nil, continuationToken: nil, maxKeys: 3)
      #expect(first.objects.map(\.key) == Array(byteOrder.prefix(3)))
      #expect(first.continuationToken != nil)
      let all = try store.list(prefix: "", startAfter: nil, continuationToken: nil, maxKeys: 1000)
      #expect(all.objects.count == keys.count)
      #expect(all.continuationToken == nil)
    }
  }

  @Test(arguments: allStoreFactories)
  func paginationOverManyKeys(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      var keys: [String] = []
      for d in 0..<25 {
        for i in 0..<100 {
          keys.append("u/t/\(String(d, radix: 16))\(d % 3 == 0 ? "-x" : "")/\(i).rcrd")
        }
      }
      let allKeys = keys
      let failures = Failures()
      DispatchQueue.concurrentPerform(iterations: 4) { worker in
        for index in stride(from: worker, to: allKeys.count, by: 4) {
          do {
            _ = try store.put(
              key: allKeys[index], body: .data(Data([UInt8(index % 256)])), condition: .none)
          } catch {
            failures.add("\(error)")
          }
        }
      }
      #expect(failures.all.isEmpty)
      let byteOrder = keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
      var listed: [String] = []
      var token: String? = nil
      var pages = 0
      repeat {
        let page = try store.list(
          prefix: "u/t/", startAfter: nil, continuationToken: token, maxKeys: 97)
        #expect(page.objects.count <= 97)
        listed += page.objects.map(\.key)
        token = page.continuationToken
        pages += 1
      } while token != nil && pages < 1000
      #expect(listed.count == keys.count)
      #expect(listed == byteOrder)
      #expect(Set(listed).count == keys.count)
      // A prefix that is not a whole directory name.
      #expect(
        try store.listAll(prefix: "u/t/1", pageSize: 333).map(\.key)
          == byteOrder.filter { $0.hasPrefix("u/t/1") })
    }
  }

  @Test(arguments: allStoreFactories)
  func multipartUpload(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let partSize = 5 * 1024 * 1024
      let parts = [
        testBytes(partSize, seed: 11), testBytes(partSize, seed: 12), testBytes(1234, seed: 13),
      ]
      let key = "m/big.data"
      let uploadID = try store.createMultipartUpload(key: key)
      #expect(try store.listParts(key: key, uploadID: uploadID).isEmpty)
      var uploaded: [UploadedPart] = []
      for number in [3, 1] {
        let eTag = try store.uploadPart(
          key: key, uploadID: uploadID, partNumber: number, body: .data(parts[number - 1]))
        uploaded.append(
          UploadedPart(partNumber: number, eTag: eTag, size: UInt64(parts[number - 1].count)))
      }
      // Resume: what the store holds, in part order.
      let held = try store.listParts(key: key, uploadID: uploadID)
      #expect(held == uploaded.sorted { $0.partNumber < $1.partNumber })
      // A missing part fails to complete.
      let missing = UploadedPart(partNumber: 2, eTag: held[0].eTag, size: UInt64(partSize))
      #expect(
        storeError {
          _ = try store.completeMultipartUpload(
            key: key, uploadID: uploadID, parts: [held[0], missing, held[1]], condition: .none)
        } != nil)
      let eTag2 = try store.uploadPart(
        key: key, uploadID: uploadID, partNumber: 2, body: .data(parts[1]))
      uploaded.append(UploadedPart(partNumber: 2, eTag: eTag2, size: UInt64(partSize)))
      uploaded.sort { $0.partNumber < $1.partNumber }
      #expect(try store.listParts(key: key, uploadID: uploadID) == uploaded)
      // A wrong part eTag fails too.
      var wrong = uploaded
      wrong[1].eTag = uploaded[0].eTag
      #expect(
        storeError {
          _ = try store.completeMultipartUpload(
            key: key, uploadID: uploadID, parts: wrong, condition: .none)
        } != nil)

      let eTag = try store.completeMultipartUpload(
        key: key, uploadID: uploadID, parts: uploaded, condition: .ifNoneMatch)
      let whole = parts[0] + parts[1] + parts[2]
      #expect(try store.get(key: key) == whole)
      #expect(try store.head(key: key).eTag == eTag)
      #expect(try store.head(key: key).size == UInt64(whole.count))
      // The upload is gone.
      #expect(isNotFound(storeError { _ = try store.listParts(key: key, uploadID: uploadID) }))
      #expect(try store.listAll(prefix: "").map(\.key) == [key])
    }
  }

  @Test(arguments: allStoreFactories)
  func multipartConditionsAndAbort(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let key = "m/obj"
      let existing = try store.put(key: key, body: .data(Data("old".utf8)), condition: .none)
      let uploadID = try store.createMultipartUpload(key: key)
      let e1 = try store.uploadPart(
        key: key, uploadID: uploadID, partNumber: 1, body: .data(Data("new".utf8)))
      let part = UploadedPart(partNumber: 1, eTag: e1, size: 3)
      #expect(
        isPreconditionFailed(
          storeError {
            _ = try store.completeMultipartUpload(
              key: key, uploadID: uploadID, parts: [part], condition: .ifNoneMatch)
          }))
      #expect(try store.get(key: key) == Data("old".utf8))
      _ = try store.completeMultipartUpload(
        key: key, uploadID: uploadID, parts: [part], condition: .ifMatch(existing))
      #expect(try store.get(key: key) == Data("new".utf8))

      let second = try store.createMultipartUpload(key: key)
      _ = try store.uploadPart(
        key: key, uploadID: second, partNumber: 1, body: .data(Data("x".utf8)))
      try store.abortMultipartUpload(key: key, uploadID: second)
      #expect(isNotFound(storeError { _ = try store.listParts(key: key, uploadID: second) }))
      if factory.reportsUnknownUploads {
        #expect(
          isNotFound(
            storeError {
              _ = try store.uploadPart(
                key: key, uploadID: second, partNumber: 2, body: .data(Data()))
            }))
        #expect(
          isNotFound(
            storeError {
              try store.abortMultipartUpload(key: key, uploadID: "0123456789abcdef0123456789abcdef")
            }))
      }
      #expect(isNotFound(storeError { _ = try store.listParts(key: key, uploadID: "../../etc") }))
      #expect(try store.get(key: key) == Data("new".utf8))
      #expect(try store.listAll(prefix: "").map(\.key) == [key])
    }
  }

  @Test(arguments: allStoreFactories)
  func racingCreatesHaveOneWinner(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      for round in 0..<20 {
        let key = "race/\(round)"
        let winners = Failures()
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
          do {
            _ = try store.put(
              key: key, body: .data(Data("\(thread)".utf8)), condition: .ifNoneMatch)
            winners.add("\(thread)")
          } catch StoreError.preconditionFailed {
          } catch {
            winners.add("error \(error)")
          }
        }
        let won = winners.all
        #expect(won.count == 1, "round \(round): \(won)")
        let stored = try store.get(key: key)
        if let winner = won.first {
          #expect(stored == Data(winner.utf8))
        }
      }
    }
  }
}

extension StoreConformanceTests {
  /// Writers and deleters of sibling keys never trip over each other (for the local store:
  /// over parent directories being created and removed).
  @Test(arguments: allStoreFactories)
  func concurrentPutsAndDeletesOfSiblings(_ factory: StoreFactory) throws {
    try withStore(factory) { store in
      let failures = Failures()
      DispatchQueue.concurrentPerform(iterations: 6) { thread in
        for round in 0..<100 {
          let key = "shared/dir/sub/k\(thread)"
          do {
            let eTag = try store.put(
              key: key, body: .data(Data("\(thread) \(round)".utf8)), condition: .ifNoneMatch)
            try store.delete(key: key, condition: .ifMatch(eTag))
          } catch {
            failures.add("\(key) round \(round): \(error)")
          }
        }
      }
      #expect(failures.all.isEmpty, "\(failures.all.prefix(5))")
      let left = try store.listAll(prefix: "")
      #expect(left.isEmpty)
    }
  }
}

/// A thread-safe list of strings collected from concurrent work.
final class Failures: @unchecked Sendable {
  private let lock = NSLock()
  private var items: [String] = []

  func add(_ item: String) { lock.withLock { items.append(item) } }
  var all: [String] { lock.withLock { items } }
}
