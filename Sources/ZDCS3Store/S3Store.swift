public import Foundation
public import Logging
public import ZDCCore

/// A key that DeleteObjects could not delete, with S3's reason.
public struct S3DeleteFailure: Sendable, Hashable {
  /// The key (without the store prefix).
  public var key: String
  /// S3's error code.
  public var code: String
  /// S3's message.
  public var message: String
}

/// Which conditional writes a server honours.
public struct ConditionalWriteSupport: Sendable, Hashable, CustomStringConvertible {
  /// A second `PUT` with `If-None-Match: *` on an existing key is refused with 412.
  public var ifNoneMatch: Bool
  /// A `PUT` with `If-Match` and a wrong eTag is refused, and one with the right eTag accepted.
  public var ifMatch: Bool
  /// Both are honoured.
  public var isComplete: Bool { ifNoneMatch && ifMatch }

  public var description: String {
    "If-None-Match: *: \(ifNoneMatch ? "honoured" : "ignored"), If-Match: \(ifMatch ? "honoured" : "ignored")"
  }
}

/// A `CloudStore` on an S3-compatible object store, over HTTP(S) with libcurl and AWS Signature
/// Version 4. Every key is stored under the configuration's prefix.
public final class S3Store: CloudStore {
  /// The configuration this store was made with.
  public let configuration: S3Configuration
  let transport: CurlTransport
  let signer: SigV4Signer
  let scheme: String
  let endpointHost: String  // host[:port] as it appears in the Host header
  let basePath: String
  let virtualHosted: Bool

  /// A store for a configuration.
  public init(configuration: S3Configuration, logger: Logger = Logger(label: "zdc.s3")) {
    self.configuration = configuration
    transport = CurlTransport(options: configuration.transport, logger: logger)
    signer = SigV4Signer(credentials: configuration.credentials, region: configuration.region)
    let bucket = configuration.bucket
    if let endpoint = configuration.endpoint {
      scheme = endpoint.scheme?.lowercased() ?? "https"
      var host = endpoint.host ?? "localhost"
      if host.contains(":") && !host.hasPrefix("[") { host = "[\(host)]" }
      if let port = endpoint.port,
        !(scheme == "https" && port == 443) && !(scheme == "http" && port == 80)
      {
        host += ":\(port)"
      }
      endpointHost = host
      var path = endpoint.path
      while path.hasSuffix("/") { path.removeLast() }
      basePath = path
    } else {
      scheme = "https"
      endpointHost = "s3.\(configuration.region).amazonaws.com"
      basePath = ""
    }
    switch configuration.addressingStyle {
    case .path: virtualHosted = false
    case .virtualHosted: virtualHosted = true
    case .auto:
      let dnsSafe =
        !bucket.contains(".")
        && bucket.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "-" }
      virtualHosted = configuration.endpoint == nil && dnsSafe
    }
  }

  // MARK: Request counts

  /// HTTP requests sent so far, by kind, retries included.
  public var requestCounts: [S3RequestKind: Int] { transport.counts.withLock { $0 } }

  /// HTTP requests of one kind sent so far, retries included.
  public func requestCount(_ kind: S3RequestKind) -> Int { requestCounts[kind] ?? 0 }

  /// All HTTP requests sent so far, retries included.
  public var totalRequestCount: Int { requestCounts.values.reduce(0, +) }

  /// Retries (attempts after the first) so far, by kind.
  public var retryCounts: [S3RequestKind: Int] { transport.retries.withLock { $0 } }

  /// Sets every counter back to zero.
  public func resetRequestCounts() {
    transport.counts.withLock { $0.removeAll() }
    transport.retries.withLock { $0.removeAll() }
  }

  // MARK: Requests

  var host: String { virtualHosted ? "\(configuration.bucket).\(endpointHost)" : endpointHost }

  /// The encoded path of an object key (with the store prefix), or of the bucket when `nil`.
  func path(forFullKey key: String?) -> String {
    var p = basePath
    if !virtualHosted { p += "/" + URIEncoding.encode(configuration.bucket, keepSlash: false) }
    if let key {
      p += "/" + URIEncoding.encode(key, keepSlash: true)
    } else if virtualHosted || p.isEmpty {
      p += "/"
    }
    return p
  }

  /// The key under the configured prefix; portable keys only (`ObjectKey`), so that a tree
  /// behaves the same on S3 as on the local-folder store.
  func fullKey(_ key: String) throws(StoreError) -> String {
    do {
      try ObjectKey.validate(key)
    } catch {
      throw .invalidKey(key)
    }
    let full = configuration.prefix + key
    guard full.utf8.count <= 1024 else { throw .invalidKey(key) }
    return full
  }

  func request(
    _ kind: S3RequestKind, _ method: String, fullKey: String?, query: [(String, String)] = [],
    headers: [(String, String)] = [], body: RequestBody = .none, sink: ResponseSink = .memory
  ) -> HTTPRequest {
    let payloadHash: String
    switch body {
    case .none: payloadHash = SigV4Signer.payloadHash(Data())
    case .data(let d): payloadHash = SigV4Signer.payloadHash(d)
    case .file: payloadHash = SigV4Signer.unsignedPayload
    }
    let xmlBody =
      kind == .deleteObjects || kind == .completeMultipartUpload || kind == .createBucket
    return HTTPRequest(
      kind: kind, method: method, host: host, baseURL: "\(scheme)://\(host)",
      encodedPath: path(forFullKey: fullKey), query: query, headers: headers, body: body,
      payloadHash: payloadHash, sink: sink, contentType: xmlBody ? "application/xml" : nil)
  }

  /// Sends a request; returns the response when it succeeded, throws the mapped error otherwise.
  func send(_ r: HTTPRequest, key: String, range: ByteRange? = nil) throws(StoreError)
    -> HTTPResponse
  {
    let response = try sendRaw(r, key: key, range: range)
    guard response.isSuccess else { throw mapError(response, key: key, range: range) }
    return response
  }

  /// Sends a request; returns the final response whatever its status, throws when no usable
  /// response came (network, local I/O, retryable failures to the last attempt).
  func sendRaw(_ r: HTTPRequest, key: String, range: ByteRange? = nil) throws(StoreError)
    -> HTTPResponse
  {
    let signer = self.signer
    let response: HTTPResponse
    do {
      response = try transport.perform(r) { req, date in
        signer.sign(
          method: req.method, encodedPath: req.encodedPath, query: req.query,
          headers: [("host", req.host)] + req.headers, payloadHash: req.payloadHash, date: date
        ).headers
      }
    } catch {
      switch error {
      case .curl(_, let message, let retryable):
        // Network failures may heal; TLS verification or URL problems will not by themselves.
        throw retryable ? .transient(message) : .unsupported(message)
      case .local(let message, let e): throw .io(message, errno: e)
      case .exhausted(let resp): throw mapError(resp, key: key, range: range)
      }
    }
    return response
  }

  /// Maps an unsuccessful response to a `StoreError`, naming the bucket when it is missing.
  func mapError(_ r: HTTPResponse, key: String, range: ByteRange?) -> StoreError {
    let e = Self.mapError(r, key: key, range: range)
    if case .unavailable(let m) = e {
      return .unavailable(
        "no bucket \(configuration.bucket) at \(scheme)://\(endpointHost)\(basePath) (\(m))")
    }
    return e
  }

  /// Maps an unsuccessful response to a `StoreError`.
  static func mapError(_ r: HTTPResponse, key: String, range: ByteRange?) -> StoreError {
    let code = r.errorCode ?? ""
    var detail =
      code.isEmpty ? "HTTP \(r.status)" : "HTTP \(r.status) \(code): \(r.errorMessage ?? "")"
    if let region = r.headers["x-amz-bucket-region"], [301, 400, 403].contains(r.status) {
      detail += " (the bucket is in region \(region))"
    }
    switch r.status {
    case 404 where code == "NoSuchBucket":
      // Never `.notFound`: a missing bucket must not read as "every object was deleted".
      return .unavailable(detail)
    case 404: return .notFound(key: key)
    case 403: return .accessDenied(detail)
    case 412: return .preconditionFailed(key: key)
    case 409 where code == "ConditionalRequestConflict": return .preconditionFailed(key: key)
    case 416: return .invalidRange(key: key, range: range ?? ByteRange(0, 0))
    case 400 where code == "KeyTooLongError" || code == "InvalidURI": return .invalidKey(key)
    case 401: return .accessDenied(detail)
    case 501: return .unsupported(detail)
    case 500...599, 429: return .transient(detail)
    default:
      if CurlTransport.isRetryable(r) { return .transient(detail) }
      return .unsupported("request refused: \(detail)")
    }
  }

  static func conditionHeaders(_ c: WriteCondition) -> [(String, String)] {
    switch c {
    case .none: return []
    case .ifNoneMatch: return [("If-None-Match", "*")]
    case .ifMatch(let e): return [("If-Match", quote(e))]
    }
  }

  static func quote(_ eTag: String) -> String { eTag.hasPrefix("\"") ? eTag : "\"\(eTag)\"" }

  static func unquote(_ eTag: String) -> String {
    var s = Substring(eTag)
    if s.hasPrefix("W/") { s = s.dropFirst(2) }
    if s.count >= 2 && s.hasPrefix("\"") && s.hasSuffix("\"") { s = s.dropFirst().dropLast() }
    return String(s)
  }

  /// Parses an XML answer whose root is `root` (S3) or `alternate` (what some S3-compatible
  /// servers, moto among them, name it: `{Operation}Response`).
  static func parseXML(_ data: Data, root: String, alternate: String) throws(StoreError)
    -> XMLElement
  {
    guard let doc = XMLElement.parse(data) else {
      throw .malformedResponse("response is not well-formed XML (expected \(root))")
    }
    guard doc.name == root || doc.name == alternate else {
      throw .malformedResponse("expected <\(root)>, got <\(doc.name)>")
    }
    return doc
  }

  func info(_ key: String, _ r: HTTPResponse, range: ByteRange?) throws(StoreError) -> ObjectInfo {
    var size = UInt64(r.headers["content-length"] ?? "") ?? 0
    if let cr = r.headers["content-range"], let slash = cr.lastIndex(of: "/"),
      let total = UInt64(cr[cr.index(after: slash)...])
    {
      size = total
    }
    guard let eTag = r.headers["etag"] else {
      throw .malformedResponse("no ETag in the response for \(key)")
    }
    let modified =
      r.headers["last-modified"].flatMap(S3Date.parseHTTP) ?? Date(timeIntervalSince1970: 0)
    return ObjectInfo(key: key, size: size, eTag: Self.unquote(eTag), lastModified: modified)
  }

  static func rangeHeader(_ range: ByteRange) -> (String, String) {
    ("Range", "bytes=\(range.lowerBound)-\(range.upperBound - 1)")
  }

  // MARK: CloudStore

  public func list(prefix: String, startAfter: String?, continuationToken: String?, maxKeys: Int)
    throws -> ListPage
  {
    var query: [(String, String)] = [
      ("list-type", "2"), ("prefix", configuration.prefix + prefix),
      ("max-keys", String(max(1, min(maxKeys, 1000)))),
    ]
    if let continuationToken {
      query.append(("continuation-token", continuationToken))
    } else if let startAfter {
      query.append(("start-after", configuration.prefix + startAfter))
    }
    let r = try send(request(.listObjects, "GET", fullKey: nil, query: query), key: prefix)
    let doc = try Self.parseXML(
      r.body, root: "ListBucketResult", alternate: "ListObjectsV2Response")
    let strip = configuration.prefix.count
    var objects: [ObjectInfo] = []
    for c in doc.all("Contents") {
      guard let key = c.value("Key"), let sizeText = c.value("Size"), let size = UInt64(sizeText),
        let eTag = c.value("ETag")
      else { throw StoreError.malformedResponse("incomplete <Contents> in a listing") }
      guard key.hasPrefix(configuration.prefix) else { continue }
      let modified =
        c.value("LastModified").flatMap(S3Date.parseISO8601) ?? Date(timeIntervalSince1970: 0)
      objects.append(
        ObjectInfo(
          key: String(key.dropFirst(strip)), size: size, eTag: Self.unquote(eTag),
          lastModified: modified))
    }
    let truncated = doc.value("IsTruncated") == "true"
    let next = truncated ? doc.value("NextContinuationToken") : nil
    if truncated && next == nil {
      throw StoreError.malformedResponse("truncated listing without a continuation token")
    }
    return ListPage(objects: objects, continuationToken: next)
  }

  public func get(key: String, range: ByteRange?) throws -> Data {
    let full = try fullKey(key)
    if let range, range.count == 0 {
      let info = try head(key: key)
      guard range.lowerBound <= info.size else {
        throw StoreError.invalidRange(key: key, range: range)
      }
      return Data()
    }
    let r = try send(
      request(
        .getObject, "GET", fullKey: full, headers: range.map { [Self.rangeHeader($0)] } ?? []),
      key: key, range: range)
    if let range, r.status == 200 {
      // The server ignored the Range header: cut the range out of the whole object.
      let lo = Int(min(range.lowerBound, UInt64(r.body.count)))
      let hi = Int(min(range.upperBound, UInt64(r.body.count)))
      guard range.lowerBound < UInt64(r.body.count) else {
        throw StoreError.invalidRange(key: key, range: range)
      }
      return r.body.subdata(in: lo..<hi)
    }
    return r.body
  }

  public func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo {
    let full = try fullKey(key)
    if let range, range.count == 0 {
      let info = try head(key: key)
      guard range.lowerBound <= info.size else {
        throw StoreError.invalidRange(key: key, range: range)
      }
      try Data().write(to: file)
      return info
    }
    let r = try send(
      request(
        .getObject, "GET", fullKey: full, headers: range.map { [Self.rangeHeader($0)] } ?? [],
        sink: .file(file)),
      key: key, range: range)
    if let range, r.status == 200 {
      // The server ignored the Range header and sent the whole object: keep only the range.
      try Self.cut(file, to: range, key: key)
    }
    return try info(key, r, range: range)
  }

  /// Shrinks a file holding a whole object to a range of it, in place.
  static func cut(_ file: URL, to range: ByteRange, key: String) throws {
    let fd = open(file.path, O_RDWR | O_CLOEXEC)
    guard fd >= 0 else { throw StoreError.io("cannot reopen \(file.path)", errno: errno) }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { throw StoreError.io("cannot stat \(file.path)", errno: errno) }
    let size = UInt64(st.st_size)
    guard range.lowerBound < size else { throw StoreError.invalidRange(key: key, range: range) }
    let end = min(range.upperBound, size)
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    var done: UInt64 = 0
    while range.lowerBound + done < end {
      let want = Int(min(UInt64(buffer.count), end - range.lowerBound - done))
      let got = pread(fd, &buffer, want, off_t(range.lowerBound + done))
      guard got > 0, pwrite(fd, buffer, got, off_t(done)) == got else {
        throw StoreError.io("cannot rewrite \(file.path)", errno: errno)
      }
      done += UInt64(got)
    }
    guard ftruncate(fd, off_t(done)) == 0 else {
      throw StoreError.io("cannot truncate \(file.path)", errno: errno)
    }
  }

  /// The whole object and its info from one GetObject request.
  public func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo) {
    let full = try fullKey(key)
    let r = try send(request(.getObject, "GET", fullKey: full), key: key)
    return (r.body, try info(key, r, range: nil))
  }

  public func head(key: String) throws -> ObjectInfo {
    let full = try fullKey(key)
    let r = try send(request(.headObject, "HEAD", fullKey: full), key: key)
    return try info(key, r, range: nil)
  }

  public func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    let full = try fullKey(key)
    let r = try sendRaw(
      request(
        .putObject, "PUT", fullKey: full, headers: Self.conditionHeaders(condition),
        body: Self.requestBody(body)),
      key: key)
    if r.status == 412, r.attempts > 1, case .data(let bytes) = body, bytes.count <= 1 << 20 {
      // The request was sent more than once: the 412 may answer our own earlier, successful
      // attempt whose answer was lost. Small bodies are compared with what is there.
      if let current = try? send(request(.getObject, "GET", fullKey: full), key: key),
        current.body == bytes, let eTag = current.headers["etag"]
      {
        return Self.unquote(eTag)
      }
    }
    guard r.isSuccess else {
      // If-Match on a missing object: S3 answers 404, the CloudStore contract says the
      // condition failed (the object is not the version the caller expected).
      if case .ifMatch = condition, r.status == 404 {
        throw StoreError.preconditionFailed(key: key)
      }
      throw mapError(r, key: key, range: nil)
    }
    guard let eTag = r.headers["etag"] else {
      throw StoreError.malformedResponse("no ETag after writing \(key)")
    }
    return Self.unquote(eTag)
  }

  static func requestBody(_ body: UploadBody) -> RequestBody {
    switch body {
    case .data(let d): return .data(d)
    case .file(let url, let range): return .file(url, range)
    }
  }

  public func delete(key: String, condition: WriteCondition) throws {
    let full = try fullKey(key)
    switch condition {
    case .none:
      do {
        _ = try send(request(.deleteObject, "DELETE", fullKey: full), key: key)
      } catch StoreError.notFound {
        // Deleting a missing object is not an error.
      }
    case .ifNoneMatch:
      // "Delete only if nothing is there": nothing to delete, or a conflict.
      do {
        _ = try head(key: key)
      } catch StoreError.notFound {
        return
      }
      throw StoreError.preconditionFailed(key: key)
    case .ifMatch:
      // Checked here for servers that ignore If-Match on DELETE, and sent for those that honour
      // it. A missing object is not the version the caller expected: the condition failed.
      try precheck(key: key, condition)
      do {
        _ = try send(
          request(
            .deleteObject, "DELETE", fullKey: full, headers: Self.conditionHeaders(condition)),
          key: key)
      } catch StoreError.notFound {
        throw StoreError.preconditionFailed(key: key)
      }
    }
  }

  /// Checks a write condition against the current object with a HEAD request, for servers
  /// that ignore the condition headers on some operations; the headers are still sent, so a
  /// server that honours them closes the window between this check and the write.
  func precheck(key: String, _ condition: WriteCondition) throws {
    switch condition {
    case .none: return
    case .ifNoneMatch:
      do {
        _ = try head(key: key)
      } catch StoreError.notFound {
        return
      }
      throw StoreError.preconditionFailed(key: key)
    case .ifMatch(let expected):
      let current: ObjectInfo
      do {
        current = try head(key: key)
      } catch StoreError.notFound {
        throw StoreError.preconditionFailed(key: key)
      }
      guard current.eTag == Self.unquote(expected) else {
        throw StoreError.preconditionFailed(key: key)
      }
    }
  }

  public func copy(from source: String, to destination: String, condition: WriteCondition)
    throws -> String
  {
    let src = try fullKey(source)
    let dst = try fullKey(destination)
    let copySource = "/\(configuration.bucket)/" + URIEncoding.encode(src, keepSlash: true)
    // Checked here too, for servers that ignore conditions on CopyObject (moto).
    try precheck(key: destination, condition)
    let r: HTTPResponse
    do {
      r = try send(
        request(
          .copyObject, "PUT", fullKey: dst,
          headers: [("x-amz-copy-source", copySource)] + Self.conditionHeaders(condition)),
        key: destination)
    } catch StoreError.notFound {
      throw StoreError.notFound(key: source)
    }
    let doc = try Self.parseXML(r.body, root: "CopyObjectResult", alternate: "CopyObjectResponse")
    guard let eTag = doc.value("ETag") else {
      throw StoreError.malformedResponse("no ETag in CopyObjectResult")
    }
    return Self.unquote(eTag)
  }

  public func createMultipartUpload(key: String) throws -> String {
    let full = try fullKey(key)
    let r = try send(
      request(.createMultipartUpload, "POST", fullKey: full, query: [("uploads", "")]), key: key)
    let doc = try Self.parseXML(
      r.body, root: "InitiateMultipartUploadResult", alternate: "CreateMultipartUploadResponse")
    guard let id = doc.value("UploadId"), !id.isEmpty else {
      throw StoreError.malformedResponse("no UploadId in InitiateMultipartUploadResult")
    }
    return id
  }

  public func uploadPart(key: String, uploadID: String, partNumber: Int, body: UploadBody) throws
    -> String
  {
    let full = try fullKey(key)
    let r = try send(
      request(
        .uploadPart, "PUT", fullKey: full,
        query: [("partNumber", String(partNumber)), ("uploadId", uploadID)],
        body: Self.requestBody(body)),
      key: key)
    guard let eTag = r.headers["etag"] else {
      throw StoreError.malformedResponse("no ETag for part \(partNumber) of \(key)")
    }
    return Self.unquote(eTag)
  }

  public func listParts(key: String, uploadID: String) throws -> [UploadedPart] {
    let full = try fullKey(key)
    var parts: [UploadedPart] = []
    var marker: String? = nil
    repeat {
      var query = [("uploadId", uploadID), ("max-parts", "1000")]
      if let marker { query.append(("part-number-marker", marker)) }
      let r = try send(request(.listParts, "GET", fullKey: full, query: query), key: key)
      let doc = try Self.parseXML(r.body, root: "ListPartsResult", alternate: "ListPartsResponse")
      for p in doc.all("Part") {
        guard let n = p.value("PartNumber").flatMap({ Int($0) }), let eTag = p.value("ETag"),
          let size = p.value("Size").flatMap({ UInt64($0) })
        else { throw StoreError.malformedResponse("incomplete <Part> in ListPartsResult") }
        parts.append(UploadedPart(partNumber: n, eTag: Self.unquote(eTag), size: size))
      }
      marker = doc.value("IsTruncated") == "true" ? doc.value("NextPartNumberMarker") : nil
    } while marker != nil
    return parts.sorted { $0.partNumber < $1.partNumber }
  }

  public func completeMultipartUpload(
    key: String, uploadID: String, parts: [UploadedPart], condition: WriteCondition
  ) throws -> String {
    let full = try fullKey(key)
    if case .ifMatch = condition {
      // Checked here too, for servers that ignore If-Match on CompleteMultipartUpload (moto).
      try precheck(key: key, condition)
    }
    var xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    for p in parts.sorted(by: { $0.partNumber < $1.partNumber }) {
      xml +=
        "<Part><PartNumber>\(p.partNumber)</PartNumber><ETag>\(XMLElement.escape(Self.quote(p.eTag)))</ETag></Part>"
    }
    xml += "</CompleteMultipartUpload>"
    let r = try sendRaw(
      request(
        .completeMultipartUpload, "POST", fullKey: full, query: [("uploadId", uploadID)],
        headers: Self.conditionHeaders(condition), body: .data(Data(xml.utf8))),
      key: key)
    if r.status == 404 && r.attempts > 1 {
      // An earlier attempt may have completed the upload and lost its answer: then the object
      // is there, made of exactly these parts.
      let totalSize = parts.reduce(UInt64(0)) { $0 + $1.size }
      if let info = try? head(key: key), info.size == totalSize,
        info.eTag.hasSuffix("-\(parts.count)")
      {
        return info.eTag
      }
    }
    guard r.isSuccess else { throw mapError(r, key: key, range: nil) }
    let doc = try Self.parseXML(
      r.body, root: "CompleteMultipartUploadResult", alternate: "CompleteMultipartUploadResponse")
    guard let eTag = doc.value("ETag") else {
      throw StoreError.malformedResponse("no ETag in CompleteMultipartUploadResult")
    }
    return Self.unquote(eTag)
  }

  public func abortMultipartUpload(key: String, uploadID: String) throws {
    let full = try fullKey(key)
    do {
      _ = try send(
        request(.abortMultipartUpload, "DELETE", fullKey: full, query: [("uploadId", uploadID)]),
        key: key)
    } catch StoreError.notFound {
      // Already gone (completed, aborted, or an earlier attempt's answer was lost).
    }
  }

  // MARK: Beyond CloudStore

  /// Deletes many objects, at most 1,000 per request; returns the keys S3 could not delete.
  /// Missing keys count as deleted.
  public func deleteObjects(keys: [String]) throws -> [S3DeleteFailure] {
    var failures: [S3DeleteFailure] = []
    var start = 0
    while start < keys.count {
      let batch = keys[start..<min(start + 1000, keys.count)]
      start += batch.count
      var xml = "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Quiet>true</Quiet>"
      for k in batch {
        let full = try fullKey(k)
        xml += "<Object><Key>\(XMLElement.escape(full))</Key></Object>"
      }
      xml += "</Delete>"
      let body = Data(xml.utf8)
      let checksum = Data(Digest.sha256(body)).base64EncodedString()
      let r = try send(
        request(
          .deleteObjects, "POST", fullKey: nil, query: [("delete", "")],
          headers: [
            ("x-amz-checksum-sha256", checksum), ("x-amz-sdk-checksum-algorithm", "SHA256"),
          ],
          body: .data(body)),
        key: batch.first ?? "")
      let doc = try Self.parseXML(r.body, root: "DeleteResult", alternate: "DeleteObjectsResponse")
      for e in doc.all("Error") {
        let key = e.value("Key") ?? ""
        failures.append(
          S3DeleteFailure(
            key: key.hasPrefix(configuration.prefix)
              ? String(key.dropFirst(configuration.prefix.count)) : key,
            code: e.value("Code") ?? "", message: e.value("Message") ?? ""))
      }
    }
    return failures
  }

  /// Creates the bucket (in the configured region); succeeds if this account already owns it.
  public func createBucket() throws {
    let body: RequestBody
    if configuration.region == "us-east-1" {
      body = .none
    } else {
      let xml =
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        + "<LocationConstraint>\(XMLElement.escape(configuration.region))</LocationConstraint>"
        + "</CreateBucketConfiguration>"
      body = .data(Data(xml.utf8))
    }
    let r = request(.createBucket, "PUT", fullKey: nil, body: body)
    do {
      _ = try send(r, key: configuration.bucket)
    } catch {
      guard case .unsupported(let m) = error, m.contains("BucketAlreadyOwnedByYou") else {
        throw error
      }
    }
  }

  /// Checks that the bucket exists and that the credentials may list it, with one
  /// ListObjectsV2 request for at most one key under the prefix.
  ///
  /// Throws `.unavailable` when the bucket does not exist, `.accessDenied` when the credentials
  /// are refused, `.transient` when the endpoint cannot be reached (after retries).
  public func checkBucket() throws {
    _ = try list(prefix: "", startAfter: nil, continuationToken: nil, maxKeys: 1)
  }

  /// Checks that the server honours `If-None-Match: *` and `If-Match` on PutObject, by writing
  /// a probe object under the prefix and deleting it.
  public func probeConditionalWrites() throws -> ConditionalWriteSupport {
    let key = ".zdc-probe-\(UUID().uuidString.lowercased())"
    defer { try? delete(key: key, condition: .none) }
    let first = try put(key: key, body: .data(Data("probe 1".utf8)), condition: .ifNoneMatch)
    var ifNoneMatch = false
    do {
      _ = try put(key: key, body: .data(Data("probe 2".utf8)), condition: .ifNoneMatch)
    } catch StoreError.preconditionFailed {
      ifNoneMatch = true
    }
    let current = try head(key: key).eTag
    let wrong = current == first ? "00000000000000000000000000000000" : first
    var ifMatch = false
    do {
      _ = try put(key: key, body: .data(Data("probe 3".utf8)), condition: .ifMatch(wrong))
    } catch StoreError.preconditionFailed {
      ifMatch = true
    }
    if ifMatch {
      let now = try head(key: key).eTag
      do {
        _ = try put(key: key, body: .data(Data("probe 4".utf8)), condition: .ifMatch(now))
      } catch StoreError.preconditionFailed {
        ifMatch = false
      }
    }
    return ConditionalWriteSupport(ifNoneMatch: ifNoneMatch, ifMatch: ifMatch)
  }
}
