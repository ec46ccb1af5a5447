public import ZDCCore

extension LocalFolderStore {
  /// Lists keys in ascending byte order by a lazy depth-first walk of the folder.
  ///
  /// The continuation token is the last key returned; when both are given, the token wins
  /// over `startAfter`. At most `maxKeysPerPage` keys are returned at a time.
  public func list(prefix: String, startAfter: String?, continuationToken: String?, maxKeys: Int)
    throws -> ListPage
  {
    guard maxKeys > 0 else { return ListPage(objects: [], continuationToken: nil) }
    let limit = min(maxKeys, Self.maxKeysPerPage)
    var walker = ListWalker(
      store: self, prefix: Array(prefix.utf8),
      after: (continuationToken ?? startAfter).map { Array($0.utf8) }, wanted: limit + 1)
    try walker.walk(directory: rootPath, relative: [])
    var objects = walker.found
    var token: String? = nil
    if objects.count > limit {
      objects.removeLast(objects.count - limit)
      token = objects.last?.key
    }
    return ListPage(objects: objects, continuationToken: token)
  }
}

/// One listing pass: visits directories in key byte order, pruning what cannot match.
struct ListWalker {
  let store: LocalFolderStore
  let prefix: [UInt8]
  let after: [UInt8]?
  let wanted: Int
  var found: [ObjectInfo] = []

  init(store: LocalFolderStore, prefix: [UInt8], after: [UInt8]?, wanted: Int) {
    self.store = store
    self.prefix = prefix
    self.after = after
    self.wanted = wanted
  }

  private struct Candidate {
    /// The key (file) or the key prefix (directory, ending with `/`).
    var sortKey: [UInt8]
    var name: [UInt8]
    var isDirectory: Bool
  }

  /// Walks one directory whose keys start with `relative`; returns `true` once enough keys
  /// were found.
  @discardableResult
  mutating func walk(directory: String, relative: [UInt8]) throws -> Bool {
    guard let entries = try Posix.directoryEntries(directory) else { return false }
    var candidates: [Candidate] = []
    candidates.reserveCapacity(entries.count)
    for entry in entries {
      guard LocalFolderStore.isValidComponent(entry.name) else { continue }
      let isDirectory: Bool
      if let known = entry.isDirectory {
        isDirectory = known
      } else {
        let path = directory + "/" + String(decoding: entry.name, as: UTF8.self)
        guard let known = Posix.isDirectory(path) else { continue }
        isDirectory = known
      }
      var key = relative + entry.name
      if isDirectory { key.append(0x2F) }
      guard isRelevant(key, isDirectory: isDirectory) else { continue }
      candidates.append(Candidate(sortKey: key, name: entry.name, isDirectory: isDirectory))
    }
    candidates.sort { Bytes.less($0.sortKey, $1.sortKey) }
    for candidate in candidates {
      guard let name = String(validating: candidate.name, as: UTF8.self) else { continue }
      let path = directory + "/" + name
      if candidate.isDirectory {
        if try walk(directory: path, relative: candidate.sortKey) { return true }
      } else {
        guard candidate.sortKey.count <= LocalFolderStore.maxKeyLength,
          let key = String(validating: candidate.sortKey, as: UTF8.self),
          let object = try? store.openObject(path: path, key: key)
        else { continue }
        object.close()
        found.append(object.info)
        if found.count >= wanted { return true }
      }
    }
    return false
  }

  /// Whether a file key, or a directory's key prefix, can hold keys that match the prefix and
  /// sort after `after`.
  private func isRelevant(_ key: [UInt8], isDirectory: Bool) -> Bool {
    if isDirectory {
      guard Bytes.hasPrefix(key, prefix) || Bytes.hasPrefix(prefix, key) else { return false }
      if let after, Bytes.compare(key, after) <= 0 {
        // Every key under `key` is ≤ `after` unless `after` itself lies under it.
        return Bytes.hasPrefix(after, key)
      }
      return true
    }
    guard Bytes.hasPrefix(key, prefix) else { return false }
    if let after { return Bytes.less(after, key) }
    return true
  }
}
