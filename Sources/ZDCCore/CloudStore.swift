public import Foundation

/// A half-open range of bytes in an object.
public struct ByteRange: Sendable, Hashable, Codable, CustomStringConvertible {
  /// First byte.
  public var lowerBound: UInt64
  /// One past the last byte.
  public var upperBound: UInt64

  /// A range; `upperBound` must not be below `lowerBound`.
  public init(_ lower: UInt64, _ upper: UInt64) {
    precondition(upper >= lower, "ByteRange upper bound below lower bound")
    lowerBound = lower
    upperBound = upper
  }

  /// Number of bytes.
  public var count: UInt64 { upperBound - lowerBound }

  public var description: String { "[\(lowerBound), \(upperBound))" }
}

/// What a store knows about one object.
public struct ObjectInfo: Sendable, Hashable, Codable {
  /// The object key.
  public var key: String
  /// Size in bytes.
  public var size: UInt64
  /// The store's entity tag: changes whenever the content changes.
  public var eTag: String
  /// When the object was last written.
  public var lastModified: Date

  public init(key: String, size: UInt64, eTag: String, lastModified: Date) {
    self.key = key
    self.size = size
    self.eTag = eTag
    self.lastModified = lastModified
  }
}

/// One page of a listing, in ascending byte order of keys.
public struct ListPage: Sendable, Hashable {
  /// The objects of this page.
  public var objects: [ObjectInfo]
  /// Pass back to get the next page; `nil` when this is the last.
  public var continuationToken: String?

  public init(objects: [ObjectInfo], continuationToken: String?) {
    self.objects = objects
    self.continuationToken = continuationToken
  }
}

/// A precondition on a write, as with HTTP `If-Match` / `If-None-Match: *`.
public enum WriteCondition: Sendable, Hashable {
  /// Write unconditionally.
  case none
  /// Write only if no object exists at the key.
  case ifNoneMatch
  /// Write only if the current object has this eTag.
  case ifMatch(String)
}

/// The bytes of an upload.
public enum UploadBody: Sendable {
  /// Bytes in memory.
  case data(Data)
  /// A byte range of a file, read as the upload proceeds (never loaded whole).
  case file(URL, range: ByteRange?)
}

/// A finished part of a multipart upload.
public struct UploadedPart: Sendable, Hashable, Codable {
  /// 1-based part number.
  public var partNumber: Int
  /// The part's eTag as returned by `uploadPart`.
  public var eTag: String
  /// The part's size in bytes.
  public var size: UInt64

  public init(partNumber: Int, eTag: String, size: UInt64) {
    self.partNumber = partNumber
    self.eTag = eTag
    self.size = size
  }
}

/// Errors every store reports in the same terms, whatever its transport.
public enum StoreError: Error, Sendable, Equatable, CustomStringConvertible {
  /// No object at the key (or no such multipart upload).
  case notFound(key: String)
  /// A `WriteCondition` did not hold (HTTP 412): someone else wrote first.
  case preconditionFailed(key: String)
  /// The requested range is outside the object.
  case invalidRange(key: String, range: ByteRange)
  /// The key is not one this store can hold.
  case invalidKey(String)
  /// The store rejected the credentials or the request is not allowed.
  case accessDenied(String)
  /// A temporary failure worth retrying (timeouts, resets, 5xx, throttling).
  case transient(String)
  /// The store answered something that cannot be understood.
  case malformedResponse(String)
  /// Local I/O failed (errno-style message).
  case io(String, errno: Int32)
  /// The store does not support a feature this operation needs.
  case unsupported(String)
  /// The store itself is missing (e.g. its bucket does not exist): no object can be read or
  /// written, and none should be taken for deleted.
  case unavailable(String)

  /// True for failures that may go away by themselves.
  public var isRetryable: Bool {
    if case .transient = self { return true }
    return false
  }

  public var description: String {
    switch self {
    case .notFound(let k): return "no object at \(k)"
    case .preconditionFailed(let k): return "precondition failed for \(k)"
    case .invalidRange(let k, let r): return "range \(r) is outside \(k)"
    case .invalidKey(let k): return "invalid object key \(k.debugDescription)"
    case .accessDenied(let m): return "access denied: \(m)"
    case .transient(let m): return "temporary store failure: \(m)"
    case .malformedResponse(let m): return "malformed store response: \(m)"
    case .io(let m, let e): return "I/O error (errno \(e)): \(m)"
    case .unsupported(let m): return "unsupported by this store: \(m)"
    case .unavailable(let m): return "store unavailable: \(m)"
    }
  }
}

/// An object store holding a treesystem's encrypted objects: the local-folder store or S3.
///
/// Calls are synchronous and may block on I/O; callers run them off latency-sensitive threads.
/// Implementations are safe to call from several threads and, where stated, several processes.
public protocol CloudStore: Sendable {
  /// Lists objects whose keys start with `prefix`, in ascending byte order, after `startAfter`
  /// (exclusive) or continuing from `continuationToken`, at most `maxKeys` at a time.
  func list(prefix: String, startAfter: String?, continuationToken: String?, maxKeys: Int) throws
    -> ListPage

  /// Reads an object, or a byte range of it.
  func get(key: String, range: ByteRange?) throws -> Data

  /// Streams an object, or a byte range of it, into a file (created or truncated).
  func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo

  /// What the store knows about an object.
  func head(key: String) throws -> ObjectInfo

  /// Reads a whole object together with what the store knows about it (the eTag is the one
  /// of these bytes). The default asks `head` then `get`; stores that can answer both from
  /// one read (one request) do.
  func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo)

  /// Writes an object under a condition; returns the new eTag.
  func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String

  /// Deletes an object (under a condition). Deleting a missing object is not an error
  /// unless a condition was given.
  func delete(key: String, condition: WriteCondition) throws

  /// Copies an object to another key under a condition on the destination; returns its eTag.
  func copy(from source: String, to destination: String, condition: WriteCondition) throws
    -> String

  /// Starts a multipart upload; returns its upload ID.
  func createMultipartUpload(key: String) throws -> String

  /// Uploads one part (numbered from 1); returns the part's eTag.
  func uploadPart(key: String, uploadID: String, partNumber: Int, body: UploadBody) throws
    -> String

  /// The parts of an unfinished upload that the store already holds, by part number.
  func listParts(key: String, uploadID: String) throws -> [UploadedPart]

  /// Assembles the parts into the object under a condition; returns the object's eTag.
  func completeMultipartUpload(
    key: String, uploadID: String, parts: [UploadedPart], condition: WriteCondition
  ) throws -> String

  /// Abandons an upload and frees its parts.
  func abortMultipartUpload(key: String, uploadID: String) throws
}

/// A store that writes an object as its bytes are produced, keeping no copy of the whole object
/// anywhere first (the local-folder store). A large upload to it needs neither an encoded work
/// file nor a multipart upload, whose parts the store would copy once more to assemble them.
public protocol StreamingPutStore: CloudStore {
  /// Writes the object whose bytes `produce` hands, in order, to the sink it is given, under
  /// `condition` (checked once the bytes are all there); returns the new eTag: the eTag `put`
  /// gives the same bytes. When `produce` or the sink throws, nothing is stored (no object, no
  /// temporary file) and the error is rethrown.
  func put(
    key: String, condition: WriteCondition,
    producing produce: (_ sink: (UnsafeRawBufferPointer) throws -> Void) throws -> Void
  ) throws -> String
}

extension CloudStore {
  /// Lists every object under a prefix, following continuation tokens.
  public func listAll(prefix: String, startAfter: String? = nil, pageSize: Int = 1000) throws
    -> [ObjectInfo]
  {
    var out: [ObjectInfo] = []
    var token: String? = nil
    repeat {
      let page = try list(
        prefix: prefix, startAfter: token == nil ? startAfter : nil, continuationToken: token,
        maxKeys: pageSize)
      out.append(contentsOf: page.objects)
      token = page.continuationToken
    } while token != nil
    return out
  }

  /// Reads a whole object.
  public func get(key: String) throws -> Data { try get(key: key, range: nil) }

  /// `head`, then `get`: two requests, and the object may change between them.
  public func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo) {
    let info = try head(key: key)
    return (try get(key: key), info)
  }
}

/// The object keys every `CloudStore` accepts, so that a treesystem behaves the same on every
/// store: 1 to 1024 bytes of UTF-8, no NUL, no leading `/`, and no empty, `.` or `..`
/// components. Stores may refuse more (the local-folder store also limits component length).
public enum ObjectKey {
  /// The longest key, in UTF-8 bytes (S3's limit).
  public static let maxLength = 1024

  /// Throws `StoreError.invalidKey` unless `key` is portable.
  public static func validate(_ key: String) throws {
    let bytes = Array(key.utf8)
    guard !bytes.isEmpty, bytes.count <= maxLength, bytes.first != 0x2F, !bytes.contains(0) else {
      throw StoreError.invalidKey(key)
    }
    for c in bytes.split(separator: 0x2F, omittingEmptySubsequences: false) {
      guard !c.isEmpty, !c.elementsEqual([0x2E]), !c.elementsEqual([0x2E, 0x2E]) else {
        throw StoreError.invalidKey(key)
      }
    }
  }
}
