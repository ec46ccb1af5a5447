import Foundation
import Testing
@_spi(Testing) import ZDCCatalog
import ZDCCore

@Suite struct OperationTests {
  @Test func createEnqueuesPutRcrdWaitingForParentsFirstUpload() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let b = try tx.createNode(path: p("a", "b"))
      let opA = try #require(try tx.pendingOperations(forNodeID: a.id).first)
      let opB = try #require(try tx.pendingOperations(forNodeID: b.id).first)
      #expect(opA.kind == .putRcrd && opB.kind == .putRcrd)
      #expect(opA.cloudID == a.cloudID)
      #expect(opA.state == .pending && opA.attempts == 0)
      #expect(try tx.dependencies(ofOperation: opA.id) == [])  // parent is the home trunk
      #expect(try tx.dependencies(ofOperation: opB.id) == [opA.id])
      #expect(try tx.readyOperations(limit: 10).map(\.id) == [opA.id])
      #expect(try tx.isDirty(nodeID: a.id) && tx.isDirty(nodeID: b.id))

      // In flight, the child still waits; completed, the child is released.
      try tx.markInFlight(opA.id)
      #expect(throws: CatalogError.operationNotFound(opA.id)) { try tx.markInFlight(opA.id) }
      #expect(try tx.readyOperations(limit: 10).isEmpty)
      let c = try tx.createNode(path: p("a", "c"))
      let opC = try #require(try tx.pendingOperations(forNodeID: c.id).first)
      #expect(try tx.dependencies(ofOperation: opC.id) == [opA.id])
      try tx.completeAsUploaded(try tx.operation(id: opA.id)!)
      #expect(try tx.readyOperations(limit: 10).map(\.id) == [opB.id, opC.id])
      #expect(try tx.readyOperations(limit: 1).map(\.id) == [opB.id])
      #expect(!(try tx.isDirty(nodeID: a.id)))

      // Once the parent is uploaded, new children do not wait.
      let d = try tx.createNode(path: p("a", "d"))
      let opD = try #require(try tx.pendingOperations(forNodeID: d.id).first)
      #expect(try tx.dependencies(ofOperation: opD.id) == [])
      #expect(try tx.operationCount() == 3)
    }
  }

  @Test func failRetryAndReset() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"))
      let op = try #require(try tx.readyOperations(limit: 1).first)
      try tx.markInFlight(op.id)
      let later = Date().addingTimeInterval(60)
      try tx.failOperation(id: op.id, retryAt: later)
      let failed = try #require(try tx.operation(id: op.id))
      #expect(failed.state == .pending && failed.attempts == 1)
      #expect(try tx.readyOperations(limit: 10).isEmpty)
      #expect(try tx.readyOperations(limit: 10, now: later).map(\.id) == [op.id])
      try tx.markInFlight(op.id)
      #expect(try tx.resetInFlightOperations() == 1)
      #expect(try tx.operation(id: op.id)?.state == .pending)
      #expect(try tx.operationUploadState(id: op.id) == nil)
      try tx.setMultipartState(Data(#"{"uploadID":"u"}"#.utf8), forOperation: op.id)
      #expect(try tx.operation(id: op.id)?.multipartState == Data(#"{"uploadID":"u"}"#.utf8))
      // The lean reads of the push agree with the whole operation.
      #expect(try tx.operationUploadState(id: op.id) == Data(#"{"uploadID":"u"}"#.utf8))
      #expect(try tx.operationGeneration(id: op.id) == tx.operation(id: op.id)?.generation)
      #expect(try tx.operationExists(id: op.id))
      // An in-flight op whose node was deleted is dropped on failure.
      try tx.markInFlight(op.id)
      try tx.deleteNode(a.id)
      try tx.failOperation(id: op.id, retryAt: later)
      #expect(try tx.operation(id: op.id) == nil)
      #expect(try !tx.operationExists(id: op.id))
      #expect(try tx.operationGeneration(id: op.id) == nil)
      #expect(try tx.operationUploadState(id: op.id) == nil)
      #expect(throws: CatalogError.operationNotFound(op.id)) { try tx.completeOperation(id: op.id) }
    }
  }

  @Test func putDataCoalescesAndWaitsForFirstUpload() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let f = try tx.createNode(path: p("f"))
      let rcrd = try #require(try tx.pendingOperations(forNodeID: f.id).first)
      let id1 = try tx.queueDataUpload(nodeID: f.id)
      #expect(try tx.dependencies(ofOperation: id1) == [rcrd.id])
      let first = try #require(try tx.operation(id: id1))
      #expect(first.kind == .putData && first.generation == 0)
      let id2 = try tx.queueDataUpload(nodeID: f.id)
      let id3 = try tx.queueDataUpload(nodeID: f.id)
      #expect(id2 == id1 && id3 == id1)
      let bumped = try #require(try tx.operation(id: id1))
      #expect(bumped.generation == 2)
      #expect(try tx.operationGeneration(id: id1) == 2)
      #expect(bumped.createdAt >= first.createdAt)
      #expect(try tx.kinds(f.id) == [.putRcrd, .putData])

      // While one upload is in flight, a new change queues one more, after it.
      try tx.drainQueueUntil { $0.kind == .putRcrd }
      try tx.markInFlight(id1)
      let id4 = try tx.queueDataUpload(nodeID: f.id)
      #expect(id4 != id1)
      #expect(try tx.dependencies(ofOperation: id4) == [id1])
      #expect(try tx.queueDataUpload(nodeID: f.id) == id4)
      #expect(try tx.kinds(f.id) == [.putData, .putData])
      #expect(throws: CatalogError.self) { try tx.queueDataUpload(nodeID: tx.trunkNode(.home)!.id) }
      #expect(throws: CatalogError.nodeNotFound(777_777)) {
        try tx.queueDataUpload(nodeID: 777_777)
      }
    }
  }

  @Test func putRcrdCoalesces() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      var f = try tx.createNode(path: p("f"))
      f.mode = 0o600
      try tx.updateNode(f)
      f.mtime = FileTime(seconds: 1)
      try tx.updateNode(f)
      #expect(try tx.kinds(f.id) == [.putRcrd])  // coalesced into the pending first upload
      try tx.drainQueue()
      f = try tx.node(id: f.id)!
      #expect(try tx.operationCount() == 0)

      try tx.updateNode(f)  // no change: nothing
      #expect(try tx.operationCount() == 0)
      f.mode = 0o640
      try tx.updateNode(f)
      let op = try #require(try tx.pendingOperations(forNodeID: f.id).first)
      f.xattrs = ["user.k": Data([1])]
      try tx.updateNode(f)
      #expect(try tx.pendingOperations(forNodeID: f.id).map(\.id) == [op.id])
      #expect(try tx.dependencies(ofOperation: op.id) == [])  // uploaded node: no wait
      // In flight: the next change is a new op after it.
      try tx.markInFlight(op.id)
      f.mode = 0o644
      try tx.updateNode(f)
      let ops = try tx.pendingOperations(forNodeID: f.id)
      #expect(ops.map(\.kind) == [.putRcrd, .putRcrd])
      #expect(try tx.dependencies(ofOperation: ops[1].id) == [op.id])
    }
  }

  @Test func moveOfNeverUploadedNodeAddsNothing() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let f = try tx.createNode(path: p("f"))
      try tx.drainQueueUntil { $0.nodeID == a.id }
      let dir = try tx.createNode(path: p("a", "dir"), kind: .directory)  // never uploaded
      let dirOp = try #require(try tx.pendingOperations(forNodeID: dir.id).first)
      let fOp = try #require(try tx.pendingOperations(forNodeID: f.id).first)
      #expect(try tx.dependencies(ofOperation: fOp.id) == [])
      try tx.moveNode(f.id, toParent: dir.id, name: "g")
      try tx.moveNode(f.id, toParent: dir.id, name: "h")
      #expect(try tx.kinds(f.id) == [.putRcrd])
      // ...but its first upload now waits for the new parent's first upload.
      #expect(try tx.dependencies(ofOperation: fOp.id) == [dirOp.id])
      // Moved on to an uploaded parent, it no longer waits for the old one.
      try tx.moveNode(f.id, toParent: a.id, name: "h")
      #expect(try tx.kinds(f.id) == [.putRcrd])
      #expect(try tx.dependencies(ofOperation: fOp.id) == [])
    }
  }

  @Test func moveOfUploadedNode() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let b = try tx.createNode(path: p("b"), kind: .directory)
      let f = try tx.createNode(path: p("a", "f"))
      try tx.drainQueue()
      let origin = try #require(try tx.objectLocation(of: f.id))
      #expect(origin.eTagRcrd != nil)

      // First move: one move op carrying the old keys.
      try tx.moveNode(f.id, toParent: b.id, name: "g")
      var ops = try tx.pendingOperations(forNodeID: f.id)
      #expect(ops.map(\.kind) == [.move])
      let move = ops[0]
      #expect(move.payload.origin == origin)
      #expect(try tx.dependencies(ofOperation: move.id) == [])
      // Later changes run after the move.
      try tx.queueDataUpload(nodeID: f.id)
      var node = try tx.node(id: f.id)!
      node.mode = 0o600
      try tx.updateNode(node)
      ops = try tx.pendingOperations(forNodeID: f.id)
      #expect(ops.map(\.kind) == [.move, .putData, .putRcrd])
      // The lean reads of the push agree with the full operations.
      #expect(try tx.operationKinds(ofNodeID: f.id).map(\.id) == ops.map(\.id))
      #expect(try tx.operationKinds(ofNodeID: f.id).map(\.kind) == ops.map(\.kind))
      #expect(try tx.queuedMoveOrigin(ofNodeID: f.id) == origin)
      #expect(try tx.moveOperations().map(\.id) == [move.id])
      #expect(try tx.outstandingKinds(ofNodeID: f.id) == [.move, .putData, .putRcrd])
      #expect(try tx.dependencies(ofOperation: ops[1].id) == [move.id])
      #expect(try tx.dependencies(ofOperation: ops[2].id) == [move.id])

      // Second move into a never-uploaded dir: coalesced, oldest origin kept, waits for the dir.
      let c = try tx.createNode(path: p("c"), kind: .directory)
      let cOp = try #require(try tx.pendingOperations(forNodeID: c.id).first)
      try tx.moveNode(f.id, toParent: c.id, name: "h")
      ops = try tx.pendingOperations(forNodeID: f.id)
      #expect(ops.filter { $0.kind == .move }.map(\.id) == [move.id])
      #expect(try tx.operation(id: move.id)?.payload.origin == origin)
      #expect(try tx.dependencies(ofOperation: move.id) == [cOp.id])

      // Back to the origin: the move disappears, an RCRD upload remains.
      try tx.moveNode(f.id, toParent: a.id, name: "f")
      ops = try tx.pendingOperations(forNodeID: f.id)
      #expect(ops.map(\.kind) == [.putData, .putRcrd])
      #expect(try tx.queuedMoveOrigin(ofNodeID: f.id) == nil)
      #expect(try tx.dependencies(ofOperation: ops[0].id) == [])
    }
  }

  @Test func moveWaitsForInFlightOperations() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let b = try tx.createNode(path: p("b"), kind: .directory)
      let f = try tx.createNode(path: p("f"))
      try tx.drainQueueUntil { $0.nodeID == b.id }
      // f's first upload is in flight: it may land at the old keys, so a move is needed.
      let first = try #require(try tx.pendingOperations(forNodeID: f.id).first)
      let oldLoc = try #require(try tx.objectLocation(of: f.id))
      try tx.markInFlight(first.id)
      try tx.moveNode(f.id, toParent: b.id, name: "f")
      let ops = try tx.pendingOperations(forNodeID: f.id)
      #expect(ops.map(\.kind) == [.putRcrd, .move])
      #expect(ops[1].payload.origin?.rcrdKey == oldLoc.rcrdKey)
      #expect(try tx.dependencies(ofOperation: ops[1].id) == [first.id])
      // A case-only rename keeps the keys: an RCRD upload, no move.
      let g = try tx.createNode(path: p("b", "g"))
      try tx.drainQueueUntil { $0.nodeID == g.id }
      try tx.moveNode(g.id, toParent: b.id, name: "G")
      #expect(try tx.kinds(g.id) == [.putRcrd])
    }
  }

  @Test func deleteOfNeverUploadedSubtreeDropsEverything() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let f = try tx.createNode(path: p("a", "f"))
      try tx.queueDataUpload(nodeID: f.id)
      let keep = try tx.createNode(path: p("keep"))
      #expect(try tx.operationCount() == 4)
      try tx.deleteNode(a.id)
      #expect(try tx.allOperations().map(\.nodeID) == [keep.id])
      #expect(try tx.isDirty(nodeID: f.id) == false)
    }
  }

  @Test func deleteLeafOfUploadedNode() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let f = try tx.createNode(path: p("f"))
      try tx.queueDataUpload(nodeID: f.id)
      try tx.drainQueue()
      let loc = try #require(try tx.objectLocation(of: f.id))
      #expect(loc.eTagData != nil)
      var node = try tx.node(id: f.id)!
      node.mode = 0o600
      try tx.updateNode(node)  // pending putRcrd: superseded by the delete
      try tx.queueDataUpload(nodeID: f.id)
      try tx.deleteNode(f.id)
      let ops = try tx.allOperations()
      #expect(ops.map(\.kind) == [.deleteLeaf])
      #expect(ops[0].nodeID == f.id && ops[0].cloudID == f.cloudID)
      #expect(ops[0].payload.objects == [loc])
      #expect(try tx.dependencies(ofOperation: ops[0].id) == [])
    }
  }

  @Test func deleteNodeListsEveryCloudKey() throws {
    let catalog = try makeCatalog()
    try catalog.write("alice") { tx in
      let a = try tx.createNode(path: p("a"), kind: .directory)
      let b = try tx.createNode(path: p("a", "b"), kind: .directory)
      let c = try tx.createNode(path: p("a", "b", "c"))
      let d = try tx.createNode(path: p("a", "d"))
      try tx.queueDataUpload(nodeID: c.id)
      try tx.drainQueue()
      let uploaded = try [a, b, c, d].map { try #require(try tx.objectLocation(of: $0.id)) }
      // e: first upload in flight (may exist in the cloud); h: never uploaded (nothing to delete).
      let e = try tx.createNode(path: p("a", "e"))
      let eOp = try #require(try tx.pendingOperations(forNodeID: e.id).first)
      try tx.markInFlight(eOp.id)
      let eLoc = try #require(try tx.objectLocation(of: e.id))
      let h = try tx.createNode(path: p("a", "b", "h"))
      // d moved inside the subtree, move still pending: its objects are at the origin.
      try tx.moveNode(d.id, toParent: b.id, name: "d2")
      let dNow = try #require(try tx.objectLocation(of: d.id))
      try tx.queueDataUpload(nodeID: c.id)

      try tx.deleteNode(a.id)
      let ops = try tx.allOperations()
      #expect(ops.map(\.kind) == [.putRcrd, .deleteNode])  // e's in-flight op stays
      let del = ops[1]
      #expect(del.nodeID == a.id && del.cloudID == a.cloudID)
      #expect(try tx.dependencies(ofOperation: del.id) == [eOp.id])
      let objects = try #require(del.payload.objects)
      let keys = Set(objects.map(\.rcrdKey))
      #expect(objects.first?.rcrdKey == uploaded[0].rcrdKey)  // root first
      for loc in uploaded { #expect(keys.contains(loc.rcrdKey)) }
      #expect(keys.contains(eLoc.rcrdKey))
      #expect(keys.contains(dNow.rcrdKey))
      #expect(!keys.contains(tx.layout.rcrdKey(dirPrefix: b.dirPrefix, cloudName: "x")))
      #expect(objects.count == 6)  // a, b, c, d (origin + current), e; not h
      #expect(!objects.contains { $0.nodeID == h.id })
      let cRef = try #require(objects.first { $0.nodeID == c.id })
      #expect(cRef.dataKey == uploaded[2].dataKey && cRef.eTagData == uploaded[2].eTagData)
      #expect(Set(del.payload.dirPrefixes ?? []) == Set([a, b, c, d, e].map(\.dirPrefix)))

      // The in-flight op of a deleted node is dropped when it fails or on reset.
      #expect(try tx.resetInFlightOperations() == 1)
      #expect(try tx.allOperations().map(\.kind) == [.deleteNode])
      #expect(try tx.readyOperations(limit: 10).map(\.id) == [del.id])
    }
  }
}

extension CloudTransaction {
  /// Uploads ready operations until one matching `stop` has been uploaded.
  func drainQueueUntil(_ stop: (PushOperation) -> Bool) throws {
    while let op = try readyOperations(limit: 1, now: .distantFuture).first {
      try markInFlight(op.id)
      try completeAsUploaded(op)
      if stop(op) { return }
    }
  }
}
