import Foundation
public import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

extension LocalFolderStore {
  /// Highest part number, as with S3.
  public static let maxPartNumber = 10_000

  /// The directory of an upload, after checking that it exists and is for `key`.
  func uploadDirectory(key: String, uploadID: String) throws -> String {
    try Self.validate(key: key)
    guard Hex.isLower(Array(uploadID.utf8), count: 32) else {
      throw StoreError.notFound(key: "\(key) (upload \(uploadID))")
    }
    let dir = multipartPath + "/" + uploadID
    let keyPath = dir + "/key"
    let fd = Posix.open(keyPath, O_RDONLY)
    guard fd >= 0 else {
      if fd == -ENOENT || fd == -ENOTDIR {
        throw StoreError.notFound(key: "\(key) (upload \(uploadID))")
      }
      throw Posix.error("open", keyPath, -fd)
    }
    defer { Posix.close(fd) }
    var stored = [UInt8](repeating: 0, count: 1025)
    let n = try stored.withUnsafeMutableBytes { buf -> Int in
      guard let base = buf.baseAddress else { return 0 }
      return try Posix.pread(fd, base, buf.count, 0, path: keyPath)
    }
    guard stored[..<n].elementsEqual(key.utf8) else {
      throw StoreError.notFound(key: "\(key) (upload \(uploadID))")
    }
    return dir
  }

  static func partName(_ number: Int) -> String {
    let digits = String(number)
    return "part-" + String(repeating: "0", count: max(0, 5 - digits.count)) + digits
  }

  public func createMultipartUpload(key: String) throws -> String {
    try Self.validate(key: key)
    let uploadID = Posix.randomHex(16)
    let dir = multipartPath + "/" + uploadID
    // Built under a temporary name so that a half-made upload is never visible.
    let building = tmpPath + "/upload-" + uploadID
    try makeDirectoryBelowRoot(building)
    let keyPath = building + "/key"
    let fd = Posix.open(keyPath, O_WRONLY | O_CREAT | O_EXCL)
    guard fd >= 0 else { throw Posix.error("create", keyPath, -fd) }
    do {
      try Array(key.utf8).withUnsafeBytes { try Posix.pwrite(fd, $0, 0, path: keyPath) }
      try Posix.fsync(fd, path: keyPath)
      Posix.close(fd)
    } catch {
      Posix.close(fd)
      removeTree(building)
      throw error
    }
    if Posix.isDirectory(multipartPath) != true { try makeDirectoryBelowRoot(multipartPath) }
    guard rename(building, dir) == 0 else {
      let code = errno
      removeTree(building)
      throw Posix.error("rename", dir, code)
    }
    Posix.fsyncDirectory(multipartPath)
    return uploadID
  }

  /// Stores one part; a part number outside 1…`maxPartNumber` is `StoreError.unsupported`.
  public func uploadPart(key: String, uploadID: String, partNumber: Int, body: UploadBody) throws
    -> String
  {
    guard (1...Self.maxPartNumber).contains(partNumber) else {
      throw StoreError.unsupported("part number \(partNumber) is outside 1…\(Self.maxPartNumber)")
    }
    let dir = try uploadDirectory(key: key, uploadID: uploadID)
    let (temp, eTag) = try writeTemp(body)
    let target = dir + "/" + Self.partName(partNumber)
    guard rename(try temp.name(), target) == 0 else {
      let code = errno
      if code == ENOENT { throw StoreError.notFound(key: "\(key) (upload \(uploadID))") }
      throw Posix.error("rename", target, code)
    }
    temp.markCommitted()
    Posix.fsyncDirectory(dir)
    return eTag
  }

  public func listParts(key: String, uploadID: String) throws -> [UploadedPart] {
    let dir = try uploadDirectory(key: key, uploadID: uploadID)
    guard let entries = try Posix.directoryEntries(dir) else {
      throw StoreError.notFound(key: "\(key) (upload \(uploadID))")
    }
    var parts: [UploadedPart] = []
    for entry in entries where entry.isDirectory != true {
      let prefix = Array("part-".utf8)
      guard entry.name.count == 10, entry.name.starts(with: prefix),
        entry.name.dropFirst(5).allSatisfy({ (0x30...0x39).contains($0) }),
        let number = Int(String(decoding: entry.name.dropFirst(5), as: UTF8.self)),
        let object = try? openObject(
          path: dir + "/" + String(decoding: entry.name, as: UTF8.self), key: key)
      else { continue }
      object.close()
      parts.append(UploadedPart(partNumber: number, eTag: object.info.eTag, size: object.info.size))
    }
    return parts.sorted { $0.partNumber < $1.partNumber }
  }

  /// Concatenates the listed parts into the object. A part that is missing or has another eTag
  /// is reported as `StoreError.malformedResponse`, as are parts not in ascending order.
  public func completeMultipartUpload(
    key: String, uploadID: String, parts: [UploadedPart], condition: WriteCondition
  ) throws -> String {
    let dir = try uploadDirectory(key: key, uploadID: uploadID)
    guard !parts.isEmpty else {
      throw StoreError.malformedResponse("upload \(uploadID): no parts given")
    }
    for (a, b) in zip(parts, parts.dropFirst()) where a.partNumber >= b.partNumber {
      throw StoreError.malformedResponse("upload \(uploadID): parts not in ascending order")
    }
    let (temp, eTag) = try writeTemp { sink in
      for part in parts {
        let partPath = dir + "/" + Self.partName(part.partNumber)
        let object: OpenObject
        do {
          object = try openObject(path: partPath, key: key)
        } catch StoreError.notFound {
          throw StoreError.malformedResponse("upload \(uploadID): part \(part.partNumber) missing")
        }
        defer { object.close() }
        guard object.info.eTag == part.eTag else {
          throw StoreError.malformedResponse(
            "upload \(uploadID): part \(part.partNumber) has eTag \(object.info.eTag)")
        }
        try object.stream(ByteRange(0, object.info.size), to: sink)
      }
    }
    try commit(temp, key: key, condition: condition)
    removeTree(dir)
    return eTag
  }

  public func abortMultipartUpload(key: String, uploadID: String) throws {
    let dir = try uploadDirectory(key: key, uploadID: uploadID)
    removeTree(dir)
  }

  /// Removes a flat directory and its files; best effort.
  func removeTree(_ dir: String) {
    if let entries = try? Posix.directoryEntries(dir) {
      for entry in entries {
        unlink(dir + "/" + String(decoding: entry.name, as: UTF8.self))
      }
    }
    rmdir(dir)
  }
}
