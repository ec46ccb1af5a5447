public import Foundation
public import ZDCCatalog
public import ZDCCore

/// What the sync engine asks of, and tells, the application (the seeds' ZeroDarkCloudDelegate).
///
/// Discovery calls run inside the catalog transaction that applies the change, so the
/// application can update its own state atomically with it. Calls come from the engine's
/// worker threads, never from the caller of a public API.
public protocol SyncDelegate: AnyObject, Sendable {
  /// The content to upload for a node (nil: the node has no data, upload an empty data section).
  func data(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> NodeData?
  /// Whether the application holds a node's content in full, as `data(for:)` would give it,
  /// without preparing it for an upload (no side effects): asked before the engine gives a
  /// node a new identity (a new cloudID), which then asks `data(for:)` for its upload.
  func hasContent(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> Bool
  /// The engine is about to give a node a new identity (a new cloudID): the application makes
  /// sure that the content it holds for the node stays its content under the new one, for the
  /// upload that follows (content found by cloudID, such as a cache of downloads, must be
  /// kept by the node now).
  func willAssignNewCloudID(to node: Node, at path: TreesystemPath, transaction: CloudTransaction)
  /// The optional metadata section to upload with the data.
  func metadata(for node: Node, at path: TreesystemPath, transaction: CloudTransaction) -> NodeData?
  /// The optional thumbnail section to upload with the data.
  func thumbnail(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  /// A node's data reached the store.
  func didPushNodeData(_ node: Node, at path: TreesystemPath, transaction: CloudTransaction)

  /// A pull found a node that is new here.
  func didDiscoverNewNode(_ node: Node, at path: TreesystemPath, transaction: CloudTransaction)
  /// A pull found a node changed elsewhere.
  func didDiscoverModifiedNode(
    _ node: Node, change: NodeChange, at path: TreesystemPath, transaction: CloudTransaction)
  /// A pull found a node moved and/or renamed elsewhere.
  func didDiscoverMovedNode(
    _ node: Node, from oldPath: TreesystemPath, to newPath: TreesystemPath,
    transaction: CloudTransaction)
  /// A pull found a node deleted elsewhere; it is gone from the catalog after this call.
  func didDiscoverDeletedNode(
    _ node: Node, at path: TreesystemPath, timestamp: Date?, transaction: CloudTransaction)
  /// A node deleted elsewhere has local changes (itself or below): it is kept and re-uploaded.
  func didDiscoverDeletedDirtyNode(
    _ node: Node, dirtyDescendants: [NodeID], timestamp: Date?, transaction: CloudTransaction)
  /// The sync engine renamed a node in place to resolve a conflict of names (a numbered name,
  /// or a case variant); `oldName` is the name it had, which views of the tree should forget.
  func didRenameNode(_ node: Node, oldName: String, transaction: CloudTransaction)
  /// A conflict was resolved without losing either side; `other` is the node holding the
  /// other version where there is one (e.g. the conflicted copy).
  func didDiscoverConflict(
    _ kind: ConflictKind, node: Node, other: Node?, at path: TreesystemPath,
    transaction: CloudTransaction)

  /// Node IDs to pull first (e.g. what the user is looking at).
  func preferredNodeIDsForPulling() -> Set<NodeID>
}

extension SyncDelegate {
  public func hasContent(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> Bool
  { data(for: node, at: path, transaction: transaction) != nil }
  public func willAssignNewCloudID(
    to node: Node, at path: TreesystemPath, transaction: CloudTransaction
  ) {}
  public func metadata(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  { nil }
  public func thumbnail(for node: Node, at path: TreesystemPath, transaction: CloudTransaction)
    -> NodeData?
  { nil }
  public func didPushNodeData(_ node: Node, at path: TreesystemPath, transaction: CloudTransaction)
  {}
  public func didDiscoverDeletedDirtyNode(
    _ node: Node, dirtyDescendants: [NodeID], timestamp: Date?, transaction: CloudTransaction
  ) {}
  public func preferredNodeIDsForPulling() -> Set<NodeID> { [] }

  // Discoveries are notifications: the catalog is already updated when they arrive, so a
  // delegate that keeps no state of its own (a benchmark, a headless device) may ignore them.
  public func didDiscoverNewNode(
    _ node: Node, at path: TreesystemPath, transaction: CloudTransaction
  ) {}
  public func didDiscoverModifiedNode(
    _ node: Node, change: NodeChange, at path: TreesystemPath, transaction: CloudTransaction
  ) {}
  public func didDiscoverMovedNode(
    _ node: Node, from oldPath: TreesystemPath, to newPath: TreesystemPath,
    transaction: CloudTransaction
  ) {}
  public func didDiscoverDeletedNode(
    _ node: Node, at path: TreesystemPath, timestamp: Date?, transaction: CloudTransaction
  ) {}
  public func didDiscoverConflict(
    _ kind: ConflictKind, node: Node, other: Node?, at path: TreesystemPath,
    transaction: CloudTransaction
  ) {}
  public func didRenameNode(_ node: Node, oldName: String, transaction: CloudTransaction) {}
}
