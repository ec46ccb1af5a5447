public import ZDCCore

/// Errors of the catalog and its cloud transactions.
public enum CatalogError: Error, Sendable, Equatable, CustomStringConvertible {
  /// No local user with this userID.
  case userNotFound(String)
  /// A local user with this userID already exists.
  case userExists(String)
  /// A node along the path, or the given parent, does not exist.
  case parentNotFound(TreesystemPath)
  /// No node with this id (for this local user).
  case nodeNotFound(NodeID)
  /// No node at this path.
  case pathNotFound(TreesystemPath)
  /// A sibling already holds a name with the same `NameKey`.
  case nameTaken(parentID: NodeID, name: String, existingID: NodeID)
  /// The parent cannot have children (a symlink).
  case notADirectory(NodeID)
  /// The move would put a node under itself or one of its descendants.
  case cycle(nodeID: NodeID, newParentID: NodeID)
  /// The node is already linked to another key, or the key to another node.
  case alreadyLinked(nodeID: NodeID, collection: String, key: String)
  /// No push operation with this id (or not in the expected state).
  case operationNotFound(Int64)
  /// A request the catalog refuses, with a reason.
  case invalidOperation(String)
  /// A stored value could not be decoded.
  case corrupt(String)
  /// A failure injected by a test failpoint.
  case injectedFailure(String)
  /// The disk holding the catalog is full (or over quota): the transaction was rolled back.
  case outOfSpace
  /// The catalog's sensitive fields are sealed and it was opened without their key.
  case locked

  /// Never a node's name: descriptions reach the log, which holds no plaintext name.
  public var description: String {
    switch self {
    case .userNotFound(let u): return "no local user \(u)"
    case .userExists(let u): return "local user \(u) already exists"
    case .parentNotFound(let p): return "parent not found (a path of \(p.components.count) names)"
    case .nodeNotFound(let id): return "no node \(id)"
    case .pathNotFound(let p): return "no node at a path of \(p.components.count) names"
    case .nameTaken(let parent, let name, let existing):
      return "a name of \(name.utf8.count) bytes is taken in \(parent) by node \(existing)"
    case .notADirectory(let id): return "node \(id) cannot have children"
    case .cycle(let id, let parent): return "cannot move node \(id) under its descendant \(parent)"
    case .alreadyLinked(let id, let c, let k):
      return "node \(id) or key \(c)/\(k) is already linked"
    case .operationNotFound(let id): return "no push operation \(id)"
    case .invalidOperation(let m): return "invalid operation: \(m)"
    case .corrupt(let m): return "corrupt catalog: \(m)"
    case .injectedFailure(let f): return "injected failure at \(f)"
    case .outOfSpace: return "no space left on the disk holding the catalog"
    case .locked: return "the catalog is sealed and was opened without its key"
    }
  }
}
