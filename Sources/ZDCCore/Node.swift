public import Foundation

/// A node's local identifier: its catalog row id, also used as its inode number.
public typealias NodeID = Int64

/// What a node presents as through the mount.
public enum NodeKind: String, Sendable, Hashable, Codable, CaseIterable {
  /// A trunk (home, prefs, msgsIn, msgsOut).
  case trunk
  /// Created as a file; becomes a directory if it gains children.
  case file
  /// Created as a directory (or a file that gained children).
  case directory
  /// A symbolic link whose target is stored in the node's metadata.
  case symlink
}

/// A POSIX timestamp with nanosecond precision.
public struct FileTime: Sendable, Hashable, Codable, Comparable, CustomStringConvertible {
  /// Seconds since the Unix epoch.
  public var seconds: Int64
  /// Nanoseconds, 0 ..< 1_000_000_000.
  public var nanoseconds: Int32

  public init(seconds: Int64, nanoseconds: Int32 = 0) {
    self.seconds = seconds
    self.nanoseconds = nanoseconds
  }

  /// The time as a `Date` (loses sub-microsecond precision).
  public var date: Date {
    Date(timeIntervalSince1970: Double(seconds) + Double(nanoseconds) / 1e9)
  }

  /// A time from a `Date`.
  public init(_ date: Date) {
    let t = date.timeIntervalSince1970
    var s = t.rounded(.down)
    var ns = ((t - s) * 1e9).rounded()
    if ns >= 1e9 {
      s += 1
      ns -= 1e9
    }
    self.init(seconds: Int64(s), nanoseconds: Int32(ns))
  }

  /// Total nanoseconds since the epoch (fits until year 2262).
  public var totalNanoseconds: Int64 { seconds &* 1_000_000_000 &+ Int64(nanoseconds) }

  /// A time from total nanoseconds since the epoch.
  public init(totalNanoseconds ns: Int64) {
    var s = ns / 1_000_000_000
    var r = ns % 1_000_000_000
    if r < 0 {
      s -= 1
      r += 1_000_000_000
    }
    self.init(seconds: s, nanoseconds: Int32(r))
  }

  public static func < (a: FileTime, b: FileTime) -> Bool {
    (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
  }

  public var description: String {
    "\(seconds).\(Digits.zeroPadded(nanoseconds, width: 9))"
  }
}

/// What was last learned about a node's DATA object in the cloud.
public struct CloudDataInfo: Sendable, Hashable, Codable {
  /// Size of the metadata section, in plaintext bytes.
  public var metadataSize: UInt64
  /// Size of the thumbnail section, in plaintext bytes.
  public var thumbnailSize: UInt64
  /// Size of the data section, in plaintext bytes.
  public var dataSize: UInt64
  /// The eTag of the DATA object these sizes were read from.
  public var eTag: String
  /// When that object was last modified.
  public var lastModified: Date?

  public init(
    metadataSize: UInt64, thumbnailSize: UInt64, dataSize: UInt64, eTag: String,
    lastModified: Date? = nil
  ) {
    self.metadataSize = metadataSize
    self.thumbnailSize = thumbnailSize
    self.dataSize = dataSize
    self.eTag = eTag
    self.lastModified = lastModified
  }
}

/// Where a grafted subtree's root really lives: another user's or another tree's node.
public struct NodeAnchor: Sendable, Hashable, Codable {
  /// The owner of the foreign node.
  public var userID: String
  /// The treeID holding it.
  public var treeID: String
  /// Its dirPrefix (where its children live).
  public var dirPrefix: String

  public init(userID: String, treeID: String, dirPrefix: String) {
    self.userID = userID
    self.treeID = treeID
    self.dirPrefix = dirPrefix
  }
}

/// The metadata of one treesystem node: everything needed to sync it, except its content.
///
/// A value with copy-on-write storage: copying a node (the catalog hands out cached nodes many
/// times per file operation) copies one reference, not its twenty-six fields.
public struct Node: Sendable, Hashable, Codable, Identifiable {
  /// The fields, stored once for every copy of the node until one of them is changed.
  private struct Fields: Hashable, Codable {
    var id: NodeID
    var uuid: String
    var localUserID: String
    var parentID: NodeID?
    var name: String
    var kind: NodeKind
    var trunk: Trunk?
    var shareList: ShareList
    var burnDate: Date?
    var encryptionKey: Data
    var dirSalt: Data
    var dirPrefix: String
    var cloudID: String
    var eTagRcrd: String?
    var eTagData: String?
    var lastModifiedRcrd: Date?
    var lastModifiedData: Date?
    var cloudDataInfo: CloudDataInfo?
    var explicitCloudName: String?
    var anchor: NodeAnchor?
    var pointeeID: NodeID?
    var mode: UInt32
    var mtime: FileTime
    var xattrs: [String: Data]
    var symlinkTarget: String?
    var dataSize: UInt64
  }

  private final class Storage: @unchecked Sendable {
    // @unchecked: `fields` changes only through a node whose storage is uniquely referenced
    // (`makeUnique`), so no other copy, on any thread, can see it change.
    var fields: Fields
    init(_ fields: Fields) { self.fields = fields }
  }

  private var storage: Storage

  private mutating func makeUnique() {
    if !isKnownUniquelyReferenced(&storage) { storage = Storage(storage.fields) }
  }

  public static func == (a: Node, b: Node) -> Bool {
    a.storage === b.storage || a.storage.fields == b.storage.fields
  }

  public func hash(into hasher: inout Hasher) { hasher.combine(storage.fields) }

  public init(from decoder: any Decoder) throws {
    storage = Storage(try Fields(from: decoder))
  }

  public func encode(to encoder: any Encoder) throws { try storage.fields.encode(to: encoder) }

  /// Catalog row id (the inode number); 0 until the node is stored.
  public var id: NodeID {
    get { storage.fields.id }
    _modify {
      makeUnique()
      yield &storage.fields.id
    }
  }
  /// A random identifier, local only: never uploaded.
  public var uuid: String {
    get { storage.fields.uuid }
    _modify {
      makeUnique()
      yield &storage.fields.uuid
    }
  }
  /// The local user this node belongs to.
  public var localUserID: String {
    get { storage.fields.localUserID }
    _modify {
      makeUnique()
      yield &storage.fields.localUserID
    }
  }
  /// The parent node, or `nil` for a trunk.
  public var parentID: NodeID? {
    get { storage.fields.parentID }
    _modify {
      makeUnique()
      yield &storage.fields.parentID
    }
  }
  /// The cleartext name (for a trunk, its raw value).
  public var name: String {
    get { storage.fields.name }
    _modify {
      makeUnique()
      yield &storage.fields.name
    }
  }
  /// How the node presents.
  public var kind: NodeKind {
    get { storage.fields.kind }
    _modify {
      makeUnique()
      yield &storage.fields.kind
    }
  }
  /// For trunk nodes, which trunk.
  public var trunk: Trunk? {
    get { storage.fields.trunk }
    _modify {
      makeUnique()
      yield &storage.fields.trunk
    }
  }
  /// Who may do what.
  public var shareList: ShareList {
    get { storage.fields.shareList }
    _modify {
      makeUnique()
      yield &storage.fields.shareList
    }
  }
  /// When the server should delete the node.
  public var burnDate: Date? {
    get { storage.fields.burnDate }
    _modify {
      makeUnique()
      yield &storage.fields.burnDate
    }
  }
  /// The node's own random symmetric key (32 bytes) that encrypts its DATA and metadata.
  public var encryptionKey: Data {
    get { storage.fields.encryptionKey }
    _modify {
      makeUnique()
      yield &storage.fields.encryptionKey
    }
  }
  /// Random 20 bytes keying the cloudNames of this node's children.
  public var dirSalt: Data {
    get { storage.fields.dirSalt }
    _modify {
      makeUnique()
      yield &storage.fields.dirSalt
    }
  }
  /// Where this node's children live in the cloud (32 upper-case hex digits, or a trunk's).
  public var dirPrefix: String {
    get { storage.fields.dirPrefix }
    _modify {
      makeUnique()
      yield &storage.fields.dirPrefix
    }
  }
  /// The immutable identity shared by every device; set by the creator.
  public var cloudID: String {
    get { storage.fields.cloudID }
    _modify {
      makeUnique()
      yield &storage.fields.cloudID
    }
  }
  /// The eTag of the RCRD object, once uploaded or downloaded.
  public var eTagRcrd: String? {
    get { storage.fields.eTagRcrd }
    _modify {
      makeUnique()
      yield &storage.fields.eTagRcrd
    }
  }
  /// The eTag of the DATA object, once uploaded or downloaded.
  public var eTagData: String? {
    get { storage.fields.eTagData }
    _modify {
      makeUnique()
      yield &storage.fields.eTagData
    }
  }
  /// When the RCRD object was last modified in the cloud.
  public var lastModifiedRcrd: Date? {
    get { storage.fields.lastModifiedRcrd }
    _modify {
      makeUnique()
      yield &storage.fields.lastModifiedRcrd
    }
  }
  /// When the DATA object was last modified in the cloud.
  public var lastModifiedData: Date? {
    get { storage.fields.lastModifiedData }
    _modify {
      makeUnique()
      yield &storage.fields.lastModifiedData
    }
  }
  /// The sizes last read from the DATA object's header.
  public var cloudDataInfo: CloudDataInfo? {
    get { storage.fields.cloudDataInfo }
    _modify {
      makeUnique()
      yield &storage.fields.cloudDataInfo
    }
  }
  /// Set when the node arrived under a cloudName that does not match the hash of its name.
  public var explicitCloudName: String? {
    get { storage.fields.explicitCloudName }
    _modify {
      makeUnique()
      yield &storage.fields.explicitCloudName
    }
  }
  /// For a grafted subtree's root, where it really lives.
  public var anchor: NodeAnchor? {
    get { storage.fields.anchor }
    _modify {
      makeUnique()
      yield &storage.fields.anchor
    }
  }
  /// For a pointer node, the node it points to.
  public var pointeeID: NodeID? {
    get { storage.fields.pointeeID }
    _modify {
      makeUnique()
      yield &storage.fields.pointeeID
    }
  }
  /// POSIX permission bits (and setuid/setgid/sticky), without the file-type bits.
  public var mode: UInt32 {
    get { storage.fields.mode }
    _modify {
      makeUnique()
      yield &storage.fields.mode
    }
  }
  /// Content modification time.
  public var mtime: FileTime {
    get { storage.fields.mtime }
    _modify {
      makeUnique()
      yield &storage.fields.mtime
    }
  }
  /// User extended attributes, by full name (e.g. `user.comment`).
  public var xattrs: [String: Data] {
    get { storage.fields.xattrs }
    _modify {
      makeUnique()
      yield &storage.fields.xattrs
    }
  }
  /// For a symlink, its target.
  public var symlinkTarget: String? {
    get { storage.fields.symlinkTarget }
    _modify {
      makeUnique()
      yield &storage.fields.symlinkTarget
    }
  }
  /// Plaintext size of the data section.
  public var dataSize: UInt64 {
    get { storage.fields.dataSize }
    _modify {
      makeUnique()
      yield &storage.fields.dataSize
    }
  }

  /// True when the node points to another node.
  public var isPointer: Bool { pointeeID != nil }

  /// The later of the RCRD's and the DATA's modification dates.
  public var lastModified: Date? {
    switch (lastModifiedRcrd, lastModifiedData) {
    case (nil, nil): return nil
    case (let a?, nil): return a
    case (nil, let b?): return b
    case (let a?, let b?): return max(a, b)
    }
  }

  /// The key under which names are compared.
  public var nameKey: NameKey { NameKey(name) }

  /// A node with every field given. Use the catalog's `createNode` to make new nodes.
  public init(
    id: NodeID = 0, uuid: String, localUserID: String, parentID: NodeID?, name: String,
    kind: NodeKind, trunk: Trunk? = nil, shareList: ShareList, burnDate: Date? = nil,
    encryptionKey: Data, dirSalt: Data, dirPrefix: String, cloudID: String,
    eTagRcrd: String? = nil, eTagData: String? = nil, lastModifiedRcrd: Date? = nil,
    lastModifiedData: Date? = nil, cloudDataInfo: CloudDataInfo? = nil,
    explicitCloudName: String? = nil, anchor: NodeAnchor? = nil, pointeeID: NodeID? = nil,
    mode: UInt32, mtime: FileTime, xattrs: [String: Data] = [:], symlinkTarget: String? = nil,
    dataSize: UInt64 = 0
  ) {
    storage = Storage(
      Fields(
        id: id, uuid: uuid, localUserID: localUserID, parentID: parentID, name: name, kind: kind,
        trunk: trunk, shareList: shareList, burnDate: burnDate, encryptionKey: encryptionKey,
        dirSalt: dirSalt, dirPrefix: dirPrefix, cloudID: cloudID, eTagRcrd: eTagRcrd,
        eTagData: eTagData, lastModifiedRcrd: lastModifiedRcrd, lastModifiedData: lastModifiedData,
        cloudDataInfo: cloudDataInfo, explicitCloudName: explicitCloudName, anchor: anchor,
        pointeeID: pointeeID, mode: mode, mtime: mtime, xattrs: xattrs,
        symlinkTarget: symlinkTarget,
        dataSize: dataSize))
  }
}

/// What a pull found different about a node.
public struct NodeChange: OptionSet, Sendable, Hashable, Codable {
  public let rawValue: UInt32
  public init(rawValue: UInt32) { self.rawValue = rawValue }

  /// The name changed.
  public static let name = NodeChange(rawValue: 1 << 0)
  /// The parent changed (a move).
  public static let parent = NodeChange(rawValue: 1 << 1)
  /// The content (DATA object) changed.
  public static let data = NodeChange(rawValue: 1 << 2)
  /// Mode bits, mtime or extended attributes changed.
  public static let attributes = NodeChange(rawValue: 1 << 3)
  /// The share list changed.
  public static let permissions = NodeChange(rawValue: 1 << 4)
  /// The kind changed (e.g. a file gained children).
  public static let kind = NodeChange(rawValue: 1 << 5)
  /// The burn date changed.
  public static let burnDate = NodeChange(rawValue: 1 << 6)
}

/// The kinds of conflict sync resolves without losing either side.
public enum ConflictKind: String, Sendable, Hashable, Codable, CaseIterable {
  /// Both devices changed the content: the remote keeps the name, the local is a conflicted copy.
  case data
  /// Two devices created the same name: the later is renamed `name 2.ext`.
  case path
  /// Deleted remotely while dirty locally: the local subtree is kept and re-uploaded.
  case deletedWhileDirty
  /// Moved remotely while edited locally: both apply.
  case movedWhileEdited
  /// Two devices moved directories into each other: the one with the smallest cloudID among
  /// those the moves would close into a loop goes to the top of the tree instead.
  case crossedMoves
}

/// The push operations the catalog enqueues with each change (DESIGN §4).
public enum PushOperationKind: String, Sendable, Hashable, Codable, CaseIterable {
  /// Upload the node's RCRD (create or update).
  case putRcrd
  /// Upload the node's DATA.
  case putData
  /// Move the node's objects from an old location to its current one.
  case move
  /// Delete the objects of a node without descendants in the cloud.
  case deleteLeaf
  /// Delete the objects of a node and all its descendants.
  case deleteNode
}
