import Foundation
public import ZDCCore

/// A kernel-visible inode number.
public typealias Inode = UInt64

/// An open file's handle number, as the kernel keeps it.
public typealias FileHandleID = UInt64

/// Errors of the filesystem engine; the FUSE adapter maps each case to one errno.
public enum FileSystemError: Error, Sendable, Equatable, CustomStringConvertible {
  /// No such entry or inode.
  case notFound
  /// The name is taken.
  case exists
  /// A directory was expected.
  case notADirectory
  /// A non-directory was expected.
  case isADirectory
  /// The directory has entries.
  case notEmpty
  /// The operation is not permitted on this kind of node (hard links, chown, trunks).
  case notPermitted
  /// An argument is invalid (a malformed escaped name, an unknown flag).
  case invalidArgument
  /// A name or value is too long.
  case nameTooLong
  /// No such extended attribute.
  case noAttribute
  /// The extended attribute namespace or operation is not supported.
  case notSupported
  /// The handle is unknown or not open for this operation.
  case badHandle
  /// The value does not fit the buffer offered.
  case range
  /// A value is larger than allowed (an extended attribute).
  case tooBig
  /// The content is not available (download failed) or local storage failed.
  case io(String)
  /// The content is not available offline and no download path exists.
  case unavailable
  /// The local disk (state directory: staging, cache, catalog) is full.
  case noSpace
  /// The caller's permission bits do not allow the access.
  case accessDenied
  /// A file would be larger than the local disk's file system (or the process's file size
  /// limit) allows.
  case fileTooLarge
  /// A name (or symlink target) is not UTF-8 text: the treesystem has no such names.
  case illegalByteSequence

  public var description: String {
    switch self {
    case .notFound: return "not found"
    case .exists: return "already exists"
    case .notADirectory: return "not a directory"
    case .isADirectory: return "is a directory"
    case .notEmpty: return "directory not empty"
    case .notPermitted: return "operation not permitted"
    case .invalidArgument: return "invalid argument"
    case .nameTooLong: return "name too long"
    case .noAttribute: return "no such attribute"
    case .notSupported: return "not supported"
    case .badHandle: return "bad file handle"
    case .range: return "result too large"
    case .tooBig: return "value too large"
    case .io(let m): return "I/O error: \(m)"
    case .unavailable: return "content unavailable"
    case .noSpace: return "no space left on the local disk"
    case .accessDenied: return "permission denied"
    case .illegalByteSequence: return "not a UTF-8 name"
    case .fileTooLarge: return "file too large for the local disk"
    }
  }
}

/// The process a request comes from: its user and group (the kernel's `fsuid` and `fsgid`).
public struct Caller: Sendable, Hashable {
  /// The user ID.
  public var uid: UInt32
  /// The group ID.
  public var gid: UInt32

  public init(uid: UInt32, gid: UInt32) {
    self.uid = uid
    self.gid = gid
  }

  /// The superuser, which permission bits do not restrict (but for executing a file that no
  /// one may execute).
  public static let superuser = Caller(uid: 0, gid: 0)

  /// True for the superuser.
  public var isSuperuser: Bool { uid == 0 }
}

/// The access a request needs, as `access(2)`'s mask spells it.
public struct AccessMask: OptionSet, Sendable, Hashable {
  public let rawValue: UInt32
  public init(rawValue: UInt32) { self.rawValue = rawValue }

  /// Read a file, list a directory (`R_OK`).
  public static let read = AccessMask(rawValue: 4)
  /// Write a file, add or remove a directory's entries (`W_OK`).
  public static let write = AccessMask(rawValue: 2)
  /// Execute a file, search a directory (`X_OK`).
  public static let execute = AccessMask(rawValue: 1)
}

/// How an inode presents.
public enum FileType: Sendable, Hashable {
  /// A regular file.
  case regular
  /// A directory.
  case directory
  /// A symbolic link.
  case symlink
  /// A named pipe (FIFO): the kernel carries its data; the file system keeps the name.
  case fifo
  /// A UNIX-domain socket's name (what `bind(2)` makes): likewise.
  case socket
}

/// The attributes of an inode, as `stat(2)` shows them.
public struct Attributes: Sendable, Hashable {
  /// The inode number.
  public var inode: Inode
  /// File type.
  public var type: FileType
  /// Permission bits (and setuid/setgid/sticky), without the type bits.
  public var mode: UInt32
  /// Size in bytes.
  public var size: UInt64
  /// Link count (1; 0 once unlinked while open).
  public var linkCount: UInt32
  /// Modification time (also reported as the access time).
  public var mtime: FileTime
  /// Status change time.
  public var ctime: FileTime
  /// Owner.
  public var uid: UInt32
  /// Group.
  public var gid: UInt32

  public init(
    inode: Inode, type: FileType, mode: UInt32, size: UInt64, linkCount: UInt32, mtime: FileTime,
    ctime: FileTime, uid: UInt32, gid: UInt32
  ) {
    self.inode = inode
    self.type = type
    self.mode = mode
    self.size = size
    self.linkCount = linkCount
    self.mtime = mtime
    self.ctime = ctime
    self.uid = uid
    self.gid = gid
  }
}

/// One directory entry of a listing.
public struct DirectoryEntry: Sendable, Hashable {
  /// The name shown (escaped when needed).
  public var name: String
  /// The offset of the entry after this one (pass it back to continue the listing).
  public var nextOffset: UInt64
  /// The entry's attributes.
  public var attributes: Attributes
}

/// A time to set with `setattr`.
public enum TimeChange: Sendable, Hashable {
  /// The current time.
  case now
  /// A given time.
  case time(FileTime)
}

/// The attribute changes of one `setattr` call; `nil` fields stay unchanged.
public struct AttributeChanges: Sendable, Hashable {
  /// New permission bits.
  public var mode: UInt32?
  /// New size (truncate or extend with zeros).
  public var size: UInt64?
  /// New modification time.
  public var mtime: TimeChange?
  /// New access time (ignored: the access time is the modification time).
  public var atime: TimeChange?
  /// New owner.
  public var uid: UInt32?
  /// New group.
  public var gid: UInt32?

  public init(
    mode: UInt32? = nil, size: UInt64? = nil, mtime: TimeChange? = nil,
    atime: TimeChange? = nil, uid: UInt32? = nil, gid: UInt32? = nil
  ) {
    self.mode = mode
    self.size = size
    self.mtime = mtime
    self.atime = atime
    self.uid = uid
    self.gid = gid
  }
}

/// `renameat2(2)` flags.
public struct RenameFlags: OptionSet, Sendable, Hashable {
  public let rawValue: UInt32
  public init(rawValue: UInt32) { self.rawValue = rawValue }
  /// Fail if the target exists.
  public static let noReplace = RenameFlags(rawValue: 1)
  /// Swap source and target atomically.
  public static let exchange = RenameFlags(rawValue: 2)
  /// Leave a whiteout (not supported).
  public static let whiteout = RenameFlags(rawValue: 4)
}

/// How `setxattr` treats an existing attribute.
public enum XattrMode: Sendable, Hashable {
  /// Create or replace.
  case any
  /// Fail if it exists.
  case create
  /// Fail if it does not exist.
  case replace
}

/// The result of opening a file.
public struct OpenedFile: Sendable, Hashable {
  /// The handle to pass to later calls.
  public var handle: FileHandleID
  /// True when the kernel may keep its page cache from an earlier open.
  public var keepCache: Bool
}

/// Filesystem-wide figures for `statfs(2)`.
public struct FileSystemStatistics: Sendable, Hashable {
  /// Block size.
  public var blockSize: UInt64
  /// Total blocks.
  public var blocks: UInt64
  /// Free blocks.
  public var freeBlocks: UInt64
  /// Blocks available to unprivileged users.
  public var availableBlocks: UInt64
  /// Number of inodes (nodes).
  public var files: UInt64
  /// Free inodes.
  public var freeFiles: UInt64
  /// Longest name.
  public var nameMax: UInt64
}

/// What the engine asks the kernel to forget when the treesystem changes underneath it.
///
/// The FUSE adapter implements it with libfuse's notify calls; calls arrive on the engine's
/// notification thread, never inside a FUSE request.
public protocol KernelNotifier: AnyObject, Sendable {
  /// Forget cached attributes and content of an inode.
  func invalidateInode(_ inode: Inode)
  /// Forget the directory entry `name` of `parent` (positive or negative).
  func invalidateEntry(parent: Inode, name: String)
  /// The entry `name` of `parent`, inode `child`, is gone.
  func deleteEntry(parent: Inode, child: Inode, name: String)
  /// Forget cached attributes of an inode (its cached content stays).
  func invalidateAttributes(_ inode: Inode)
}
