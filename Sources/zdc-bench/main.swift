// zdc-bench: micro-benchmarks of the crypto formats (not tests; figures vary by machine).
//
//   zdc-bench cloudfile      AEAD, CloudFile and CryptoFile throughput on one core.
//   zdc-bench cryptofile [SHIFTS]
//                            CryptoFile throughput per chunk shift (comma-separated; default
//                            every supported one).
//   zdc-bench catalog [N]    µs per catalog transaction of each kind the mount uses.
//   zdc-bench read [FILES] [BIG_MIB]
//                            the engine's read path without the kernel: per-file open+read
//                            costs, sequential and random reads of a big file.
//   zdc-bench meta [N]       the engine's metadata path without the kernel: µs per call of
//                            each kind in N create/write/close/stat/rename/unlink iterations.
//   zdc-bench sync [SIZES]   incremental pull of 10 changes and first full pull on trees of
//                            SIZES nodes (comma-separated; default 1000,10000,100000).

import CSodium
import Foundation
import ZDCCatalog
import ZDCCore
import ZDCCrypto

let mib = 1 << 20
let chunk = 64 * 1024

func now() -> Double {
  var ts = timespec()
  clock_gettime(CLOCK_MONOTONIC, &ts)
  return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

/// Runs `body`, returns seconds.
func time(_ body: () throws -> Void) rethrows -> Double {
  let t0 = now()
  try body()
  return now() - t0
}

/// A new directory under the temporary directory (`TMPDIR`).
func scratchDirectory(_ prefix: String) throws -> URL {
  let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
    "\(prefix)-\(UUID().uuidString)")
  try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
  return dir
}

/// A catalog on disk in `dir` (sealed when given a field key, as the mount's is) with one
/// local user; returns it and the user's id.
func benchCatalog(in dir: URL, fieldKey: Data?) throws -> (Catalog, String) {
  let user = "benchuser"
  let catalog = try Catalog(
    path: dir.appendingPathComponent("catalog.sqlite").path,
    options: Catalog.Options(durability: .normal, fieldKey: fieldKey))
  try catalog.createLocalUser(
    LocalUser(
      id: user, treeID: "bench", boxPublicKey: SecureRandom.bytes(32),
      signPublicKey: SecureRandom.bytes(32)))
  return (catalog, user)
}

/// One line of a per-operation figure, in µs.
func line(_ what: String, perOp seconds: Double) {
  print(
    what.padding(toLength: 52, withPad: " ", startingAt: 0)
      + String(format: "%9.1f µs", seconds * 1e6))
}

func report(_ what: String, bytes: Int, seconds: Double) {
  let rate = Double(bytes) / Double(mib) / seconds
  print(
    what.padding(toLength: 52, withPad: " ", startingAt: 0)
      + String(format: "%9.1f MB/s  (%.2f s)", rate, seconds))
}

func reportOps(_ what: String, ops: Int, seconds: Double) {
  print(
    what.padding(toLength: 52, withPad: " ", startingAt: 0)
      + String(format: "%9.0f ops/s (%.2f s)", Double(ops) / seconds, seconds))
}

func rawAEAD() throws {
  let key = SecureRandom.nodeKey()
  let nonce = SecureRandom.bytes(24)
  let ad = Data(count: 33)
  let plain = SecureRandom.bytes(chunk)
  var sealed = Data(count: chunk + 16)
  var opened = Data(count: chunk)
  let rounds = 4096  // 256 MiB
  let enc = try time {
    try sealed.withUnsafeMutableBytes { out in
      try plain.withUnsafeBytes { p in
        try nonce.withUnsafeBytes { n in
          try ad.withUnsafeBytes { a in
            try key.withUnsafeBytes { k in
              for _ in 0..<rounds {
                try AEAD.seal(p, into: out, nonce: n, associatedData: a, key: k)
              }
            }
          }
        }
      }
    }
  }
  report("crypto_aead_xchacha20poly1305 encrypt 64 KiB", bytes: rounds * chunk, seconds: enc)
  let dec = try time {
    try opened.withUnsafeMutableBytes { out in
      try sealed.withUnsafeBytes { c in
        try nonce.withUnsafeBytes { n in
          try ad.withUnsafeBytes { a in
            try key.withUnsafeBytes { k in
              for _ in 0..<rounds {
                try AEAD.open(c, into: out, nonce: n, associatedData: a, key: k)
              }
            }
          }
        }
      }
    }
  }
  report("crypto_aead_xchacha20poly1305 decrypt 64 KiB", bytes: rounds * chunk, seconds: dec)
}

func cloudFile() throws {
  let key = SecureRandom.nodeKey()
  let size = 256 * mib
  let data = SecureRandom.bytes(size)
  var sinkBytes = 0
  let enc = try time {
    try CloudFileEncoder(key: key).encode(data: .data(data)) { sinkBytes += $0.count }
  }
  report("CloudFile encode 256 MiB (memory -> null sink)", bytes: size, seconds: enc)

  var object = Data()
  object.reserveCapacity(sinkBytes)
  try CloudFileEncoder(key: key).encode(data: .data(data)) { object.append($0) }
  let stored = object
  let fetch: @Sendable (ByteRange) throws -> Data = { r in
    stored.subdata(in: Int(r.lowerBound)..<Int(r.upperBound))
  }
  let reader = try CloudFileReader(
    key: key, ciphertextSize: UInt64(stored.count), fetch: fetch)
  var decoded = 0
  let dec = try time {
    try reader.stream(.data) { decoded += $0.count }
  }
  precondition(decoded == size)
  report("CloudFile decode 256 MiB (stream -> null sink)", bytes: size, seconds: dec)

  var rng = SystemRandomNumberGenerator()
  let ops = 20_000
  let ranged = try time {
    for _ in 0..<ops {
      let off = UInt64.random(in: 0..<UInt64(size - 4096), using: &rng)
      _ = try reader.read(.data, range: ByteRange(off, off + 4096))
    }
  }
  reportOps("CloudFile ranged 4 KiB random reads (in memory)", ops: ops, seconds: ranged)
}

/// CryptoFile throughput per chunk size (`shifts`, log2 of the chunk size): sequential writes
/// and reads in small and large calls, and random 4 KiB reads (from the page cache: the
/// format's CPU cost, not the disk's).
func cryptoFile(shifts: [UInt8]) throws {
  let key = SecureRandom.bytes(32)
  let size = 256 * mib
  let url = URL(fileURLWithPath: "/tmp/zdc-bench-\(getpid()).cryptofile")
  defer { try? FileManager.default.removeItem(at: url) }
  let source = SecureRandom.bytes(1 << 20)
  for cipher in CryptoFile.Cipher.allCases {
    for shift in shifts {
      let label = "CryptoFile \(cipher), \(1 << (Int(shift) - 10)) KiB chunks:"
      print(label)
      for callSize in [4096, 128 * 1024, 1 << 20] {
        let piece = source.prefix(callSize)
        let f = try CryptoFile.create(at: url, key: key, chunkShift: shift, cipher: cipher)
        let w = try time {
          try piece.withUnsafeBytes { p in
            var off: UInt64 = 0
            while off < UInt64(size) {
              try f.write(p, at: off)
              off += UInt64(callSize)
            }
          }
          try f.sync()
        }
        report("  sequential write, \(callSize / 1024) KiB calls (+fsync)", bytes: size, seconds: w)
        var buf = Data(count: callSize)
        let r = try time {
          try buf.withUnsafeMutableBytes { b in
            var off: UInt64 = 0
            while true {
              let n = try f.read(into: b, at: off)
              if n == 0 { break }
              off += UInt64(n)
            }
            precondition(off == UInt64(size))
          }
        }
        report("  sequential read, \(callSize / 1024) KiB calls", bytes: size, seconds: r)
        if callSize == 4096 {
          var rng = SystemRandomNumberGenerator()
          let ops = 100_000
          let rr = try time {
            try buf.withUnsafeMutableBytes { b in
              for _ in 0..<ops {
                let page = UInt64.random(in: 0..<UInt64(size / 4096), using: &rng)
                _ = try f.read(into: b, at: page * 4096)
              }
            }
          }
          reportOps("  random 4 KiB reads (page cache)", ops: ops, seconds: rr)
        }
        try f.close()
      }
    }
  }
}

let args = CommandLine.arguments.dropFirst()
switch args.first {
case "cloudfile":
  print("zdc-bench cloudfile (one thread; MB = MiB)")
  try rawAEAD()
  try cloudFile()
  try cryptoFile(shifts: [CryptoFile.defaultChunkShift, 16])
case "cryptofile":
  let shifts =
    args.count > 1
    ? args[args.startIndex + 1].split(separator: ",").compactMap { UInt8($0) }
    : Array(CryptoFile.chunkShifts)
  try cryptoFile(shifts: shifts)
case "sync":
  let sizes =
    args.count > 1
    ? args[args.startIndex + 1].split(separator: ",").compactMap { Int($0) }
    : [1000, 10000, 100_000]
  do {
    try SyncBench.run(sizes: sizes)
  } catch {
    FileHandle.standardError.write(Data("zdc-bench sync: \(error)\n".utf8))
    exit(1)
  }
case "push":
  do {
    try SyncBench.push(
      count: args.count > 1 ? Int(args[args.startIndex + 1]) ?? 2000 : 2000,
      again: !args.contains("--new-only"))
  } catch {
    FileHandle.standardError.write(Data("zdc-bench push: \(error)\n".utf8))
    exit(1)
  }
case "catalog":
  try CatalogBench.run(count: args.count > 1 ? Int(args[args.startIndex + 1]) ?? 5000 : 5000)
case "meta":
  try MetaBench.run(count: args.count > 1 ? Int(args[args.startIndex + 1]) ?? 10000 : 10000)
case "copy":
  try MetaBench.copy(count: args.count > 1 ? Int(args[args.startIndex + 1]) ?? 10000 : 10000)
case "read":
  try ReadBench.run(
    files: args.count > 1 ? Int(args[args.startIndex + 1]) ?? 4000 : 4000,
    bigMiB: args.count > 2 ? Int(args[args.startIndex + 2]) ?? 256 : 256)
default:
  print(
    "usage: zdc-bench cloudfile | zdc-bench cryptofile [SHIFTS] | zdc-bench sync [SIZES]"
      + " | zdc-bench push [FILES] [--new-only] | zdc-bench catalog [COUNT]"
      + " | zdc-bench read [FILES] [BIG_MIB] | zdc-bench meta [ITERATIONS]"
      + " | zdc-bench copy [FILES]")
  exit(args.isEmpty ? 0 : 2)
}
