public import Foundation
import ZDCCatalog
import ZDCCore

/// Extended attributes: user xattrs stored in the node (so they sync), the sections of a file
/// node, and read-only sync state.
extension FileSystem {
  /// Read-only attributes computed from the catalog (readable, not listed).
  static let stateNames: Set<String> = ["user.zdc.state", "user.zdc.cloudid", "user.zdc.etag"]
  static let sectionNames: [String: Section] = ["user.zdc.meta": .meta, "user.zdc.thumb": .thumb]

  /// The sync state of a node: synced, pending-upload, uploading, downloading, conflict or
  /// error.
  public func syncState(_ ino: Inode) throws -> String {
    let (id, _) = resolve(ino)
    if lock.withLock({ downloading[id] != nil }) { return "downloading" }
    if let c = lock.withLock({ contents[ContentKey(id, .data)] }), c.lock.withLock({ c.dirty }) {
      return "pending-upload"
    }
    return try read { tx in
      _ = try existingNode(id, tx)
      if case .int(let v)? = try tx.tag(forNodeID: id, identifier: Self.conflictTag), v != 0 {
        return "conflict"
      }
      let ops = try tx.pendingOperations(forNodeID: id)
      if ops.contains(where: { $0.state == .inFlight }) { return "uploading" }
      if ops.contains(where: { $0.attempts > 0 }) { return "error" }
      return ops.isEmpty ? "synced" : "pending-upload"
    }
  }

  /// The tag the sync side sets on a node whose conflict was resolved into a copy.
  public static let conflictTag = "zdcfs.conflict"

  /// An extended attribute's value.
  public func getxattr(_ ino: Inode, name: String) throws -> Data {
    // Only `user.*` is stored; other namespaces (`security.`, `system.`, `trusted.`) are not
    // supported, which is what the answer says: tools like `ls -l` (SELinux label, POSIX ACL)
    // then stop asking for every file of the mount, and the kernel's `security.capability`
    // question before every write is answered without a catalog read.
    guard name.hasPrefix("user.") else { throw FileSystemError.notSupported }
    let (id, section) = resolve(ino)
    switch name {
    case "user.zdc.state": return Data(try syncState(ino).utf8)
    case "user.zdc.cloudid":
      return Data(try read { tx in try existingNode(id, tx).cloudID }.utf8)
    case "user.zdc.etag":
      guard let e = try read({ tx in try existingNode(id, tx).eTagData }) else {
        throw FileSystemError.noAttribute
      }
      return Data(e.utf8)
    default: break
    }
    guard section == .node else { throw FileSystemError.noAttribute }
    let node = try read { tx in try existingNode(id, tx) }
    if let s = Self.sectionNames[name], node.kind == .file {
      let bytes = try sectionBytes(node, s)
      if bytes.isEmpty { throw FileSystemError.noAttribute }
      return bytes
    }
    guard let v = node.xattrs[name] else { throw FileSystemError.noAttribute }
    return v
  }

  /// The names of the extended attributes (user xattrs and non-empty sections).
  public func listxattr(_ ino: Inode) throws -> [String] {
    let (id, section) = resolve(ino)
    guard section == .node else { return [] }
    return try read { tx in
      let node = try existingNode(id, tx)
      var names = node.xattrs.keys.sorted()
      if node.kind == .file, !(try isDirectory(node, tx)) {
        if try sectionSize(node, .meta, tx) > 0 { names.append("user.zdc.meta") }
        if try sectionSize(node, .thumb, tx) > 0 { names.append("user.zdc.thumb") }
      }
      return names
    }
  }

  /// Sets an extended attribute (only the `user.` namespace; `user.zdc.*` state is read-only).
  public func setxattr(_ ino: Inode, name: String, value: Data, mode: XattrMode) throws {
    let (id, section) = resolve(ino)
    if Self.stateNames.contains(name) { throw FileSystemError.notPermitted }
    guard name.hasPrefix("user."), section == .node else { throw FileSystemError.notSupported }
    if name.utf8.count > 255 { throw FileSystemError.nameTooLong }
    if value.count > options.maxXattrSize { throw FileSystemError.tooBig }
    if let s = Self.sectionNames[name] {
      let node = try read { tx in try existingNode(id, tx) }
      guard node.kind == .file else { throw FileSystemError.notSupported }
      let exists = !(try sectionBytes(node, s)).isEmpty
      if mode == .create, exists { throw FileSystemError.exists }
      if mode == .replace, !exists { throw FileSystemError.noAttribute }
      try setSection(id, s, value)
      return
    }
    try write(commit: .soon) { tx in
      guard var node = try tx.node(id: id) else { throw FileSystemError.notFound }
      if node.kind == .trunk { throw FileSystemError.notPermitted }
      let exists = node.xattrs[name] != nil
      if mode == .create, exists { throw FileSystemError.exists }
      if mode == .replace, !exists { throw FileSystemError.noAttribute }
      node.xattrs[name] = value
      try tx.updateNode(node)
    }
  }

  /// Removes an extended attribute.
  public func removexattr(_ ino: Inode, name: String) throws {
    let (id, section) = resolve(ino)
    if Self.stateNames.contains(name) { throw FileSystemError.notPermitted }
    guard name.hasPrefix("user.") else { throw FileSystemError.notSupported }
    guard section == .node else { throw FileSystemError.noAttribute }
    if let s = Self.sectionNames[name] {
      let node = try read { tx in try existingNode(id, tx) }
      if try sectionBytes(node, s).isEmpty { throw FileSystemError.noAttribute }
      try setSection(id, s, Data())
      return
    }
    try write(commit: .soon) { tx in
      guard var node = try tx.node(id: id) else { throw FileSystemError.notFound }
      guard node.xattrs.removeValue(forKey: name) != nil else { throw FileSystemError.noAttribute }
      try tx.updateNode(node)
    }
  }
}
