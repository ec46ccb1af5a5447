import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// Shows how much is left of a long wait: on a terminal, one bar redrawn in place; otherwise
/// (a pipe, a log, a script) one line each time the text changes.
final class ProgressDisplay {
  let label: String
  let hint: String
  let isTerminal: Bool
  private var maxItems = 0
  private var maxBytes: Int64 = 0
  private var shown = ""

  /// `label` starts every line ("Waiting for uploads"); `hint` ends it.
  init(label: String, hint: String = "", terminal: Bool = isatty(STDOUT_FILENO) == 1) {
    self.label = label
    self.hint = hint
    isTerminal = terminal
  }

  /// Shows what is left; `detail` is appended for the line output (no bar).
  func update(items: Int, bytes: Int64, detail: String = "") {
    maxItems = max(maxItems, items)
    maxBytes = max(maxBytes, bytes)
    let line: String
    if isTerminal {
      line = "\r\(bar(items: items, bytes: bytes))\u{1B}[K"
    } else {
      line =
        "\(label): \(items) items, \(bytes) bytes left\(detail)\(hint.isEmpty ? "" : " \(hint)")."
    }
    guard line != shown else { return }
    print(line, terminator: isTerminal ? "" : "\n")
    fflush(nil)
    shown = line
  }

  /// Ends the bar's line (on a terminal).
  func finish() {
    if isTerminal, !shown.isEmpty {
      print("")
      fflush(nil)
    }
    shown = ""
  }

  /// `label [#########-----------]  45%  3/7 items, 1.2 MB left hint`: the fraction done of the
  /// most that was pending during this wait (bytes when there are any, else items).
  func bar(items: Int, bytes: Int64, width: Int = 24) -> String {
    let fraction: Double
    if maxBytes > 0 {
      fraction = Double(maxBytes - bytes) / Double(maxBytes)
    } else if maxItems > 0 {
      fraction = Double(maxItems - items) / Double(maxItems)
    } else {
      fraction = 1
    }
    let filled = min(width, max(0, Int((fraction * Double(width)).rounded(.down))))
    let percent = Int((fraction * 100).rounded(.down))
    let done = maxItems - items
    return "\(label) [\(String(repeating: "#", count: filled))"
      + "\(String(repeating: "-", count: width - filled))] \(String(format: "%3d", percent))%  "
      + "\(done)/\(maxItems) items, \(Self.bytes(bytes)) left\(hint.isEmpty ? "" : " \(hint)")"
  }

  /// A byte count for people: `950 B`, `12.3 KB`, `4.5 MB`, `1.2 GB` (powers of 1000).
  static func bytes(_ n: Int64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"]
    var value = Double(n)
    var unit = 0
    while value >= 1000, unit < units.count - 1 {
      value /= 1000
      unit += 1
    }
    return unit == 0 ? "\(n) B" : String(format: "%.1f %@", value, units[unit])
  }
}
