import CLinux
import CSodium
import Foundation
import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// The on-disk object format: `ZDCLOBJ1` + 32 lower-case hex digits of eTag, then the content.
enum ObjectFile {
  /// The 8-byte magic.
  static let magic: [UInt8] = Array("ZDCLOBJ1".utf8)
  /// Header size: magic + eTag.
  static let headerSize = 40
  /// Size of the blocks in which content is streamed.
  static let blockSize = 1 << 20

  /// The header for an eTag.
  static func header(eTag: String) -> [UInt8] { magic + Array(eTag.utf8) }

  /// The eTag of a header, or `nil` if it is not a valid header.
  static func eTag(header: some Collection<UInt8>) -> String? {
    guard header.count == headerSize, header.prefix(8).elementsEqual(magic) else { return nil }
    let tag = header.dropFirst(8)
    guard Hex.isLower(tag, count: 32) else { return nil }
    return String(decoding: tag, as: UTF8.self)
  }
}

/// Streaming BLAKE2b-128 of object content (the eTag).
final class ContentHasher {
  private let memory: UnsafeMutableRawPointer
  private var state: OpaquePointer { OpaquePointer(memory) }

  init() {
    _ = LocalFolderStore.sodiumReady
    // The C state type is 64-byte aligned, which Swift does not import: allocate it raw.
    memory = UnsafeMutableRawPointer.allocate(
      byteCount: crypto_generichash_statebytes(), alignment: 64)
    crypto_generichash_init(state, nil, 0, 16)
  }

  deinit { memory.deallocate() }

  func update(_ bytes: UnsafeRawBufferPointer) {
    guard let base = bytes.baseAddress, bytes.count > 0 else { return }
    crypto_generichash_update(
      state, base.assumingMemoryBound(to: UInt8.self), UInt64(bytes.count))
  }

  /// The eTag: 32 lower-case hex digits.
  func finish() -> String {
    var out = [UInt8](repeating: 0, count: 16)
    crypto_generichash_final(state, &out, 16)
    return Hex.lower(out)
  }
}

/// An object file open for reading, validated.
struct OpenObject {
  let fd: Int32
  let path: String
  let info: ObjectInfo

  func close() { Posix.close(fd) }

  /// Streams `range` of the content (already clamped) to `sink` in bounded blocks.
  func stream(_ range: ByteRange, to sink: (UnsafeRawBufferPointer) throws -> Void) throws {
    try streamFile(
      fd: fd, path: path, from: UInt64(ObjectFile.headerSize) + range.lowerBound,
      count: range.count, to: sink)
  }
}

/// Streams `count` bytes of a descriptor from `offset` to `sink` in bounded blocks; a file that
/// turns out shorter is reported as `StoreError.malformedResponse`.
func streamFile(
  fd: Int32, path: String, from offset: UInt64, count: UInt64,
  to sink: (UnsafeRawBufferPointer) throws -> Void
) throws {
  guard count > 0 else { return }
  let size = Int(min(UInt64(ObjectFile.blockSize), count))
  let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
  defer { buffer.deallocate() }
  guard let base = buffer.baseAddress else { return }
  var done: UInt64 = 0
  while done < count {
    let want = Int(min(UInt64(size), count - done))
    let n = try Posix.pread(fd, base, want, offset + done, path: path)
    guard n == want else { throw StoreError.malformedResponse("\(path) is shorter than expected") }
    try sink(UnsafeRawBufferPointer(rebasing: buffer[0..<n]))
    done += UInt64(n)
  }
}

/// A new object file in the store's temporary folder, renamed to its key once complete.
///
/// Where the file system allows it, the file has no name while it is written (`O_TMPFILE`): a
/// writer killed meanwhile leaves nothing behind, however large the object. It is named
/// (``name()``, an `l-` name) just before the rename, and its writer holds an exclusive `flock`
/// on it from the start, so that a name left by a writer that died in between is one nobody
/// locks: the next open of the store removes it (``LocalFolderStore/cleanStaleTemporaries()``).
/// Elsewhere the file is written under a `w-` name, which a crash leaves until it is a day old.
final class TempObject {
  /// The file's name, once it has one.
  private(set) var path: String?
  private let directory: String
  private var fd: Int32
  private let hasher = ContentHasher()
  private var offset = UInt64(ObjectFile.headerSize)
  private var committed = false

  /// Prefix of the names given to files just before their rename (locked while their writer
  /// lives).
  static let namedForRenamePrefix = "l-"
  /// Prefix of the files written under a name (where files cannot be created unnamed).
  static let writtenNamedPrefix = "w-"

  init(directory: String, store: LocalFolderStore) throws {
    self.directory = directory
    let unnamed = store.unnamedTemporaries
    let path = unnamed ? nil : "\(directory)/\(Self.writtenNamedPrefix)\(Posix.randomHex(12))"
    func create() -> Int32 {
      guard let path else { return zdc_open_tmpfile(directory) }
      return Posix.open(path, O_RDWR | O_CREAT | O_EXCL)
    }
    var fd = create()
    if fd == -ENOENT {
      try store.makeDirectoryBelowRoot(directory)
      fd = create()
    }
    guard fd >= 0 else { throw Posix.error("create", path ?? directory, -fd) }
    self.fd = fd
    self.path = path
    // Held until the file is renamed or dropped: it tells the cleanup the name it gets is live.
    if unnamed { _ = flock(fd, LOCK_EX | LOCK_NB) }
  }

  /// A temporary name for the object file open at `source` (a hard link to it, through
  /// `/proc/self/fd`): committing it makes that very file the key's, as a copy does. The
  /// source stays locked (shared) meanwhile, which keeps the cleanup away from the name. Throws
  /// where the file system has no hard links.
  init(linking source: Int32, directory: String, store: LocalFolderStore) throws {
    self.directory = directory
    while flock(source, LOCK_SH) != 0 && errno == EINTR {}
    let path = "\(directory)/\(Self.namedForRenamePrefix)\(Posix.randomHex(12))"
    var rc = Posix.link(openFile: source, to: path)
    if rc == ENOENT, Posix.isDirectory(directory) != true {
      try store.makeDirectoryBelowRoot(directory)
      rc = Posix.link(openFile: source, to: path)
    }
    guard rc == 0 else { throw Posix.error("link", path, rc) }
    self.path = path
    fd = -1
  }

  deinit {
    if !committed, let path { unlink(path) }
    // Closed after the unlink: the lock keeps the cleanup away until then.
    if fd >= 0 { Posix.close(fd) }
  }

  /// The file's name, or its folder while it has none (for error messages).
  private var label: String { path ?? directory }

  /// Content size so far.
  var size: UInt64 { offset - UInt64(ObjectFile.headerSize) }

  /// Appends content.
  func append(_ bytes: UnsafeRawBufferPointer) throws {
    try Posix.pwrite(fd, bytes, offset, path: label)
    hasher.update(bytes)
    offset += UInt64(bytes.count)
  }

  /// Writes the header and syncs the file; returns the eTag. (The descriptor stays open, and
  /// its lock held, until the file is renamed into place or removed.)
  func finish() throws -> String {
    let eTag = hasher.finish()
    try ObjectFile.header(eTag: eTag).withUnsafeBytes {
      try Posix.pwrite(fd, $0, 0, path: label)
    }
    try Posix.fsync(fd, path: label)
    return eTag
  }

  /// The file's name in the temporary folder, given now (an `l-` name) if it has none: call
  /// just before renaming it into place.
  func name() throws -> String {
    if let path { return path }
    let named = "\(directory)/\(Self.namedForRenamePrefix)\(Posix.randomHex(12))"
    let rc = Posix.link(openFile: fd, to: named)
    guard rc == 0 else { throw Posix.error("link", named, rc) }
    path = named
    return named
  }

  /// The file has been renamed into place: keep it.
  func markCommitted() { committed = true }
}
