import Foundation
import ZDCCore
import ZDCS3Store

/// A field of /proc/self/status in bytes (`VmRSS`, `VmHWM`).
func statusBytes(_ field: String) throws -> Int {
  let text = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
  for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
    let kib = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first
    if let kib, let n = Int(kib) { return n * 1024 }
  }
  throw CocoaError(.fileReadCorruptFile)
}

/// Uploads a file of `sizeMiB` MiB in `partMiB` MiB parts and downloads it streamed; returns how
/// far the peak resident set rose above the resident set before the transfer.
func streamedTransferGrowth(_ store: S3Store, key: String, sizeMiB: Int, partMiB: Int) throws
  -> Int
{
  let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
    "zdc-stream-rss-\(UUID().uuidString)")
  try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
  defer { try? FileManager.default.removeItem(at: dir) }
  let source = dir.appendingPathComponent("source")
  guard FileManager.default.createFile(atPath: source.path, contents: nil) else {
    throw CocoaError(.fileWriteUnknown)
  }
  let out = try FileHandle(forWritingTo: source)
  var block = [UInt8](repeating: 0, count: 1 << 20)
  for i in 0..<sizeMiB {
    for j in stride(from: 0, to: block.count, by: 4096) {
      block[j] = UInt8(truncatingIfNeeded: i &+ j)
    }
    try out.write(contentsOf: block)
  }
  try out.close()
  block = []
  // The peak from here on ("5": reset the high-water mark to the current resident set).
  try "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
  let start = try statusBytes("VmRSS")
  let size = UInt64(sizeMiB) << 20
  let part = UInt64(partMiB) << 20
  let uploadID = try store.createMultipartUpload(key: key)
  var parts: [UploadedPart] = []
  var lo: UInt64 = 0
  while lo < size {
    let hi = min(size, lo + part)
    let eTag = try store.uploadPart(
      key: key, uploadID: uploadID, partNumber: parts.count + 1,
      body: .file(source, range: ByteRange(lo, hi)))
    parts.append(UploadedPart(partNumber: parts.count + 1, eTag: eTag, size: hi - lo))
    lo = hi
  }
  _ = try store.completeMultipartUpload(
    key: key, uploadID: uploadID, parts: parts, condition: .ifNoneMatch)
  let got = try store.get(key: key, range: nil, to: dir.appendingPathComponent("copy"))
  guard got.size == size else { throw StoreError.malformedResponse("size \(got.size)") }
  return max(0, try statusBytes("VmHWM") - start)
}
