import Foundation
import Testing
import ZDCCatalog
import ZDCCore
import ZDCCrypto
import ZDCLocalStore
import ZDCSync
import ZDCTestSupport

/// The seeds of a randomized test: `first...first+count-1`, or, with `ZDC_RANDOM_SEEDS` set in
/// the environment, that many (a number) or those (a comma-separated list, offset by `first-1`);
/// with `ZDC_RANDOM_SEED` set, exactly those seeds (comma-separated, not offset) to replay a
/// failure.
func randomSeeds(first: UInt64, count: UInt64) -> [UInt64] {
  if let exact = ProcessInfo.processInfo.environment["ZDC_RANDOM_SEED"] {
    return exact.split(separator: ",").compactMap { UInt64($0) }
  }
  guard let spec = ProcessInfo.processInfo.environment["ZDC_RANDOM_SEEDS"] else {
    return Array(first..<first + count)
  }
  if spec.contains(","), case let list = spec.split(separator: ",").compactMap({ UInt64($0) }) {
    return list.map { first - 1 + $0 }
  }
  return Array(first..<first + (UInt64(spec) ?? count))
}

@Suite(.serialized, .motoServer) struct RandomizedTests {
  /// Two devices edit one tree at random (creates, edits, moves, deletes, concurrent edits of
  /// the same files), syncing at random moments; afterwards both hold the same tree and bytes.
  @Test(arguments: randomSeeds(first: 1, count: 12))
  func twoDevicesConvergeAfterRandomEdits(seed: UInt64) throws {
    try randomEdits(seed: seed, faults: false)
  }

  /// The same on S3 (moto), with fewer seeds.
  @Test(arguments: Array(1...4) as [UInt64])
  func twoDevicesConvergeAfterRandomEditsOnS3(seed: UInt64) throws {
    try randomEdits(seed: seed, faults: false, kind: .s3)
  }

  /// The same with a store that fails, delays and answers spurious 412s meanwhile (a
  /// divergence fails the test; sweeps of thousands of seeds: see the ZDCSync documentation).
  @Test(arguments: randomSeeds(first: 101, count: 6))
  func twoDevicesConvergeAfterRandomEditsOnAFaultyStore(seed: UInt64) throws {
    try randomEdits(seed: seed, faults: true)
  }

  /// The same on S3 (moto) with faults injected in front of it, with fewer seeds.
  @Test(arguments: randomSeeds(first: 101, count: 2))
  func twoDevicesConvergeAfterRandomEditsOnAFaultyS3Store(seed: UInt64) throws {
    try randomEdits(seed: seed, faults: true, kind: .s3)
  }

  func randomEdits(seed: UInt64, faults: Bool, kind: StoreKind = .local) throws {
    let backing = try kind.make("zdc-sync-random")
    let inner = backing.store
    let user = try TestUser()
    // Every call as it reached the store, and as each device saw it: printed for the nodes
    // that diverge.
    let trace = StoreTrace(user: user)
    let faulty = FaultInjectingStore(
      TracingStore(inner, device: "store", trace: trace), seed: seed)
    let devices = [
      try Device("alpha", user: user, store: TracingStore(faulty, device: "alpha", trace: trace)),
      try Device("beta", user: user, store: TracingStore(faulty, device: "beta", trace: trace)),
    ]
    for d in devices { try d.start() }
    try devices[0].create("shared", kind: .directory)
    for i in 0..<4 { try devices[0].create("shared/s\(i).txt", "shared \(i)") }
    try devices[0].sync()
    try devices[1].sync()
    if faults {
      faulty.inject(
        [.transientBefore, .transientAfter, .preconditionFailed, .delay(0.002)],
        into: [.put, .delete, .copy, .head, .get], rate: 0.1)
      faulty.inject([.partialList, .transientBefore], into: [.list], rate: 0.1)
    }
    var rng = SplitMix64(seed: seed)
    var actions: [String] = []
    func act(_ s: String) { actions.append("\(Date().timeIntervalSince1970) \(s)") }
    func pick<T>(_ a: [T]) -> T? { a.isEmpty ? nil : a[Int(rng.next() % UInt64(a.count))] }
    for step in 0..<60 {
      let d = devices[Int(rng.next() % 2)]
      let tree = try d.tree(withContent: false)
      let files = tree.filter { $0.value != "dir" }.map(\.key).sorted()
      let dirs = [""] + tree.filter { $0.value == "dir" }.map(\.key).sorted()
      let roll = rng.next() % 100
      let trace = ProcessInfo.processInfo.environment["ZDC_TRACE"] != nil
      do {
        switch roll {
        case 0..<25:
          let parent = pick(dirs)!
          act("\(step) \(d.name) create \(parent)/\(d.name)-f\(step).txt")
          try d.create("\(parent)/\(d.name)-f\(step).txt".trimmingPrefixSlash, "v\(step)")
        case 25..<35:
          let parent = pick(dirs)!
          try d.create("\(parent)/\(d.name)-d\(step)".trimmingPrefixSlash, kind: .directory)
        case 35..<65:
          if let f = pick(files) {
            act("\(step) \(d.name) write \(f)")
            try d.write(f.trimmingPrefixSlash, "\(d.name) edit \(step)")
          }
        case 65..<78:
          if let f = pick(files), let parent = pick(dirs) {
            act("\(step) \(d.name) move \(f) to \(parent)/\(d.name)-m\(step).txt")
            try d.move(
              f.trimmingPrefixSlash, to: "\(parent)/\(d.name)-m\(step).txt".trimmingPrefixSlash)
          }
        case 78..<86:
          if let f = pick(files) {
            act("\(step) \(d.name) delete \(f)")
            try d.delete(f.trimmingPrefixSlash)
          }
        default:
          act("\(step) \(d.name) sync")
          if faults {
            _ = try? d.engine.pull.pull()
          } else {
            try d.sync()
          }
        }
        if trace { print("step \(step) \(d.name) roll \(roll) files \(files.count)") }
      } catch let e as CatalogError {
        // A node that moved or vanished under the script: fine.
        _ = e
      }
    }
    faulty.heal()
    for _ in 0..<3 {
      for d in devices {
        do {
          try d.sync(faults ? 30 : 60)
        } catch let e as SyncTimeout {
          // The store calls about the nodes whose operations never completed.
          let stuck = try d.catalog.read(user.userID) { tx in
            try Set(tx.allOperations().compactMap(\.cloudID))
          }
          for c in stuck where !c.isEmpty {
            print("store calls for cid=\(c.prefix(6)) (stuck on \(d.name)):")
            for l in trace.lines(forCloudID: c) { print("  \(l)") }
          }
          for a in actions { print("  act \(a)") }
          throw e
        }
      }
    }
    let ta = try devices[0].tree()
    let tb = try devices[1].tree()
    #expect(ta == tb)
    if ta != tb {
      for k in Set(ta.keys).union(tb.keys).sorted() where ta[k] != tb[k] {
        print("differs \(k): alpha \(ta[k] ?? "-") beta \(tb[k] ?? "-")")
        var cloudIDs: [String] = []
        for v in [ta[k], tb[k]] {
          guard let v, let r = v.range(of: "cid=") else { continue }
          cloudIDs.append(String(v[r.upperBound...]))
        }
        // A node one device has and the other has not (or shows without content): its calls.
        for d in devices {
          if let n = try d.node(String(k.dropFirst())) { cloudIDs.append(n.cloudID) }
        }
        var printed = Set<String>()
        for c in cloudIDs where printed.insert(String(c.prefix(6))).inserted {
          print("store calls for cid=\(c.prefix(6)):")
          for l in trace.lines(forCloudID: c) { print("  \(l)") }
        }
        let name = String(k.split(separator: "/").last!)
        for d in devices {
          for e in d.delegate.events where e.contains(name) { print("  \(d.name): \(e)") }
        }
        for a in actions where a.contains(name) || a.hasSuffix("sync") { print("  action \(a)") }
      }
    }
    // Every file's size is the size of its content, on both devices.
    for d in devices {
      for p in try d.tree(withContent: false).filter({ $0.value == "file" }).map(\.key) {
        let n = try #require(try d.node(String(p.dropFirst())))
        let content = try? d.cloudContent(n)  // undecryptable: shown by the trees above
        #expect(n.dataSize == UInt64(content?.count ?? 0), "\(d.name): size of \(p)")
        if n.dataSize != UInt64(content?.count ?? 0) {
          // The short explanation first (a CI log keeps the head and the tail of the output):
          // the script, what each device was told about the node's names, its store calls.
          let names = namesHeld(by: String(p.split(separator: "/").last!), actions: actions)
          print("\(d.name): \(p) (cid=\(n.cloudID.prefix(6))) once named \(names.sorted())")
          for a in actions { print("  act \(a)") }
          for e in devices {
            for v in e.delegate.events where names.contains(where: v.contains) {
              print("  \(e.name): \(v)")
            }
          }
          print("store calls for \(p) as each device made them:")
          for l in trace.lines(forCloudID: n.cloudID) where !l.contains(" store ") {
            print("  \(l)")
          }
        }
      }
    }
    let rcrds = try inner.listAll(prefix: "\(user.userID)/").filter { $0.key.hasSuffix(".rcrd") }
    #expect(rcrds.count == ta.count)
    if rcrds.count != ta.count {
      for r in rcrds {
        let data = try inner.get(key: r.key)
        guard let dec = try? Rcrd.decode(data, userID: user.userID, keyPair: user.keys) else {
          print("orphan? undecodable \(r.key)")
          continue
        }
        for d in devices {
          let info = try d.catalog.read(user.userID) { tx -> String in
            guard let n = try tx.node(cloudID: dec.cloudID) else { return "no node" }
            let loc = try tx.objectLocation(of: n.id)
            return "\(try tx.path(of: n.id)) at \(loc?.rcrdKey == r.key ? "this key" : "other key")"
          }
          if !info.hasSuffix("this key") {
            print("extra RCRD \(dec.meta.name) \(dec.cloudID.prefix(6)) on \(d.name): \(info)")
          }
        }
        print("store calls for cid=\(dec.cloudID.prefix(6)):")
        for l in trace.lines(forCloudID: dec.cloudID) { print("  \(l)") }
      }
      for a in actions { print("  act \(a)") }
    }
    for d in devices {
      #expect(try d.operationCount() == 0)
      d.engine.stop()
    }
  }
}

/// The names a file had, `name` last: the sources of the scripted moves that ended at one of
/// them (`actions` read from the end).
private func namesHeld(by name: String, actions: [String]) -> Set<String> {
  var names: Set<String> = [name]
  for a in actions.reversed() {
    // "<time> <step> <device> move <from> to <to>"
    let words = a.split(separator: " ").map(String.init)
    guard words.count == 7, words[3] == "move", words[5] == "to" else { continue }
    let to = words[6].split(separator: "/").last.map(String.init) ?? words[6]
    if names.contains(to), let from = words[4].split(separator: "/").last {
      names.insert(String(from))
    }
  }
  return names
}

extension String {
  fileprivate var trimmingPrefixSlash: String { hasPrefix("/") ? String(dropFirst()) : self }
}
