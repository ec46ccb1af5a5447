public import Foundation

/// AWS credentials: an access key, its secret and, for temporary credentials, a session token.
public struct S3Credentials: Sendable, Hashable, CustomStringConvertible,
  CustomDebugStringConvertible, CustomReflectable
{
  /// The access key ID (not secret).
  public var accessKeyID: String
  /// The secret access key.
  public var secretAccessKey: String
  /// The session token of temporary credentials.
  public var sessionToken: String?

  /// Credentials from their parts.
  public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
    self.accessKeyID = accessKeyID
    self.secretAccessKey = secretAccessKey
    self.sessionToken = sessionToken
  }

  /// The access key ID only; secrets are never shown.
  public var description: String {
    "S3Credentials(\(accessKeyID), secret: <redacted>\(sessionToken == nil ? "" : ", session token: <redacted>"))"
  }

  public var debugDescription: String { description }

  /// Shows the access key ID only, so `dump` does not print secrets either.
  public var customMirror: Mirror {
    Mirror(self, children: ["accessKeyID": accessKeyID], displayStyle: .struct)
  }
}

/// How the bucket appears in request URLs.
public enum S3AddressingStyle: String, Sendable, Hashable, Codable {
  /// `https://endpoint/bucket/key`.
  case path
  /// `https://bucket.endpoint/key`.
  case virtualHosted = "virtual"
  /// Virtual-hosted for AWS endpoints and DNS-safe bucket names, path-style otherwise.
  case auto
}

/// Timeouts, retries and concurrency of the HTTP transport.
public struct S3TransportOptions: Sendable, Hashable {
  /// Maximum simultaneous requests.
  public var maxConcurrentRequests: Int = 8
  /// Attempts per request, the first included.
  public var maxAttempts: Int = 5
  /// Delay before the first retry, in seconds; doubles each retry, with jitter.
  public var initialBackoff: Double = 0.2
  /// Longest delay between retries, in seconds.
  public var maxBackoff: Double = 10
  /// Connection timeout, in seconds.
  public var connectTimeout: Double = 10
  /// A transfer slower than `lowSpeedLimit` bytes/s for `lowSpeedTime` seconds is aborted.
  public var lowSpeedLimit: Int = 1024
  /// See `lowSpeedLimit`.
  public var lowSpeedTime: Int = 30
  /// Verify TLS certificates (turn off only for self-signed test servers).
  public var verifyTLS: Bool = true

  /// The defaults.
  public init() {}
}

/// Errors in resolving an S3 configuration.
public enum S3ConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
  /// A store URL that is not `s3://bucket[/prefix]`.
  case invalidStoreURL(String)
  /// An endpoint that is not an `http://` or `https://` URL.
  case invalidEndpoint(String)
  /// No access key and secret were found.
  case missingCredentials(profile: String)
  /// No bucket was given.
  case missingBucket

  public var description: String {
    switch self {
    case .invalidStoreURL(let s): return "not an s3://bucket/prefix URL: \(s)"
    case .invalidEndpoint(let s): return "not an http(s) endpoint URL: \(s)"
    case .missingCredentials(let p):
      return
        "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or add profile \(p) to ~/.aws/credentials"
    case .missingBucket: return "no bucket given"
    }
  }
}

/// Where and how to reach an S3 bucket, and with which credentials.
public struct S3Configuration: Sendable, Hashable, CustomStringConvertible {
  /// The bucket name.
  public var bucket: String
  /// A key prefix under which every object is stored ("" or ending in `/`).
  public var prefix: String
  /// The service endpoint (`https://s3.{region}.amazonaws.com` when `nil`).
  public var endpoint: URL?
  /// The signing region.
  public var region: String
  /// Path-style or virtual-hosted-style URLs.
  public var addressingStyle: S3AddressingStyle
  /// The signing credentials.
  public var credentials: S3Credentials
  /// Transport tuning.
  public var transport: S3TransportOptions

  /// A configuration from its parts; `prefix` is normalised ("" or ending in one `/`).
  public init(
    bucket: String, prefix: String = "", endpoint: URL? = nil, region: String = "us-east-1",
    addressingStyle: S3AddressingStyle = .auto, credentials: S3Credentials,
    transport: S3TransportOptions = S3TransportOptions()
  ) {
    self.bucket = bucket
    self.prefix = Self.normalizePrefix(prefix)
    self.endpoint = endpoint
    self.region = region
    self.addressingStyle = addressingStyle
    self.credentials = credentials
    self.transport = transport
  }

  /// Bucket, prefix, endpoint, region and addressing; never secrets.
  public var description: String {
    "s3://\(bucket)/\(prefix) at \(endpoint?.absoluteString ?? "AWS") (region \(region), \(addressingStyle.rawValue) addressing, key \(credentials.accessKeyID))"
  }

  /// `""` stays empty; anything else gets exactly one trailing `/` and no leading `/`.
  static func normalizePrefix(_ p: String) -> String {
    var s = Substring(p)
    while s.hasPrefix("/") { s = s.dropFirst() }
    while s.hasSuffix("/") { s = s.dropLast() }
    return s.isEmpty ? "" : String(s) + "/"
  }

  /// Splits `s3://bucket/prefix` into bucket and prefix.
  public static func parseStoreURL(_ url: String) throws -> (bucket: String, prefix: String) {
    guard url.lowercased().hasPrefix("s3://") else {
      throw S3ConfigurationError.invalidStoreURL(url)
    }
    let rest = url.dropFirst(5)
    let bucket: Substring
    let prefix: Substring
    if let slash = rest.firstIndex(of: "/") {
      bucket = rest[..<slash]
      prefix = rest[rest.index(after: slash)...]
    } else {
      bucket = rest
      prefix = ""
    }
    guard !bucket.isEmpty, !bucket.contains(where: { $0 == "?" || $0 == "#" || $0 == " " }) else {
      throw S3ConfigurationError.invalidStoreURL(url)
    }
    return (String(bucket), normalizePrefix(String(prefix)))
  }

  /// Resolves a configuration the way the AWS CLI does: explicit arguments first, then
  /// environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
  /// `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL`, `AWS_PROFILE`),
  /// then the profile in `~/.aws/credentials` and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`
  /// and `AWS_CONFIG_FILE`).
  ///
  /// - Parameters:
  ///   - storeURL: `s3://bucket/prefix`; overrides `bucket` and `prefix`.
  ///   - environment: the environment to read (the process's by default).
  ///   - home: the home directory holding `.aws` (`HOME` by default).
  public static func resolve(
    storeURL: String? = nil, bucket: String? = nil, prefix: String? = nil,
    endpoint: String? = nil, region: String? = nil, profile: String? = nil,
    addressingStyle: S3AddressingStyle? = nil, credentials: S3Credentials? = nil,
    environment: [String: String] = ProcessInfo.processInfo.environment, home: URL? = nil
  ) throws -> S3Configuration {
    var bucketName = bucket
    var keyPrefix = prefix ?? ""
    if let storeURL {
      let parsed = try parseStoreURL(storeURL)
      bucketName = parsed.bucket
      keyPrefix = parsed.prefix
    }
    guard let bucketName, !bucketName.isEmpty else { throw S3ConfigurationError.missingBucket }

    func env(_ name: String) -> String? {
      guard let v = environment[name], !v.isEmpty else { return nil }
      return v
    }
    let profileName = profile ?? env("AWS_PROFILE") ?? "default"
    let homeDir =
      home ?? env("HOME").map { URL(fileURLWithPath: $0) }
      ?? FileManager.default.homeDirectoryForCurrentUser
    let credentialsFile =
      env("AWS_SHARED_CREDENTIALS_FILE").map { URL(fileURLWithPath: $0) }
      ?? homeDir.appendingPathComponent(".aws/credentials")
    let configFile =
      env("AWS_CONFIG_FILE").map { URL(fileURLWithPath: $0) }
      ?? homeDir.appendingPathComponent(".aws/config")
    let credSection = INIFile.load(credentialsFile)?.sections[profileName] ?? [:]
    let configSections = INIFile.load(configFile)?.sections ?? [:]
    let configSection =
      (profileName == "default"
        ? configSections["default"] ?? configSections["profile default"]
        : configSections["profile \(profileName)"]) ?? [:]

    // Credentials: explicit, environment, credentials file, config file.
    let creds: S3Credentials
    if let credentials {
      creds = credentials
    } else if let id = env("AWS_ACCESS_KEY_ID"), let secret = env("AWS_SECRET_ACCESS_KEY") {
      creds = S3Credentials(
        accessKeyID: id, secretAccessKey: secret, sessionToken: env("AWS_SESSION_TOKEN"))
    } else if let id = credSection["aws_access_key_id"],
      let secret = credSection["aws_secret_access_key"]
    {
      creds = S3Credentials(
        accessKeyID: id, secretAccessKey: secret, sessionToken: credSection["aws_session_token"])
    } else if let id = configSection["aws_access_key_id"],
      let secret = configSection["aws_secret_access_key"]
    {
      creds = S3Credentials(
        accessKeyID: id, secretAccessKey: secret,
        sessionToken: configSection["aws_session_token"])
    } else {
      throw S3ConfigurationError.missingCredentials(profile: profileName)
    }

    let resolvedRegion =
      region ?? env("AWS_REGION") ?? env("AWS_DEFAULT_REGION") ?? configSection["region"]
      ?? "us-east-1"
    let endpointString =
      endpoint ?? env("AWS_ENDPOINT_URL_S3") ?? env("AWS_ENDPOINT_URL")
      ?? configSection["s3.endpoint_url"] ?? configSection["endpoint_url"]
    var endpointURL: URL? = nil
    if let endpointString {
      guard let u = URL(string: endpointString), let scheme = u.scheme?.lowercased(),
        scheme == "http" || scheme == "https", u.host != nil
      else { throw S3ConfigurationError.invalidEndpoint(endpointString) }
      endpointURL = u
    }
    var style = addressingStyle ?? .auto
    if addressingStyle == nil, let s = configSection["s3.addressing_style"] {
      style = S3AddressingStyle(rawValue: s) ?? .auto
    }
    return S3Configuration(
      bucket: bucketName, prefix: keyPrefix, endpoint: endpointURL, region: resolvedRegion,
      addressingStyle: style, credentials: creds)
  }
}

/// A minimal INI reader for the AWS shared files: `[section]`, `key = value`, `#`/`;` comments,
/// and indented `key = value` lines under a `name =` line as `name.key` (AWS nested sections).
enum INIFile {
  struct Parsed { var sections: [String: [String: String]] }

  static func load(_ url: URL) -> Parsed? {
    guard let text = try? String(contentsOf: url, encoding: .utf8) else { return nil }
    return parse(text)
  }

  static func parse(_ text: String) -> Parsed {
    var sections: [String: [String: String]] = [:]
    var current: String? = nil
    var nestedParent: String? = nil
    for rawLine in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline) {
      let indented = rawLine.first == " " || rawLine.first == "\t"
      let line = rawLine.trimmingCharacters(in: .whitespaces)
      if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
      if line.hasPrefix("[") && line.hasSuffix("]") {
        let name = line.dropFirst().dropLast().trimmingCharacters(in: .whitespaces)
        let collapsed = name.split(separator: " ", omittingEmptySubsequences: true)
          .joined(separator: " ")
        current = collapsed
        nestedParent = nil
        if sections[collapsed] == nil { sections[collapsed] = [:] }
        continue
      }
      guard let section = current, let eq = line.firstIndex(of: "=") else { continue }
      let key = line[..<eq].trimmingCharacters(in: .whitespaces).lowercased()
      let value = line[line.index(after: eq)...].trimmingCharacters(in: .whitespaces)
      if indented, let parent = nestedParent {
        sections[section]?["\(parent).\(key)"] = value
      } else if value.isEmpty {
        nestedParent = key
      } else {
        nestedParent = nil
        sections[section]?[key] = value
      }
    }
    return Parsed(sections: sections)
  }
}
