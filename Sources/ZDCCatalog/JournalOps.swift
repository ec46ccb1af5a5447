import Foundation
import ZDCCore

/// A change a journaled unit of work made through the public cloud-transaction API, with what
/// it takes to make it again on the same catalog state (see ``RedoJournal``). Replaying goes
/// through the same API, so the push operations, caches and checks follow as they did.
enum JournalOp {
  /// `createNode`: the node as stored (its id, keys, cloudID and dirPrefix included, so the
  /// replayed node is the same one).
  case create(Node)
  /// `updateNode`: the node's attributes as stored.
  case update(Node)
  case move(NodeID, parent: NodeID, name: String)
  case delete(NodeID)
  case setTag(NodeID, identifier: String, value: TagValue?)
  case queueDataUpload(NodeID)
  /// `commitData`: the content's size and mtime (`nil`: unchanged).
  case commitData(NodeID, size: UInt64, mtime: FileTime?)

  /// False for the records that hold nothing the catalog seals (node ids, a size, a time:
  /// columns the catalog stores as they are), which are written unsealed: sealing one cost a
  /// tenth of a file's close.
  var needsSeal: Bool {
    switch self {
    case .delete, .queueDataUpload, .commitData: false
    case .create, .update, .move, .setTag: true
    }
  }

  enum Kind: UInt8 {
    case create = 1
    case update = 2
    case move = 3
    case delete = 4
    case setTag = 5
    case queueDataUpload = 6
    case commitData = 7
  }
}

extension CloudTransaction {
  /// Opens a journaled mutation: changes made inside it by other public mutators are part of
  /// it, not journaled on their own. Pair with ``endJournaled(_:)``.
  func beginJournaled() throws {
    if isReadOnly { throw CatalogError.invalidOperation("read-only transaction") }
    journalDepth += 1
  }

  /// Closes a journaled mutation; when it is the outermost one of a journaled unit of work, `op`
  /// (made only then) is recorded.
  func endJournaled(_ op: @autoclosure () -> JournalOp?) throws {
    journalDepth -= 1
    guard journalDepth == 0, journalRecords != nil, let op = op() else { return }
    let record = try encode(op)
    journalRecords!.append(op.needsSeal ? try fields.sealRecord(record) : record)
  }

  /// Leaves a journaled mutation that failed (nothing recorded).
  func abandonJournaled() { journalDepth -= 1 }

  /// Runs `body` as a journaled mutation recording `op(result)` when it succeeds.
  func journaled<T>(_ body: () throws -> T, _ op: (T) -> JournalOp?) throws -> T {
    try beginJournaled()
    let result: T
    do { result = try body() } catch {
      abandonJournaled()
      throw error
    }
    try endJournaled(op(result))
    return result
  }

  // MARK: Coding

  func encode(_ op: JournalOp) throws -> Data {
    var w = JournalWriter()
    switch op {
    case .create(let n):
      w.u8(JournalOp.Kind.create.rawValue)
      try encodeNode(n, &w)
    case .update(let n):
      w.u8(JournalOp.Kind.update.rawValue)
      try encodeNode(n, &w)
    case .move(let id, let parent, let name):
      w.u8(JournalOp.Kind.move.rawValue)
      w.i64(id)
      w.i64(parent)
      w.string(name)
    case .delete(let id):
      w.u8(JournalOp.Kind.delete.rawValue)
      w.i64(id)
    case .setTag(let id, let identifier, let value):
      w.u8(JournalOp.Kind.setTag.rawValue)
      w.i64(id)
      w.string(identifier)
      switch value {
      case nil: w.u8(0)
      case .string(let s)?:
        w.u8(1)
        w.string(s)
      case .int(let i)?:
        w.u8(2)
        w.i64(i)
      case .data(let d)?:
        w.u8(3)
        w.data(d)
      }
    case .queueDataUpload(let id):
      w.u8(JournalOp.Kind.queueDataUpload.rawValue)
      w.i64(id)
    case .commitData(let id, let size, let mtime):
      w.u8(JournalOp.Kind.commitData.rawValue)
      w.i64(id)
      w.u64(size)
      w.optional(mtime) { $0.i64($1.totalNanoseconds) }
    }
    return Data(w.buffer)
  }

  func decodeOp(_ data: Data) throws -> JournalOp {
    var r = JournalReader(data)
    func bad() -> CatalogError { CatalogError.corrupt("journal record") }
    guard let raw = r.u8(), let kind = JournalOp.Kind(rawValue: raw) else { throw bad() }
    let op: JournalOp
    switch kind {
    case .create: op = .create(try decodeNode(&r))
    case .update: op = .update(try decodeNode(&r))
    case .move:
      guard let id = r.i64(), let parent = r.i64(), let name = r.string() else { throw bad() }
      op = .move(id, parent: parent, name: name)
    case .delete:
      guard let id = r.i64() else { throw bad() }
      op = .delete(id)
    case .setTag:
      guard let id = r.i64(), let identifier = r.string(), let t = r.u8() else { throw bad() }
      let value: TagValue?
      switch t {
      case 0: value = nil
      case 1:
        guard let s = r.string() else { throw bad() }
        value = .string(s)
      case 2:
        guard let i = r.i64() else { throw bad() }
        value = .int(i)
      case 3:
        guard let d = r.data() else { throw bad() }
        value = .data(d)
      default: throw bad()
      }
      op = .setTag(id, identifier: identifier, value: value)
    case .queueDataUpload:
      guard let id = r.i64() else { throw bad() }
      op = .queueDataUpload(id)
    case .commitData:
      guard let id = r.i64(), let size = r.u64(), let mtime = r.optional({ $0.i64() }) else {
        throw bad()
      }
      op = .commitData(id, size: size, mtime: mtime.map(FileTime.init(totalNanoseconds:)))
    }
    guard r.atEnd else { throw bad() }
    return op
  }

  private func encodeNode(_ n: Node, _ w: inout JournalWriter) throws {
    w.i64(n.id)
    w.string(n.uuid)
    w.string(n.localUserID)
    w.optional(n.parentID) { $0.i64($1) }
    w.string(n.name)
    w.string(n.kind.rawValue)
    w.optional(n.trunk?.rawValue) { $0.string($1) }
    w.string(try shareListJSON(n.shareList))
    w.optional(n.burnDate?.timeIntervalSinceReferenceDate) { $0.f64($1) }
    w.data(n.encryptionKey)
    w.data(n.dirSalt)
    w.string(n.dirPrefix)
    w.string(n.cloudID)
    w.optional(n.eTagRcrd) { $0.string($1) }
    w.optional(n.eTagData) { $0.string($1) }
    w.optional(n.lastModifiedRcrd?.timeIntervalSinceReferenceDate) { $0.f64($1) }
    w.optional(n.lastModifiedData?.timeIntervalSinceReferenceDate) { $0.f64($1) }
    w.optional(try n.cloudDataInfo.map { try json($0) }) { $0.string($1) }
    w.optional(n.explicitCloudName) { $0.string($1) }
    w.optional(try n.anchor.map { try json($0) }) { $0.string($1) }
    w.optional(n.pointeeID) { $0.i64($1) }
    w.u32(n.mode)
    w.i64(n.mtime.totalNanoseconds)
    w.u32(UInt32(n.xattrs.count))
    for (k, v) in n.xattrs.sorted(by: { $0.key < $1.key }) {
      w.string(k)
      w.data(v)
    }
    w.optional(n.symlinkTarget) { $0.string($1) }
    w.u64(n.dataSize)
  }

  private func decodeNode(_ r: inout JournalReader) throws -> Node {
    func bad() -> CatalogError { CatalogError.corrupt("journal node record") }
    func date(_ v: Double??) throws -> Date? {
      guard let v else { throw bad() }
      return v.map(Date.init(timeIntervalSinceReferenceDate:))
    }
    guard let id = r.i64(), let uuid = r.string(), let localUserID = r.string(),
      let parentID = r.optional({ $0.i64() }), let name = r.string(),
      let kindRaw = r.string(), let kind = NodeKind(rawValue: kindRaw),
      let trunkRaw = r.optional({ $0.string() }), let shareJSON = r.string()
    else { throw bad() }
    let burnDate = try date(r.optional { $0.f64() })
    guard let encryptionKey = r.data(), let dirSalt = r.data(), let dirPrefix = r.string(),
      let cloudID = r.string(), let eTagRcrd = r.optional({ $0.string() }),
      let eTagData = r.optional({ $0.string() })
    else { throw bad() }
    let lastModifiedRcrd = try date(r.optional { $0.f64() })
    let lastModifiedData = try date(r.optional { $0.f64() })
    guard let infoJSON = r.optional({ $0.string() }),
      let explicitCloudName = r.optional({ $0.string() }),
      let anchorJSON = r.optional({ $0.string() }), let pointeeID = r.optional({ $0.i64() }),
      let mode = r.u32(), let mtime = r.i64(), let xattrCount = r.u32()
    else { throw bad() }
    var xattrs: [String: Data] = [:]
    for _ in 0..<xattrCount {
      guard let k = r.string(), let v = r.data() else { throw bad() }
      xattrs[k] = v
    }
    guard let symlinkTarget = r.optional({ $0.string() }), let dataSize = r.u64() else {
      throw bad()
    }
    let shareList = try decodeShareList(shareJSON)
    return Node(
      id: id, uuid: uuid, localUserID: localUserID, parentID: parentID, name: name, kind: kind,
      trunk: trunkRaw.flatMap(Trunk.init(rawValue:)), shareList: shareList, burnDate: burnDate,
      encryptionKey: encryptionKey, dirSalt: dirSalt, dirPrefix: dirPrefix, cloudID: cloudID,
      eTagRcrd: eTagRcrd, eTagData: eTagData, lastModifiedRcrd: lastModifiedRcrd,
      lastModifiedData: lastModifiedData,
      cloudDataInfo: try infoJSON.map { try CloudDataInfoCodec.decode($0, decoder) },
      explicitCloudName: explicitCloudName,
      anchor: try anchorJSON.map { try decoder.decode(NodeAnchor.self, from: Data($0.utf8)) },
      pointeeID: pointeeID, mode: mode, mtime: FileTime(totalNanoseconds: mtime), xattrs: xattrs,
      symlinkTarget: symlinkTarget, dataSize: dataSize)
  }

  // MARK: Replay

  /// Makes a recorded change again (journal replay; this transaction is not journaled).
  func replay(_ record: Data) throws {
    switch try decodeOp(try fields.openRecord(record)) {
    case .create(let node):
      _ = try createNode(node, id: node.id)
    case .update(let recorded):
      var n = try existingNode(id: recorded.id)
      n.kind = recorded.kind
      n.shareList = recorded.shareList
      n.burnDate = recorded.burnDate
      n.anchor = recorded.anchor
      n.pointeeID = recorded.pointeeID
      n.mode = recorded.mode
      n.mtime = recorded.mtime
      n.xattrs = recorded.xattrs
      n.symlinkTarget = recorded.symlinkTarget
      n.dataSize = recorded.dataSize
      _ = try updateNode(n)
    case .move(let id, let parent, let name):
      _ = try moveNode(id, toParent: parent, name: name)
    case .delete(let id):
      try deleteNode(id)
    case .setTag(let id, let identifier, let value):
      try setTag(value, forNodeID: id, identifier: identifier)
    case .queueDataUpload(let id):
      _ = try queueDataUpload(nodeID: id)
    case .commitData(let id, let size, let mtime):
      _ = try commitData(nodeID: id, size: size, mtime: mtime)
    }
  }
}
