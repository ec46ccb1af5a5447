// Benchmarks (not tests).
//
//   zdc-bench sync [SIZES]
//     Incremental pull of 10 changes and first full pull on trees of SIZES nodes
//     (comma-separated; default 1000,10000,100000), from a LocalFolderStore.
import Foundation

let arguments = CommandLine.arguments
switch arguments.count > 1 ? arguments[1] : "" {
case "sync":
  let sizes =
    arguments.count > 2
    ? arguments[2].split(separator: ",").compactMap { Int($0) } : [1000, 10000, 100_000]
  do {
    try SyncBench.run(sizes: sizes)
  } catch {
    FileHandle.standardError.write(Data("zdc-bench sync: \(error)\n".utf8))
    exit(1)
  }
default:
  print("bench")
  print("usage: zdc-bench sync [SIZES]")
}
