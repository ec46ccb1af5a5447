import Foundation
import Testing
import ZDCCore
@_spi(Testing) import ZDCLocalStore
import ZDCS3Store
import ZDCTestSupport

/// A way to get a fresh, empty store for one test; the conformance suite runs against each.
struct StoreFactory: Sendable, CustomTestStringConvertible {
  /// Shown in test results.
  let name: String
  /// A new empty store and a function that removes whatever it made.
  let make: @Sendable () throws -> (store: any CloudStore, cleanup: @Sendable () -> Void)
  /// False for servers known not to report an unknown multipart upload (moto 5.2 answers
  /// UploadPart with 500 and AbortMultipartUpload with 204 instead of 404 NoSuchUpload).
  var reportsUnknownUploads = true

  init(
    name: String, reportsUnknownUploads: Bool = true,
    make: @escaping @Sendable () throws -> (store: any CloudStore, cleanup: @Sendable () -> Void)
  ) {
    self.name = name
    self.make = make
    self.reportsUnknownUploads = reportsUnknownUploads
  }

  var testDescription: String { name }
}

/// Every store the conformance suite runs against.
let allStoreFactories: [StoreFactory] = [
  StoreFactory(name: "LocalFolderStore") {
    let dir = try makeTemporaryDirectory()
    let store = try LocalFolderStore(root: dir.appendingPathComponent("store"))
    return (store, { removeDirectory(dir) })
  },
  // The same, writing its new files under a name (as where the file system has no unnamed
  // files).
  StoreFactory(name: "LocalFolderStore (named temporary files)") {
    let dir = try makeTemporaryDirectory()
    let store = try LocalFolderStore(
      root: dir.appendingPathComponent("store"), unnamedTemporaries: false)
    return (store, { removeDirectory(dir) })
  },
  // A fresh bucket on the suite's own moto_server (the `.motoServer` trait starts and stops it).
  StoreFactory(name: "S3Store (moto)", reportsUnknownUploads: false) {
    let store = try MotoServer.require().makeStore(transport: fastRetries())
    return (store, {})
  },
]

/// A new empty directory under the system temporary directory.
func makeTemporaryDirectory() throws -> URL {
  let dir = FileManager.default.temporaryDirectory
    .appendingPathComponent("zdc-store-tests-\(UUID().uuidString)")
  try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
  return dir
}

func removeDirectory(_ url: URL) {
  try? FileManager.default.removeItem(at: url)
}

/// Runs `body` with a fresh store from `factory`, cleaning up afterwards.
func withStore<T>(_ factory: StoreFactory, _ body: (any CloudStore) throws -> T) throws -> T {
  let (store, cleanup) = try factory.make()
  defer { cleanup() }
  return try body(store)
}

/// The `StoreError` a call throws, or `nil` if it did not throw one.
func storeError(_ body: () throws -> Void) -> StoreError? {
  do {
    try body()
    return nil
  } catch let error as StoreError {
    return error
  } catch {
    return .io("unexpected error \(error)", errno: 0)
  }
}

/// Whether the error is `.preconditionFailed`.
func isPreconditionFailed(_ error: StoreError?) -> Bool {
  if case .preconditionFailed = error { return true }
  return false
}

/// Whether the error is `.notFound`.
func isNotFound(_ error: StoreError?) -> Bool {
  if case .notFound = error { return true }
  return false
}

/// Deterministic pseudo-random bytes.
func testBytes(_ count: Int, seed: UInt64) -> Data {
  var state = seed &+ 0x9E37_79B9_7F4A_7C15
  var out = [UInt8](repeating: 0, count: count)
  for i in 0..<count {
    state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
    out[i] = UInt8(truncatingIfNeeded: state >> 33)
  }
  return Data(out)
}
