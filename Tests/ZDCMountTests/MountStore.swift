import Foundation
import Testing
import ZDCCore
import ZDCS3Store
import ZDCTestSupport

/// Where the devices of a mount test keep their objects: a local folder, or a prefix of a new
/// bucket on the suite's moto_server.
struct MountStore: Sendable, CustomTestStringConvertible {
  /// The folder (local stores).
  let folder: URL?
  /// The bucket, seen directly, without the prefix (S3 stores).
  let bucket: S3Store?
  let prefix: String
  let server: MotoServer?

  var testDescription: String { folder == nil ? "S3 (moto)" : "local folder" }

  /// A local-folder store.
  static func local(_ folder: URL) -> MountStore {
    MountStore(folder: folder, bucket: nil, prefix: "", server: nil)
  }

  /// A new bucket on the running suite's moto_server; the devices use `prefix` in it.
  static func s3(prefix: String = "zdcfs") throws -> MountStore {
    let server = try MotoServer.require()
    return MountStore(
      folder: nil, bucket: try server.makeStore(transport: fastRetries()), prefix: prefix,
      server: server)
  }

  /// `zdc init` arguments naming this store, for S3 through `endpoint` (moto's own by default).
  func initArguments(endpoint: String? = nil) -> [String] {
    if let folder { return ["--store", folder.path] }
    guard let bucket, let server else { return [] }
    return [
      "--store", "s3://\(bucket.configuration.bucket)/\(prefix)", "--endpoint",
      endpoint ?? server.endpoint,
    ]
  }

  /// What `zdc` needs in its environment: S3 credentials the AWS way (and nothing else of AWS
  /// from the test's own environment).
  var environment: [String: String] {
    guard let server else { return [:] }
    return [
      "AWS_ACCESS_KEY_ID": server.credentials.accessKeyID,
      "AWS_SECRET_ACCESS_KEY": server.credentials.secretAccessKey, "AWS_SESSION_TOKEN": "",
      "AWS_PROFILE": "", "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": "", "AWS_REGION": "",
      "AWS_DEFAULT_REGION": "",
    ]
  }

  /// Every place the needles occur: every object listed and fetched, as anyone holding the
  /// store could (keys and bytes); for a folder, every file under it too.
  func plaintext(_ needles: [Data]) throws -> [String] {
    if let folder { return try findPlaintext(needles, under: folder) }
    guard let bucket else { return [] }
    return try findPlaintext(needles, in: bucket)
  }

  /// The keys of every object in the store (S3: the whole bucket, prefix included).
  func objectKeys() throws -> [String] {
    if let folder {
      let walker = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil)
      var out: [String] = []
      while let url = walker?.nextObject() as? URL { out.append(url.path) }
      return out
    }
    return try bucket?.listAll(prefix: "").map(\.key) ?? []
  }
}
