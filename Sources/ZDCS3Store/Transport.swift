import CCurl
import Foundation
import Logging
import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// The kinds of S3 requests the store sends, for request counting.
public enum S3RequestKind: String, Sendable, Hashable, CaseIterable {
  /// ListObjectsV2.
  case listObjects
  /// GetObject (whole or ranged).
  case getObject
  /// HeadObject.
  case headObject
  /// PutObject.
  case putObject
  /// DeleteObject.
  case deleteObject
  /// DeleteObjects (batch).
  case deleteObjects
  /// CopyObject.
  case copyObject
  /// CreateMultipartUpload.
  case createMultipartUpload
  /// UploadPart.
  case uploadPart
  /// ListParts.
  case listParts
  /// CompleteMultipartUpload.
  case completeMultipartUpload
  /// AbortMultipartUpload.
  case abortMultipartUpload
  /// CreateBucket.
  case createBucket
}

/// Where a request body comes from.
enum RequestBody {
  case none
  case data(Data)
  case file(URL, ByteRange?)
}

/// Where a successful response body goes.
enum ResponseSink {
  case memory
  case file(URL)
}

/// One HTTP request, before signing.
struct HTTPRequest {
  var kind: S3RequestKind
  var method: String
  var host: String
  var baseURL: String  // scheme://host[:port]
  var encodedPath: String
  var query: [(String, String)] = []
  var headers: [(String, String)] = []
  var body: RequestBody = .none
  var payloadHash: String
  var sink: ResponseSink = .memory
  /// The body's media type, when there is a body worth labelling.
  var contentType: String? = nil
}

/// A response: status, lower-cased headers, and the body (in memory unless streamed to a file).
struct HTTPResponse {
  var status: Int
  var headers: [String: String]
  var body: Data
  var errorCode: String? = nil
  var errorMessage: String? = nil
  /// How many attempts it took.
  var attempts = 1

  var isSuccess: Bool { (200..<300).contains(status) }
}

/// Failures the transport reports before the store maps them.
enum TransportFailure: Error {
  /// A network-level failure (after retries if it was retryable).
  case curl(code: Int, message: String, retryable: Bool)
  /// A local file could not be opened, read or written.
  case local(String, errno: Int32)
  /// Retryable HTTP failures persisted through every attempt.
  case exhausted(HTTPResponse)
}

/// Per-transfer state reached from libcurl's C callbacks through `Unmanaged`.
final class Transfer {
  // Request body.
  var bodyData: Data = Data()
  var bodyFD: Int32 = -1
  var bodyStart: UInt64 = 0
  var bodyLength: UInt64 = 0
  var bodySent: UInt64 = 0
  /// Times libcurl rewound the body to send the request again by itself.
  var resends = 0
  // Response.
  var status = 0
  var headers: [String: String] = [:]
  var memory = Data()
  var sinkFD: Int32 = -1
  var sinkWritten: UInt64 = 0
  var localErrno: Int32 = 0
  var localError: String? = nil

  func rewind() {
    bodySent = 0
    resends = 0
    status = 0
    headers = [:]
    memory = Data()
    sinkWritten = 0
    if sinkFD >= 0 { _ = ftruncate(sinkFD, 0) }
  }
}

private func curlRead(
  _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int,
  _ context: UnsafeMutableRawPointer?
) -> Int {
  guard let buffer, let context else { return 0 }
  let t = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
  let capacity = size * count
  let remaining = t.bodyLength - t.bodySent
  let n = Int(min(UInt64(capacity), remaining))
  if n == 0 { return 0 }
  if t.bodyFD >= 0 {
    let got = pread(t.bodyFD, buffer, n, off_t(t.bodyStart + t.bodySent))
    if got <= 0 {
      t.localErrno = got < 0 ? errno : EIO
      t.localError = got < 0 ? "read failed" : "file shorter than the upload"
      return Int(CURL_READFUNC_ABORT)
    }
    t.bodySent += UInt64(got)
    return got
  }
  let start = Int(t.bodySent)
  t.bodyData.withUnsafeBytes { raw in
    buffer.withMemoryRebound(to: UInt8.self, capacity: n) { dst in
      dst.update(from: raw.bindMemory(to: UInt8.self).baseAddress! + start, count: n)
    }
  }
  t.bodySent += UInt64(n)
  return n
}

/// Rewinds the request body when libcurl resends it (a reused connection that turned out dead).
private func curlSeek(_ context: UnsafeMutableRawPointer?, _ offset: curl_off_t, _ origin: Int32)
  -> Int32
{
  guard let context, origin == SEEK_SET, offset >= 0 else { return Int32(CURL_SEEKFUNC_CANTSEEK) }
  let t = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
  guard UInt64(offset) <= t.bodyLength else { return Int32(CURL_SEEKFUNC_FAIL) }
  t.bodySent = UInt64(offset)
  t.resends += 1
  return Int32(CURL_SEEKFUNC_OK)
}

private func curlWrite(
  _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int,
  _ context: UnsafeMutableRawPointer?
) -> Int {
  guard let context else { return 0 }
  let t = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
  let n = size * count
  guard n > 0, let buffer else { return n }
  if t.sinkFD >= 0 && (200..<300).contains(t.status) {
    var done = 0
    while done < n {
      let w = pwrite(t.sinkFD, buffer + done, n - done, off_t(t.sinkWritten))
      if w < 0 {
        if errno == EINTR { continue }
        t.localErrno = errno
        t.localError = "write failed"
        return 0
      }
      done += w
      t.sinkWritten += UInt64(w)
    }
    return n
  }
  buffer.withMemoryRebound(to: UInt8.self, capacity: n) { p in
    t.memory.append(p, count: n)
  }
  return n
}

private func curlHeader(
  _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int, _ count: Int,
  _ context: UnsafeMutableRawPointer?
) -> Int {
  guard let context else { return 0 }
  let t = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
  let n = size * count
  guard n > 0, let buffer else { return n }
  let line = buffer.withMemoryRebound(to: UInt8.self, capacity: n) {
    String(decoding: UnsafeBufferPointer(start: $0, count: n), as: UTF8.self)
  }.trimmingCharacters(in: .whitespacesAndNewlines)
  if line.hasPrefix("HTTP/") {
    let parts = line.split(separator: " ")
    t.status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
    t.headers = [:]
  } else if let colon = line.firstIndex(of: ":") {
    let name = line[..<colon].lowercased()
    let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
    t.headers[name] = value
  }
  return n
}

/// A lock-protected value.
final class Locked<Value>: @unchecked Sendable {
  private let lock = NSLock()
  private var value: Value
  init(_ value: Value) { self.value = value }
  func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
    lock.lock()
    defer { lock.unlock() }
    return try body(&value)
  }
}

/// libcurl easy handles reused across requests (each keeps its connections alive), bounded
/// concurrency, and retries with jittered exponential backoff.
final class CurlTransport: @unchecked Sendable {
  static let globalInit: Bool = {
    precondition(curl_global_init(Int(CURL_GLOBAL_ALL)) == CURLE_OK, "curl_global_init failed")
    return true
  }()

  let options: S3TransportOptions
  let logger: Logger
  private let idle = Locked<[UnsafeMutableRawPointer]>([])
  private let slots: DispatchSemaphore
  let counts = Locked<[S3RequestKind: Int]>([:])
  let retries = Locked<[S3RequestKind: Int]>([:])

  init(options: S3TransportOptions, logger: Logger) {
    _ = Self.globalInit
    self.options = options
    self.logger = logger
    slots = DispatchSemaphore(value: max(1, options.maxConcurrentRequests))
  }

  deinit {
    idle.withLock { handles in
      for h in handles { curl_easy_cleanup(h) }
      handles.removeAll()
    }
  }

  private func checkout() -> UnsafeMutableRawPointer {
    if let h = idle.withLock({ $0.popLast() }) { return h }
    guard let h = curl_easy_init() else { fatalError("curl_easy_init failed") }
    return h
  }

  private func checkin(_ h: UnsafeMutableRawPointer, reusable: Bool) {
    if reusable {
      curl_easy_reset(h)
      idle.withLock { $0.append(h) }
    } else {
      curl_easy_cleanup(h)
    }
  }

  /// Sends a request, signing each attempt with `sign`, retrying retryable failures.
  func perform(
    _ request: HTTPRequest, sign: (HTTPRequest, Date) -> [(name: String, value: String)]
  ) throws(TransportFailure) -> HTTPResponse {
    let transfer = Transfer()
    switch request.body {
    case .none: break
    case .data(let d):
      transfer.bodyData = d
      transfer.bodyLength = UInt64(d.count)
    case .file(let url, let range):
      let fd = open(url.path, O_RDONLY | O_CLOEXEC)
      guard fd >= 0 else { throw .local("cannot open \(url.path)", errno: errno) }
      var st = stat()
      guard fstat(fd, &st) == 0 else {
        let e = errno
        close(fd)
        throw .local("cannot stat \(url.path)", errno: e)
      }
      let size = UInt64(st.st_size)
      let r = range ?? ByteRange(0, size)
      guard r.upperBound <= size else {
        close(fd)
        throw .local("range \(r) is beyond the end of \(url.path) (\(size) bytes)", errno: EINVAL)
      }
      transfer.bodyFD = fd
      transfer.bodyStart = r.lowerBound
      transfer.bodyLength = r.count
    }
    defer { if transfer.bodyFD >= 0 { close(transfer.bodyFD) } }
    if case .file(let url) = request.sink {
      let fd = open(url.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
      guard fd >= 0 else { throw .local("cannot create \(url.path)", errno: errno) }
      transfer.sinkFD = fd
    }
    defer { if transfer.sinkFD >= 0 { close(transfer.sinkFD) } }

    let maxAttempts = max(1, options.maxAttempts)
    var attempt = 0
    while true {
      attempt += 1
      transfer.rewind()
      counts.withLock { $0[request.kind, default: 0] += 1 }
      if attempt > 1 { retries.withLock { $0[request.kind, default: 0] += 1 } }
      let headers = sign(request, Date())
      let outcome = attemptOnce(request, headers: headers, transfer: transfer)
      let retryReason: String
      switch outcome {
      case .failure(let failure):
        guard case .curl(_, let message, true) = failure, attempt < maxAttempts else {
          throw failure
        }
        retryReason = message
      case .success(var response):
        if !response.isSuccess || Self.mayCarryError(request.kind) {
          Self.parseError(&response)
        }
        // libcurl resends a request by itself when a reused connection dies before answering.
        response.attempts = attempt + transfer.resends
        guard Self.isRetryable(response) else { return response }
        guard attempt < maxAttempts else { throw .exhausted(response) }
        retryReason = "HTTP \(response.status) \(response.errorCode ?? "")"
      }
      let delay = backoff(attempt: attempt)
      logger.notice(
        "S3 \(request.method) \(request.encodedPath) failed (\(retryReason)); retry \(attempt) of \(maxAttempts - 1) in \((delay * 100).rounded() / 100) s"
      )
      Thread.sleep(forTimeInterval: delay)
    }
  }

  /// Jittered exponential backoff: a random delay in [d/2, d], d = initial·2^(attempt-1) capped.
  func backoff(attempt: Int) -> Double {
    let d = min(options.maxBackoff, options.initialBackoff * pow(2, Double(attempt - 1)))
    return d / 2 + Double.random(in: 0...(d / 2))
  }

  static func mayCarryError(_ kind: S3RequestKind) -> Bool {
    kind == .completeMultipartUpload || kind == .copyObject
  }

  /// Fills `errorCode`/`errorMessage` from an S3 `<Error>` body, if there is one.
  static func parseError(_ response: inout HTTPResponse) {
    guard !response.body.isEmpty, response.body.count < 1 << 20,
      let root = XMLElement.parse(response.body)
    else { return }
    // S3 answers <Error>; some compatible servers wrap it in <Response><Errors><Error>.
    guard
      let error = root.name == "Error"
        ? root : (root.child("Errors")?.child("Error") ?? root.child("Error"))
    else { return }
    response.errorCode = error.value("Code")
    response.errorMessage = error.value("Message")
    if response.isSuccess {
      // CompleteMultipartUpload and CopyObject can fail after answering 200: give the failure
      // the status S3 uses for its code elsewhere.
      switch response.errorCode ?? "" {
      case "AccessDenied": response.status = 403
      case "NoSuchKey", "NoSuchUpload", "NoSuchBucket": response.status = 404
      case "PreconditionFailed": response.status = 412
      case "ConditionalRequestConflict": response.status = 409
      case "SlowDown": response.status = 503
      case "InternalError", "ServiceUnavailable", "": response.status = 500
      default: response.status = 400
      }
    }
  }

  static func isRetryable(_ r: HTTPResponse) -> Bool {
    if [500, 502, 503, 504, 429].contains(r.status) { return true }
    switch r.errorCode {
    case "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted",
      "RequestTimeTooSkewed":
      return true
    default: return false
    }
  }

  static let retryableCurlCodes: Set<Int> = [
    5,  // COULDNT_RESOLVE_PROXY
    6,  // COULDNT_RESOLVE_HOST
    7,  // COULDNT_CONNECT
    16,  // HTTP2
    18,  // PARTIAL_FILE
    28,  // OPERATION_TIMEDOUT
    35,  // SSL_CONNECT_ERROR
    52,  // GOT_NOTHING
    55,  // SEND_ERROR
    56,  // RECV_ERROR
    65,  // SEND_FAIL_REWIND
    92,  // HTTP2_STREAM
  ]

  private func attemptOnce(
    _ request: HTTPRequest, headers: [(name: String, value: String)], transfer: Transfer
  ) -> Result<HTTPResponse, TransportFailure> {
    slots.wait()
    defer { slots.signal() }

    var list: UnsafeMutablePointer<curl_slist>? = nil
    for header in headers {
      list = curl_slist_append(list, "\(header.name): \(header.value)")
    }
    // Never wait for "100 Continue"; let curl add no content type.
    list = curl_slist_append(list, "Expect:")
    list = curl_slist_append(list, "Content-Type:\(request.contentType.map { " " + $0 } ?? "")")
    defer { curl_slist_free_all(list) }

    var url = request.baseURL + request.encodedPath
    let q = SigV4Signer.canonicalQuery(request.query)
    if !q.isEmpty { url += "?" + q }
    let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
    errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
    defer { errorBuffer.deallocate() }

    // The handle is reset (or cleaned up) before the header list and error buffer it points to
    // are freed: defers run in reverse order.
    let h = checkout()
    var reusable = true
    defer { checkin(h, reusable: reusable) }
    let context = Unmanaged.passUnretained(transfer).toOpaque()
    _ = zdc_curl_setopt_string(h, CURLOPT_URL, url)
    _ = zdc_curl_setopt_long(h, CURLOPT_NOSIGNAL, 1)
    _ = zdc_curl_setopt_long(h, CURLOPT_PATH_AS_IS, 1)
    _ = zdc_curl_setopt_long(h, CURLOPT_TCP_KEEPALIVE, 1)
    _ = zdc_curl_setopt_long(h, CURLOPT_CONNECTTIMEOUT_MS, Int(options.connectTimeout * 1000))
    _ = zdc_curl_setopt_long(h, CURLOPT_LOW_SPEED_LIMIT, options.lowSpeedLimit)
    _ = zdc_curl_setopt_long(h, CURLOPT_LOW_SPEED_TIME, options.lowSpeedTime)
    _ = zdc_curl_setopt_long(h, CURLOPT_SSL_VERIFYPEER, options.verifyTLS ? 1 : 0)
    _ = zdc_curl_setopt_long(h, CURLOPT_SSL_VERIFYHOST, options.verifyTLS ? 2 : 0)
    _ = zdc_curl_setopt_pointer(h, CURLOPT_ERRORBUFFER, errorBuffer)
    _ = zdc_curl_setopt_slist(h, CURLOPT_HTTPHEADER, list)
    _ = zdc_curl_setopt_write_callback(h, curlWrite)
    _ = zdc_curl_setopt_pointer(h, CURLOPT_WRITEDATA, context)
    _ = zdc_curl_setopt_header_callback(h, curlHeader)
    _ = zdc_curl_setopt_pointer(h, CURLOPT_HEADERDATA, context)
    switch request.method {
    case "GET": break
    case "HEAD": _ = zdc_curl_setopt_long(h, CURLOPT_NOBODY, 1)
    case "PUT", "POST":
      _ = zdc_curl_setopt_long(h, CURLOPT_UPLOAD, 1)
      _ = zdc_curl_setopt_read_callback(h, curlRead)
      _ = zdc_curl_setopt_pointer(h, CURLOPT_READDATA, context)
      _ = zdc_curl_setopt_seek_callback(h, curlSeek)
      _ = zdc_curl_setopt_pointer(h, CURLOPT_SEEKDATA, context)
      _ = zdc_curl_setopt_off_t(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(transfer.bodyLength))
      if request.method == "POST" {
        _ = zdc_curl_setopt_string(h, CURLOPT_CUSTOMREQUEST, "POST")
      }
    default:
      _ = zdc_curl_setopt_string(h, CURLOPT_CUSTOMREQUEST, request.method)
    }

    let rc = curl_easy_perform(h)
    if let message = transfer.localError {
      reusable = false
      return .failure(.local(message, errno: transfer.localErrno))
    }
    guard rc == CURLE_OK else {
      reusable = false
      let detail = String(cString: errorBuffer)
      let message =
        "curl \(rc.rawValue): \(detail.isEmpty ? String(cString: curl_easy_strerror(rc)) : detail)"
      let code = Int(rc.rawValue)
      logger.debug("S3 \(request.method) \(request.encodedPath): \(message)")
      return .failure(
        .curl(code: code, message: message, retryable: Self.retryableCurlCodes.contains(code)))
    }
    var status = 0
    _ = zdc_curl_getinfo_long(h, CURLINFO_RESPONSE_CODE, &status)
    logger.debug("S3 \(request.method) \(request.encodedPath) → \(status)")
    return .success(HTTPResponse(status: status, headers: transfer.headers, body: transfer.memory))
  }
}
