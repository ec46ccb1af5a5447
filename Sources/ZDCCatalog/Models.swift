public import Foundation
public import ZDCCore

/// A user whose treesystem this catalog holds; one catalog may hold several.
public struct LocalUser: Sendable, Hashable {
  /// The userID (zBase32).
  public var id: String
  /// The treeID (application identifier) of the user's treesystem.
  public var treeID: String
  /// The user's X25519 public key.
  public var boxPublicKey: Data
  /// The user's Ed25519 public key.
  public var signPublicKey: Data
  /// When the user was added to this catalog.
  public var createdAt: Date
  /// Free-form settings, a JSON document (an object, `{}` when empty).
  public var settings: Data

  public init(
    id: String, treeID: String, boxPublicKey: Data, signPublicKey: Data,
    createdAt: Date = Date(), settings: Data = Data("{}".utf8)
  ) {
    self.id = id
    self.treeID = treeID
    self.boxPublicKey = boxPublicKey
    self.signPublicKey = signPublicKey
    self.createdAt = createdAt
    self.settings = settings
  }

  /// Where the user's objects live in a store.
  public var layout: CloudLayout { CloudLayout(userID: id, treeID: treeID) }
}

/// The value of a node tag.
public enum TagValue: Sendable, Hashable {
  /// A string.
  case string(String)
  /// A 64-bit integer.
  case int(Int64)
  /// Bytes.
  case data(Data)
}

/// Where a push operation stands.
public enum PushOperationState: String, Sendable, Hashable, Codable {
  /// Waiting for its dependencies, its retry time or a free upload slot.
  case pending
  /// Taken by the push manager and being executed.
  case inFlight
}

/// One object pair (RCRD and DATA) of a node in the cloud.
public struct CloudObjectRef: Sendable, Hashable, Codable {
  /// The local node id (may no longer exist).
  public var nodeID: NodeID
  /// The node's cloudID.
  public var cloudID: String
  /// The dirPrefix of the node's parent: where the objects live.
  public var dirPrefix: String
  /// The node's cloudName there.
  public var cloudName: String
  /// The full key of the RCRD object.
  public var rcrdKey: String
  /// The full key of the DATA object (which may not exist).
  public var dataKey: String
  /// The last known eTag of the RCRD object, if known.
  public var eTagRcrd: String?
  /// The last known eTag of the DATA object, if known.
  public var eTagData: String?

  public init(
    nodeID: NodeID, cloudID: String, dirPrefix: String, cloudName: String, rcrdKey: String,
    dataKey: String, eTagRcrd: String? = nil, eTagData: String? = nil
  ) {
    self.nodeID = nodeID
    self.cloudID = cloudID
    self.dirPrefix = dirPrefix
    self.cloudName = cloudName
    self.rcrdKey = rcrdKey
    self.dataKey = dataKey
    self.eTagRcrd = eTagRcrd
    self.eTagData = eTagData
  }
}

/// The kind-specific arguments of a push operation, stored as JSON.
public struct PushPayload: Sendable, Hashable, Codable {
  /// For `move`: where the node's objects were before the first of the coalesced moves. For a
  /// first `putRcrd` of a node that keeps DATA found at its keys (uploaded again after a remote
  /// delete) and was moved before the upload: where that DATA is, to be carried along.
  public var origin: CloudObjectRef?
  /// For `deleteLeaf` / `deleteNode`: every object of the deleted subtree known to be (or
  /// possibly be) in the cloud, root first.
  public var objects: [CloudObjectRef]?
  /// For `deleteNode`: the dirPrefixes of the deleted subtree's nodes, root first, for listing
  /// objects this device never knew about.
  public var dirPrefixes: [String]?
  /// For `move`: target locations an attempt of this move wrote to (its RCRD, a copy of its
  /// DATA) before the node went elsewhere; whoever drops the move deletes what is still there.
  public var written: [CloudObjectRef]?

  public init(
    origin: CloudObjectRef? = nil, objects: [CloudObjectRef]? = nil, dirPrefixes: [String]? = nil,
    written: [CloudObjectRef]? = nil
  ) {
    self.origin = origin
    self.objects = objects
    self.dirPrefixes = dirPrefixes
    self.written = written
  }
}

/// A persistent push operation (DESIGN §4).
public struct PushOperation: Sendable, Hashable, Identifiable {
  /// Queue order; never reused.
  public var id: Int64
  /// The local user whose tree it changes.
  public var localUserID: String
  /// What to do.
  public var kind: PushOperationKind
  /// The node concerned (for deletes, the deleted subtree's root, which no longer exists).
  public var nodeID: NodeID?
  /// The cloudID of that node.
  public var cloudID: String?
  /// Kind-specific arguments.
  public var payload: PushPayload
  /// Pending or in flight.
  public var state: PushOperationState
  /// Failed attempts so far.
  public var attempts: Int
  /// Not to be started before this time.
  public var nextAttemptAt: Date
  /// When the operation was queued, or last coalesced with a newer change.
  public var createdAt: Date
  /// Bumped each time a newer change is coalesced into this pending operation.
  public var generation: Int64
  /// Opaque resume state of a multipart upload (JSON), owned by the push manager.
  public var multipartState: Data?
}
