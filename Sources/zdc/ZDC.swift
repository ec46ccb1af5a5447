import ArgumentParser
import CCurl
import CFuse
import Foundation

/// The zdcfs command-line tool.
@main
struct ZDC: ParsableCommand {
  static let version = "0.1.0"

  static let configuration = CommandConfiguration(
    commandName: "zdc",
    abstract: "zdcfs: your end-to-end encrypted cloud treesystem, mounted as a folder.",
    discussion: """
      zdcfs keeps a tree of files in an object store (a local folder by default, or S3) so \
      that every name and byte that leaves this machine is encrypted with keys only you hold. \
      Every device of yours that joins the account sees the same tree, works offline, and \
      never loses a write: conflicting edits are kept side by side.

      Start with `zdc init`; add another device with `zdc init --join`.
      """,
    version: versionString,
    subcommands: [Init.self, Mount.self, Unmount.self, Status.self, Sync.self, Passwd.self])

  static var versionString: String {
    let fuse = zdc_fuse_runtime_version()
    return
      "zdc \(version) (store format 1; libfuse \(fuse / 100).\(fuse % 100), \(String(cString: curl_version())))"
  }
}
