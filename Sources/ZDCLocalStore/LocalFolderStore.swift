import CLinux
import CSodium
public import Foundation
public import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// A `CloudStore` kept in a local folder, which several processes may use at once and which
/// keeps its objects, eTags included, when the folder is copied or synced whole.
///
/// Listing, ranges, write conditions and multipart uploads behave as with S3, within the limits
/// of a file system: a key's components are at most `maxComponentLength` bytes, a key cannot be
/// both an object and a prefix of other objects (`a/b` and `a/b/c`: `StoreError.unsupported`),
/// and part sizes are not checked (S3 wants at least 5 MiB for all parts but the last).
public final class LocalFolderStore: StreamingPutStore {
  /// The folder holding the objects.
  public let root: URL

  /// Number of lock files that conditional writes are spread over.
  static let lockStripes = 64
  /// The most keys one `list` call returns, as with S3.
  public static let maxKeysPerPage = 1000
  /// Temporary files older than this are removed when a store is opened (those named just
  /// before their rename, whatever their age, once no writer holds them).
  static let staleTempAge: TimeInterval = 24 * 3600
  /// Whether new object files are written unnamed (`O_TMPFILE`, named through
  /// `/proc/self/fd` just before their rename), found when the store is opened.
  @_spi(Testing) public let unnamedTemporaries: Bool

  let rootPath: String
  let tmpPath: String
  let locksPath: String
  let multipartPath: String

  static let sodiumReady: Bool = {
    let rc = sodium_init()
    precondition(rc >= 0, "libsodium failed to initialise")
    return true
  }()

  /// Opens the store at `root`, creating the folder (mode 0700) if needed.
  public convenience init(root: URL) throws {
    try self.init(root: root, unnamedTemporaries: true)
  }

  /// Opens the store at `root`; with `unnamedTemporaries` false, new object files are written
  /// under a name, as where the file system has no unnamed files (tests).
  @_spi(Testing) public init(root: URL, unnamedTemporaries allowed: Bool) throws {
    _ = Self.sodiumReady
    self.root = root.standardizedFileURL
    var path = self.root.path
    while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
    rootPath = path
    tmpPath = path + "/.zdc-tmp"
    locksPath = path + "/.zdc-locks"
    multipartPath = path + "/.zdc-multipart"
    try Posix.mkdirs(rootPath)
    guard Posix.isDirectory(rootPath) == true else {
      throw StoreError.io("\(rootPath) is not a directory", errno: ENOTDIR)
    }
    for dir in [tmpPath, locksPath, multipartPath] {
      let rc = Posix.mkdir(dir)
      if rc != 0 && rc != EEXIST { throw Posix.error("mkdir", dir, rc) }
    }
    unnamedTemporaries = allowed && Self.canNameUnnamedFiles(in: tmpPath)
    cleanStaleTemporaries()
  }

  /// True when an unnamed file made in `directory` can be given a name there.
  static func canNameUnnamedFiles(in directory: String) -> Bool {
    let fd = zdc_open_tmpfile(directory)
    guard fd >= 0 else { return false }
    defer { Posix.close(fd) }
    let probe = "\(directory)/\(TempObject.namedForRenamePrefix)probe-\(Posix.randomHex(8))"
    guard Posix.link(openFile: fd, to: probe) == 0 else { return false }
    unlink(probe)
    return true
  }

  /// Creates `path` (below the root) and its missing parents, but never the root itself: a
  /// store folder that disappeared (an unmounted disk, a folder moved away) is unavailable,
  /// and writing into a new empty folder in its place would lose what is written.
  func makeDirectoryBelowRoot(_ path: String) throws {
    guard Posix.isDirectory(rootPath) == true else {
      throw StoreError.unavailable("the store folder \(rootPath) is missing")
    }
    try Posix.mkdirs(path)
  }

  // MARK: Keys and paths

  /// Longest key, in UTF-8 bytes, as with S3.
  public static let maxKeyLength = 1024
  /// Longest component of a key between slashes, in UTF-8 bytes (a file name on most file
  /// systems): a limit S3 does not have.
  public static let maxComponentLength = 255

  /// Throws `StoreError.invalidKey` unless the key can name an object.
  static func validate(key: String) throws {
    try ObjectKey.validate(key)
    for component in Array(key.utf8).split(separator: 0x2F, omittingEmptySubsequences: false) {
      guard isValidComponent(Array(component)) else { throw StoreError.invalidKey(key) }
    }
  }

  /// Whether a path component can be part of a key.
  static func isValidComponent(_ name: [UInt8]) -> Bool {
    guard !name.isEmpty, name.count <= maxComponentLength else { return false }
    guard name[0] == 0x2E else { return true }
    return name != [0x2E] && name != [0x2E, 0x2E] && !Bytes.hasPrefix(name, reservedPrefix)
  }

  /// Entries whose names start with this belong to the store itself.
  static let reservedPrefix = Array(".zdc-".utf8)

  func path(of key: String) -> String { rootPath + "/" + key }

  /// The lock file guarding a key: a stable hash (FNV-1a) of the key picks one of the stripes.
  func lockPath(for key: String) -> String {
    let n = Int(FNV1a.hash(key.utf8) % UInt64(Self.lockStripes))
    return locksPath + (n < 10 ? "/0\(n)" : "/\(n)")
  }

  /// Runs `body` holding the key's exclusive lock (a fresh descriptor each time, so that the
  /// lock also excludes other threads of this process).
  func withLock<T>(for key: String, _ body: () throws -> T) throws -> T {
    let path = lockPath(for: key)
    var fd = Posix.open(path, O_RDWR | O_CREAT)
    if fd == -ENOENT {
      try makeDirectoryBelowRoot(locksPath)
      fd = Posix.open(path, O_RDWR | O_CREAT)
    }
    guard fd >= 0 else { throw Posix.error("open", path, -fd) }
    defer { Posix.close(fd) }
    while flock(fd, LOCK_EX) != 0 {
      if errno != EINTR { throw Posix.error("flock", path, errno) }
    }
    return try body()
  }

  // MARK: Reading

  /// Opens and validates the object file of a key.
  func openObject(key: String) throws -> OpenObject {
    let path = path(of: key)
    return try openObject(path: path, key: key)
  }

  func openObject(path: String, key: String) throws -> OpenObject {
    let fd = Posix.open(path, O_RDONLY)
    if fd == -ENOENT || fd == -ENOTDIR || fd == -ENAMETOOLONG {
      throw StoreError.notFound(key: key)
    }
    guard fd >= 0 else { throw Posix.error("open", path, -fd) }
    do {
      let st = try Posix.fstat(fd, path: path)
      guard st.st_mode & S_IFMT == S_IFREG else { throw StoreError.notFound(key: key) }
      var header = [UInt8](repeating: 0, count: ObjectFile.headerSize)
      let n = try header.withUnsafeMutableBytes { buf -> Int in
        guard let base = buf.baseAddress else { return 0 }
        return try Posix.pread(fd, base, buf.count, 0, path: path)
      }
      guard n == ObjectFile.headerSize, st.st_size >= off_t(ObjectFile.headerSize),
        let eTag = ObjectFile.eTag(header: header)
      else {
        throw StoreError.malformedResponse("\(key): not a valid object file")
      }
      let mtime =
        TimeInterval(st.st_mtim.tv_sec) + TimeInterval(st.st_mtim.tv_nsec) / 1_000_000_000
      let info = ObjectInfo(
        key: key, size: UInt64(st.st_size) - UInt64(ObjectFile.headerSize), eTag: eTag,
        lastModified: Date(timeIntervalSince1970: mtime))
      return OpenObject(fd: fd, path: path, info: info)
    } catch {
      Posix.close(fd)
      throw error
    }
  }

  /// The part of an object a range selects, S3-style: the start must be inside the object, the
  /// end is clamped.
  static func clamp(_ range: ByteRange?, size: UInt64, key: String) throws -> ByteRange {
    guard let range else { return ByteRange(0, size) }
    guard range.lowerBound < size else { throw StoreError.invalidRange(key: key, range: range) }
    return ByteRange(range.lowerBound, min(range.upperBound, size))
  }

  public func get(key: String, range: ByteRange?) throws -> Data {
    try Self.validate(key: key)
    let object = try openObject(key: key)
    defer { object.close() }
    let part = try Self.clamp(range, size: object.info.size, key: key)
    var data = Data(capacity: Int(part.count))
    try object.stream(part) { data.append(contentsOf: $0) }
    return data
  }

  /// The whole object and its info, from one open file.
  public func getWithInfo(key: String) throws -> (data: Data, info: ObjectInfo) {
    try Self.validate(key: key)
    let object = try openObject(key: key)
    defer { object.close() }
    var data = Data(capacity: Int(object.info.size))
    try object.stream(ByteRange(0, object.info.size)) { data.append(contentsOf: $0) }
    return (data, object.info)
  }

  /// Streams the object (or a range of it) into `file`; returns the whole object's info.
  public func get(key: String, range: ByteRange?, to file: URL) throws -> ObjectInfo {
    try Self.validate(key: key)
    let object = try openObject(key: key)
    defer { object.close() }
    let part = try Self.clamp(range, size: object.info.size, key: key)
    let outPath = file.path
    let out = Posix.open(outPath, O_WRONLY | O_CREAT | O_TRUNC)
    guard out >= 0 else { throw Posix.error("create", outPath, -out) }
    defer { Posix.close(out) }
    var offset: UInt64 = 0
    try object.stream(part) { bytes in
      try Posix.pwrite(out, bytes, offset, path: outPath)
      offset += UInt64(bytes.count)
    }
    return object.info
  }

  public func head(key: String) throws -> ObjectInfo {
    try Self.validate(key: key)
    let object = try openObject(key: key)
    object.close()
    return object.info
  }

  // MARK: Writing

  /// Writes the bytes `produce` hands to its sink into a new temporary object file (removed
  /// again if anything throws); returns it, synced, and its eTag.
  func writeTemp(
    producing produce: (_ sink: (UnsafeRawBufferPointer) throws -> Void) throws -> Void
  ) throws -> (TempObject, String) {
    let temp = try TempObject(directory: tmpPath, store: self)
    try produce { try temp.append($0) }
    let eTag = try temp.finish()
    return (temp, eTag)
  }

  /// Writes a body into a new temporary object file.
  func writeTemp(_ body: UploadBody) throws -> (TempObject, String) {
    try writeTemp { sink in try Self.stream(body, to: sink) }
  }

  /// Hands a body's bytes to `sink` in bounded blocks.
  private static func stream(_ body: UploadBody, to sink: (UnsafeRawBufferPointer) throws -> Void)
    throws
  {
    switch body {
    case .data(let data):
      try data.withUnsafeBytes { try sink($0) }
    case .file(let url, let range):
      let path = url.path
      let fd = Posix.open(path, O_RDONLY)
      guard fd >= 0 else { throw Posix.error("open", path, -fd) }
      defer { Posix.close(fd) }
      let st = try Posix.fstat(fd, path: path)
      let size = UInt64(max(st.st_size, 0))
      let part = range ?? ByteRange(0, size)
      guard part.upperBound <= size else {
        throw StoreError.invalidRange(key: path, range: part)
      }
      try streamFile(fd: fd, path: path, from: part.lowerBound, count: part.count, to: sink)
    }
  }

  /// Checks a condition against the current object; call with the key's lock held.
  func check(_ condition: WriteCondition, key: String) throws {
    switch condition {
    case .none:
      return
    case .ifNoneMatch:
      if Posix.isDirectory(path(of: key)) == false { throw StoreError.preconditionFailed(key: key) }
    case .ifMatch(let expected):
      let current: String
      do {
        let object = try openObject(key: key)
        object.close()
        current = object.info.eTag
      } catch StoreError.notFound, StoreError.malformedResponse {
        throw StoreError.preconditionFailed(key: key)
      }
      guard current == expected else { throw StoreError.preconditionFailed(key: key) }
    }
  }

  /// Creates the parent directories of a key's file.
  func makeParents(of key: String) throws {
    var current = rootPath
    let components = key.split(separator: "/", omittingEmptySubsequences: false)
    for component in components.dropLast() {
      current += "/" + component
      let rc = Posix.mkdir(current)
      switch rc {
      case 0, EEXIST: continue
      case ENOENT: return  // a concurrent delete removed a parent: the caller retries
      case ENOTDIR:
        throw StoreError.unsupported("\(key): a parent of this key is an object")
      default: throw Posix.error("mkdir", current, rc)
      }
    }
  }

  /// Moves a finished temporary file to the key under its condition.
  func commit(_ temp: TempObject, key: String, condition: WriteCondition) throws {
    let target = path(of: key)
    try withLock(for: key) {
      try check(condition, key: key)
      let source = try temp.name()
      var attempts = 0
      while rename(source, target) != 0 {
        let code = errno
        attempts += 1
        switch code {
        case ENOENT where attempts < 100:
          try makeParents(of: key)
        case EISDIR, ENOTEMPTY, EEXIST:
          throw StoreError.unsupported("\(key): the key is also a prefix of other objects")
        case ENOTDIR:
          throw StoreError.unsupported("\(key): a parent of this key is an object")
        default:
          throw Posix.error("rename", target, code)
        }
      }
      temp.markCommitted()
    }
    Posix.fsyncDirectory(String(target[..<(target.lastIndex(of: "/") ?? target.endIndex)]))
  }

  public func put(key: String, body: UploadBody, condition: WriteCondition) throws -> String {
    try Self.validate(key: key)
    let (temp, eTag) = try writeTemp(body)
    try commit(temp, key: key, condition: condition)
    return eTag
  }

  /// Writes the produced bytes straight into a temporary object file, moved to the key once
  /// complete (unnamed while it is written: neither a failure nor a crash leaves it behind).
  public func put(
    key: String, condition: WriteCondition,
    producing produce: (_ sink: (UnsafeRawBufferPointer) throws -> Void) throws -> Void
  ) throws -> String {
    try Self.validate(key: key)
    let (temp, eTag) = try writeTemp(producing: produce)
    try commit(temp, key: key, condition: condition)
    return eTag
  }

  /// Deletes an object. `.ifNoneMatch` succeeds only when there is nothing to delete.
  public func delete(key: String, condition: WriteCondition) throws {
    try Self.validate(key: key)
    let target = path(of: key)
    try withLock(for: key) {
      try check(condition, key: key)
      if case .ifNoneMatch = condition { return }
      if unlink(target) != 0 {
        let code = errno
        switch code {
        case ENOENT, ENOTDIR:
          if case .ifMatch = condition { throw StoreError.preconditionFailed(key: key) }
        case EISDIR: return  // a prefix, not an object: nothing to delete
        default: throw Posix.error("unlink", target, code)
        }
      }
    }
    removeEmptyParents(of: key)
  }

  /// Removes the now-empty directories above a key, up to the root; races are harmless (a
  /// non-empty or vanished directory ends the walk, and writers recreate what they need).
  func removeEmptyParents(of key: String) {
    var components = key.split(separator: "/", omittingEmptySubsequences: false).dropLast()
    var synced = false
    while !components.isEmpty {
      let dir = rootPath + "/" + components.joined(separator: "/")
      if !synced {
        Posix.fsyncDirectory(dir)
        synced = true
      }
      guard rmdir(dir) == 0 else { return }
      components = components.dropLast()
    }
    if !synced { Posix.fsyncDirectory(rootPath) }
  }

  public func copy(from source: String, to destination: String, condition: WriteCondition) throws
    -> String
  {
    try Self.validate(key: source)
    try Self.validate(key: destination)
    let object = try openObject(key: source)
    defer { object.close() }
    // No object file is ever written in place (every write makes a new file and renames it over
    // the key's), so the copy can be another name of the source's very file, whatever the size:
    // nothing is read or written. Where the file system has no hard links, the bytes are copied.
    if let linked = try? TempObject(linking: object.fd, directory: tmpPath, store: self) {
      try commit(linked, key: destination, condition: condition)
      return object.info.eTag
    }
    let (temp, eTag) = try writeTemp { try object.stream(ByteRange(0, object.info.size), to: $0) }
    try commit(temp, key: destination, condition: condition)
    return eTag
  }

  // MARK: Maintenance

  /// Removes temporary files left behind by writers that died: those named for their rename
  /// (`l-`) once no writer holds their lock, the others once they are a day old.
  func cleanStaleTemporaries() {
    guard let entries = try? Posix.directoryEntries(tmpPath) else { return }
    let cutoff = Date().timeIntervalSince1970 - Self.staleTempAge
    for entry in entries {
      let name = String(decoding: entry.name, as: UTF8.self)
      let path = tmpPath + "/" + name
      var st = stat()
      guard lstat(path, &st) == 0 else { continue }
      if name.hasPrefix(TempObject.namedForRenamePrefix) && st.st_mode & S_IFMT == S_IFREG {
        removeIfUnlocked(path)
        continue
      }
      guard TimeInterval(st.st_mtim.tv_sec) < cutoff else { continue }
      switch st.st_mode & S_IFMT {
      case S_IFREG: unlink(path)
      case S_IFDIR: removeTree(path)  // a multipart upload that was being created
      default: continue
      }
    }
  }

  /// Removes the file at `path` if nobody holds a `flock` on it (a live writer does).
  func removeIfUnlocked(_ path: String) {
    let fd = Posix.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
    guard fd >= 0 else { return }
    defer { Posix.close(fd) }
    guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { return }
    unlink(path)
  }
}
