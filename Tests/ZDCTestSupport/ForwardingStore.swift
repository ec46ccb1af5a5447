public import Foundation
public import ZDCCore

/// A `CloudStore` wrapper that passes every call to `inner` unless it implements the call
/// itself, so test wrappers (recording, gating) spell out only what they intercept.
public protocol ForwardingStore: CloudStore {
  /// The store calls go to.
  var inner: any CloudStore { get }
}

extension ForwardingStore {
  public func list(prefix: String, startAfter: String?, continuationToken: String?, maxKeys: Int)
    throws -> ListPage
  {
    try inner.list(
      prefix: prefix, startAfter: startAfter, continuationToken: continuationToken,
      maxKeys: maxKeys)
  }
  public func get(key: String, range: ByteRange?) throws -> Data {
    try inner.get(key: key, range: range)
  }
  public func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo {
    try inner.get(key: key, range: range, to: file)
  }
  public func head(key: String) throws -> ObjectInfo { try inner.head(key: key) }
  public func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo) {
    try inner.getWithInfo(key: key)
  }
  public func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    try inner.put(key: key, body: body, condition: condition)
  }
  public func delete(key: String, condition: WriteCondition) throws {
    try inner.delete(key: key, condition: condition)
  }
  public func copy(from source: String, to destination: String, condition: WriteCondition) throws
    -> String
  { try inner.copy(from: source, to: destination, condition: condition) }
  public func createMultipartUpload(key: String) throws -> String {
    try inner.createMultipartUpload(key: key)
  }
  public func uploadPart(key: String, uploadID: String, partNumber: Int, body: UploadBody) throws
    -> String
  { try inner.uploadPart(key: key, uploadID: uploadID, partNumber: partNumber, body: body) }
  public func listParts(key: String, uploadID: String) throws -> [UploadedPart] {
    try inner.listParts(key: key, uploadID: uploadID)
  }
  public func completeMultipartUpload(
    key: String, uploadID: String, parts: [UploadedPart], condition: WriteCondition
  ) throws -> String {
    try inner.completeMultipartUpload(
      key: key, uploadID: uploadID, parts: parts, condition: condition)
  }
  public func abortMultipartUpload(key: String, uploadID: String) throws {
    try inner.abortMultipartUpload(key: key, uploadID: uploadID)
  }
}
