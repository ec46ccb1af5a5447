// Test helper for the store tests: races conditional writes against other processes.
//
//   zdc-testhelper race-create ROOT PREFIX ROUNDS ID
//     `.ifNoneMatch` puts of PREFIX/0 … PREFIX/ROUNDS-1 with content ID; prints each key won.
//   zdc-testhelper race-update ROOT KEY ROUNDS ID
//     ROUNDS attempts at read-then-`.ifMatch` increments of a decimal counter at KEY (content
//     "COUNTER ID"); prints "WIN <new eTag>" for each update that succeeded.
//   zdc-testhelper stream-rss STORE KEY SIZE-MIB PART-MIB
//     Uploads a SIZE-MIB file from disk as a multipart upload of PART-MIB parts, downloads it
//     streamed to a file, and prints "GROWTH <bytes>": how far the process's peak resident set
//     rose above where it was before the transfer (the test's own process runs other tests).
//   zdc-testhelper device STATE-DIR STORE SEED STEPS BIG-STEP
//     Runs a sync device from STATE-DIR: applies seeded changes (12 MiB files at BIG-STEP and 5 × BIG-STEP),
//     resuming after a crash, pushing as it goes; prints "ACK <step> <change>" once each change
//     is committed, "SYNC" once every change is made, and "DONE" when everything reached the
//     store.
//
// STORE (and ROOT) is a local-folder store's path, or s3://BUCKET/PREFIX for an S3 store
// configured the AWS way (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …).
import Foundation
import ZDCCore
import ZDCLocalStore
import ZDCS3Store

/// The store a STORE argument names.
func openStore(_ argument: String) throws -> any CloudStore {
  if argument.lowercased().hasPrefix("s3://") {
    return S3Store(configuration: try S3Configuration.resolve(storeURL: argument))
  }
  return try LocalFolderStore(root: URL(fileURLWithPath: argument))
}

func fail(_ message: String) -> Never {
  FileHandle.standardError.write(Data((message + "\n").utf8))
  exit(2)
}

let args = CommandLine.arguments
if args.count == 6, args[1] == "stream-rss", let sizeMiB = Int(args[4]), let partMiB = Int(args[5])
{
  do {
    guard let store = try openStore(args[2]) as? S3Store else {
      fail("stream-rss needs an S3 store")
    }
    print(
      "GROWTH \(try streamedTransferGrowth(store, key: args[3], sizeMiB: sizeMiB, partMiB: partMiB))"
    )
    exit(0)
  } catch {
    fail("error: \(error)")
  }
}
if args.count == 7, args[1] == "device", let seed = UInt64(args[4]), let steps = Int(args[5]),
  let big = Int(args[6])
{
  do {
    try runDevice(
      stateDir: URL(fileURLWithPath: args[2]), store: try openStore(args[3]),
      seed: seed, steps: steps, bigStep: big)
    exit(0)
  } catch {
    fail("error: \(error)")
  }
}
guard args.count == 6, let rounds = Int(args[4]) else {
  fail("usage: zdc-testhelper race-create|race-update ROOT KEY-OR-PREFIX ROUNDS ID")
}
let id = args[5]

do {
  let store = try openStore(args[2])
  var output = ""
  switch args[1] {
  case "race-create":
    for i in 0..<rounds {
      let key = "\(args[3])/\(i)"
      do {
        _ = try store.put(key: key, body: .data(Data(id.utf8)), condition: .ifNoneMatch)
        output += key + "\n"
      } catch StoreError.preconditionFailed {
        continue
      }
    }
  case "race-update":
    let key = args[3]
    for _ in 0..<rounds {
      let eTag = try store.head(key: key).eTag
      let text = String(decoding: try store.get(key: key), as: UTF8.self)
      guard let counter = Int(text.split(separator: " ").first ?? "") else {
        fail("bad counter content \(text.debugDescription)")
      }
      do {
        let newTag = try store.put(
          key: key, body: .data(Data("\(counter + 1) \(id)".utf8)), condition: .ifMatch(eTag))
        output += "WIN \(newTag)\n"
      } catch StoreError.preconditionFailed {
        continue
      }
    }
  default:
    fail("unknown command \(args[1])")
  }
  FileHandle.standardOutput.write(Data(output.utf8))
} catch {
  fail("error: \(error)")
}
