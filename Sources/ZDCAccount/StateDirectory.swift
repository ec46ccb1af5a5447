public import Foundation

/// The per-device state directory (mode 0700): configuration, keystore, catalog, cache.
public struct StateDirectory: Sendable, Hashable {
  /// The directory.
  public let url: URL

  public init(url: URL) { self.url = url }

  /// The directory chosen by, in order: an explicit path, `ZDC_STATE_DIR`,
  /// `$XDG_STATE_HOME/zdcfs`, `~/.local/state/zdcfs`.
  public static func resolve(
    explicit: String?, environment: [String: String] = ProcessInfo.processInfo.environment
  ) -> StateDirectory {
    if let p = explicit, !p.isEmpty { return StateDirectory(url: URL(fileURLWithPath: p)) }
    if let p = environment["ZDC_STATE_DIR"], !p.isEmpty {
      return StateDirectory(url: URL(fileURLWithPath: p))
    }
    if let p = environment["XDG_STATE_HOME"], !p.isEmpty {
      return StateDirectory(url: URL(fileURLWithPath: p).appendingPathComponent("zdcfs"))
    }
    return StateDirectory(
      url: homeDirectory(environment).appendingPathComponent(".local/state/zdcfs"))
  }

  /// The default local-folder store: `$XDG_DATA_HOME/zdcfs/store` or `~/.local/share/zdcfs/store`.
  public static func defaultStoreFolder(
    environment: [String: String] = ProcessInfo.processInfo.environment
  ) -> URL {
    if let p = environment["XDG_DATA_HOME"], !p.isEmpty {
      return URL(fileURLWithPath: p).appendingPathComponent("zdcfs/store")
    }
    return homeDirectory(environment).appendingPathComponent(".local/share/zdcfs/store")
  }

  static func homeDirectory(_ environment: [String: String]) -> URL {
    if let h = environment["HOME"], !h.isEmpty { return URL(fileURLWithPath: h) }
    return FileManager.default.homeDirectoryForCurrentUser
  }

  /// `config.json`: the account's public settings.
  public var configURL: URL { url.appendingPathComponent("config.json") }
  /// `keystore.json`: the private keys, sealed under the local passphrase.
  public var keystoreURL: URL { url.appendingPathComponent("keystore.json") }
  /// `catalog.sqlite`: the local catalog of nodes and pending operations.
  public var catalogURL: URL { url.appendingPathComponent("catalog.sqlite") }
  /// `cache/`: encrypted downloaded content.
  public var cacheURL: URL { url.appendingPathComponent("cache", isDirectory: true) }
  /// `staging/`: encrypted content written locally and not yet uploaded.
  public var stagingURL: URL { url.appendingPathComponent("staging", isDirectory: true) }

  /// True once an account was created here.
  public var isInitialized: Bool { FileManager.default.fileExists(atPath: configURL.path) }

  /// Creates the directory (and parents) and forces mode 0700 on it.
  public func create() throws {
    try FileManager.default.createDirectory(
      at: url, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: url.path)
  }

  /// Writes a file atomically with mode 0600.
  func writePrivate(_ data: Data, to file: URL) throws {
    let tmp = file.appendingPathExtension("tmp-\(getpid())")
    guard
      FileManager.default.createFile(
        atPath: tmp.path, contents: data, attributes: [.posixPermissions: 0o600])
    else { throw AccountError.io("cannot write \(tmp.path)") }
    let fd = open(tmp.path, O_RDONLY)
    if fd >= 0 {
      fsync(fd)
      close(fd)
    }
    guard rename(tmp.path, file.path) == 0 else {
      let e = errno
      unlink(tmp.path)
      throw AccountError.io("cannot rename into \(file.path): errno \(e)")
    }
  }
}
