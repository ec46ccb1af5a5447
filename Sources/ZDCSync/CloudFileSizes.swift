import Foundation
import ZDCCore
import ZDCCrypto

extension CloudDataInfo {
  /// The section sizes read from the header of the DATA object with `eTag`.
  init(_ sizes: CloudFileSizes, eTag: String, lastModified: Date?) {
    self.init(
      metadataSize: sizes.metadataSize, thumbnailSize: sizes.thumbnailSize,
      dataSize: sizes.dataSize, eTag: eTag, lastModified: lastModified)
  }

  /// These sizes, for another object with the same content (a copy of it).
  func copied(eTag: String, lastModified: Date?) -> CloudDataInfo {
    var info = self
    info.eTag = eTag
    info.lastModified = lastModified
    return info
  }
}

extension CloudStore {
  /// The section sizes of the CloudFile stored at `key` (`ciphertextSize` bytes, sealed with
  /// `nodeKey`), read from its first chunks only. A store failure is thrown (retried rather
  /// than guessed around); an object that is not such a CloudFile gives `.failure` with the
  /// decoding error, for the caller to log and fall back on.
  func cloudFileSizes(key: String, nodeKey: Data, ciphertextSize: UInt64) throws -> Result<
    CloudFileSizes, any Error
  > {
    do {
      return .success(
        try CloudFileReader(
          key: nodeKey, ciphertextSize: ciphertextSize, fetch: { try self.get(key: key, range: $0) }
        ).sizes)
    } catch let e as StoreError {
      throw e
    } catch {
      return .failure(error)
    }
  }
}
