import Foundation

/// Files of the `/proc` file system.
public enum ProcFile {
  /// The whole text of a file in /proc (empty if it cannot be read). Such files report a size
  /// of 0, and `String(contentsOfFile:)` then reads only its first buffer: 4 KiB of
  /// `/proc/mounts`, which misses mount points on a machine with a few dozen mounts.
  public static func text(_ path: String) -> String {
    guard let h = FileHandle(forReadingAtPath: path) else { return "" }
    defer { try? h.close() }
    return String(decoding: h.readDataToEndOfFile(), as: UTF8.self)
  }
}
