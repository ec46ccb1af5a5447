import CSodium
public import Foundation
import Synchronization

/// libsodium initialisation, done once before any other call.
enum Sodium {
  /// Calls `sodium_init` exactly once; traps if libsodium cannot initialise (no entropy source).
  static let ready: Bool = {
    let rc = sodium_init()
    precondition(rc >= 0, "libsodium failed to initialise")
    return true
  }()

  @inline(__always) static func ensure() { _ = ready }
}

/// Random bytes drawn from the kernel a block at a time and handed out once each (zeroed as
/// they go): a file's creation needs about eight small draws (keys, identifiers, nonces), and a
/// `getrandom` system call for each cost more than the work around it. A forked child starts
/// with an empty block, so that it never repeats its parent's bytes.
final class RandomPool: @unchecked Sendable {
  // Safe: `bytes`, `next` and `forksSeen` are only touched under `lock`.
  static let shared = RandomPool()
  /// Draws larger than this go to the kernel directly.
  static let largest = 256
  static let blockSize = 4096

  private let lock = NSLock()
  private let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: blockSize, alignment: 16)
  private var next = blockSize
  private var forksSeen: UInt64 = 0

  /// Forks so far (counted in the child).
  static let forks = Atomic<UInt64>(0)
  private static let watchingForks: Bool = {
    pthread_atfork(nil, nil, { RandomPool.forks.add(1, ordering: .relaxed) }) == 0
  }()

  private init() { _ = Self.watchingForks }

  /// Fills `out` with random bytes.
  func fill(_ out: UnsafeMutableRawBufferPointer) {
    guard let base = out.baseAddress, out.count > 0 else { return }
    Sodium.ensure()
    guard out.count <= Self.largest else { return randombytes_buf(base, out.count) }
    let forks = Self.forks.load(ordering: .relaxed)
    lock.lock()
    defer { lock.unlock() }
    if forksSeen != forks {
      forksSeen = forks
      next = Self.blockSize
    }
    if Self.blockSize - next < out.count {
      randombytes_buf(bytes.baseAddress!, Self.blockSize)
      next = 0
    }
    let from = bytes.baseAddress! + next
    base.copyMemory(from: from, byteCount: out.count)
    from.initializeMemory(as: UInt8.self, repeating: 0, count: out.count)
    next += out.count
  }
}

/// Cryptographically secure random values.
public enum SecureRandom {
  /// `count` random bytes.
  public static func bytes(_ count: Int) -> Data {
    var d = Data(count: count)
    d.withUnsafeMutableBytes { fill($0) }
    return d
  }

  /// Fills `buffer` with random bytes.
  public static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
    RandomPool.shared.fill(buffer)
  }

  /// A new node key: 32 random bytes (XChaCha20-Poly1305 key size).
  public static func nodeKey() -> Data { bytes(32) }

  /// A new dirSalt: 20 random bytes.
  public static func dirSalt() -> Data { bytes(20) }

  /// A new dirPrefix: 128 random bits as 32 upper-case hex digits.
  public static func dirPrefix() -> String { Hex.encode(bytes(16), uppercase: true) }

  /// A new cloudID: 128 random bits as 32 lower-case hex digits.
  public static func cloudID() -> String { Hex.encode(bytes(16)) }

  /// A new local node uuid (RFC 4122 version 4 form, lower case), from libsodium's generator
  /// (Foundation's `UUID()` opens `/dev/urandom` for each one on Linux).
  public static func uuid() -> String {
    var b: (UInt64, UInt64) = (0, 0)
    return withUnsafeMutableBytes(of: &b) { raw in
      fill(raw)
      raw[6] = (raw[6] & 0x0f) | 0x40  // version 4
      raw[8] = (raw[8] & 0x3f) | 0x80  // RFC 4122 variant
      return String(unsafeUninitializedCapacity: 36) { out in
        var o = 0
        for i in 0..<16 {
          if i == 4 || i == 6 || i == 8 || i == 10 {
            out[o] = UInt8(ascii: "-")
            o += 1
          }
          out[o] = Hex.digit(raw[i] >> 4, uppercase: false)
          out[o + 1] = Hex.digit(raw[i] & 0x0f, uppercase: false)
          o += 2
        }
        return o
      }
    }
  }

  /// A new userID: 160 random bits in zBase32 (32 characters).
  public static func userID() -> String { ZBase32.encode(bytes(20)) }
}

/// Hexadecimal encoding.
public enum Hex {
  /// Encodes bytes as hex digits.
  public static func encode(_ data: Data, uppercase: Bool = false) -> String {
    data.withUnsafeBytes { src in
      String(unsafeUninitializedCapacity: src.count * 2) { out in
        for (i, b) in src.enumerated() {
          out[2 * i] = digit(b >> 4, uppercase: uppercase)
          out[2 * i + 1] = digit(b & 0x0f, uppercase: uppercase)
        }
        return src.count * 2
      }
    }
  }

  /// The hex digit (ASCII) of a nibble (0...15).
  @inline(__always)
  static func digit(_ nibble: UInt8, uppercase: Bool) -> UInt8 {
    nibble < 10 ? 0x30 + nibble : (uppercase ? 0x37 : 0x57) + nibble
  }

  /// Decodes hex digits (either case); `nil` on odd length or a non-hex character.
  public static func decode(_ string: String) -> Data? {
    let chars = Array(string.utf8)
    guard chars.count % 2 == 0 else { return nil }
    func nibble(_ c: UInt8) -> UInt8? {
      switch c {
      case 48...57: return c - 48
      case 65...70: return c - 55
      case 97...102: return c - 87
      default: return nil
      }
    }
    var out = Data(capacity: chars.count / 2)
    var i = 0
    while i < chars.count {
      guard let hi = nibble(chars[i]), let lo = nibble(chars[i + 1]) else { return nil }
      out.append(hi << 4 | lo)
      i += 2
    }
    return out
  }
}
