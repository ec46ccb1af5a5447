import ArgumentParser
import Foundation

#if canImport(Glibc)
  import Glibc
#endif

extension ZDC {
  struct Sync: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Upload everything pending and fetch what changed elsewhere, now.",
      discussion: """
        Asks the running mount to push every pending change to the store and to pull the \
        store's changes, printing progress while it works. Exits 0 once this device is in \
        sync; otherwise (timeout, store errors, not mounted) prints why and exits non-zero.
        """)

    @OptionGroup var state: StateOptions

    @Option(help: "Give up after this many seconds.")
    var timeout: Double = 120

    @Flag(help: "Print no progress lines.")
    var quiet = false

    func run() throws {
      try runReportingErrors {
        let sock = state.stateDirectory.url.appendingPathComponent("control.sock").path
        let display = ProgressDisplay(label: "Syncing")
        let answer = ControlClient.request(
          socketPath: sock, ["command": "sync", "timeout": timeout]
        ) { p in
          guard !quiet else { return }
          display.update(
            items: p["pendingItems"] as? Int ?? 0, bytes: Int64(p["pendingBytes"] as? Int ?? 0),
            detail: " to upload, \(p["uploading"] ?? 0) uploading, "
              + "\(p["downloading"] ?? 0) downloading")
        }
        display.finish()
        guard let answer else {
          FileHandle.standardError.write(
            Data("zdc: not mounted: `zdc sync` works through a running `zdc mount`\n".utf8))
          throw ExitCode(ExitStatus.failure.rawValue)
        }
        guard
          let obj = (try? JSONSerialization.jsonObject(with: Data(answer.utf8)))
            as? [String: Any]
        else { throw CLIError.usage("unexpected answer from the mount") }
        if let error = obj["error"] as? String {
          var message = "\(error); \(obj["pendingItems"] ?? 0) items still pending"
          if let last = obj["lastError"] as? String { message += " (last error: \(last))" }
          FileHandle.standardError.write(Data("zdc: \(message)\n".utf8))
          throw ExitCode(ExitStatus.temporaryFailure.rawValue)
        }
        print("In sync (last pull \((obj["lastPull"] as? String) ?? "never")).")
      }
    }
  }
}
