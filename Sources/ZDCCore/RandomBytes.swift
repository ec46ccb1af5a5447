import CLinux
public import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#endif

/// Cryptographically secure random bytes from the kernel (`getrandom`), drawn a block at a time
/// and handed out once each (zeroed as they go): a file's creation needs about eight small
/// draws (keys, identifiers, nonces), and a system call for each cost more than the work
/// around it. A forked child starts with an empty block, so that it never repeats its parent's
/// bytes. Every random value of the program comes from here.
public enum RandomBytes {
  /// Fills `buffer` with random bytes.
  public static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
    RandomPool.shared.fill(buffer)
  }

  /// `count` random bytes.
  public static func data(_ count: Int) -> Data {
    var d = Data(count: count)
    d.withUnsafeMutableBytes { fill($0) }
    return d
  }
}

/// ``RandomBytes`` as a `RandomNumberGenerator` (Swift's own generator makes a system call per
/// 64-bit value).
public struct PooledRandomGenerator: RandomNumberGenerator {
  public init() {}

  public mutating func next() -> UInt64 {
    var v: UInt64 = 0
    withUnsafeMutableBytes(of: &v) { RandomBytes.fill($0) }
    return v
  }
}

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
    guard out.count > 0 else { return }
    guard out.count <= Self.largest else { return Self.fromKernel(out) }
    let forks = Self.forks.load(ordering: .relaxed)
    lock.lock()
    defer { lock.unlock() }
    if forksSeen != forks {
      forksSeen = forks
      next = Self.blockSize
    }
    if Self.blockSize - next < out.count {
      Self.fromKernel(bytes)
      next = 0
    }
    let from = bytes.baseAddress! + next
    out.baseAddress!.copyMemory(from: from, byteCount: out.count)
    from.initializeMemory(as: UInt8.self, repeating: 0, count: out.count)
    next += out.count
  }

  /// Fills `out` from the kernel's generator (blocking only before it is first seeded, at
  /// boot). Traps if the kernel has none: nothing random can be made without it.
  static func fromKernel(_ out: UnsafeMutableRawBufferPointer) {
    var done = 0
    while done < out.count {
      let n = zdc_getrandom(out.baseAddress! + done, UInt(out.count - done))
      if n > 0 {
        done += n
      } else {
        precondition(n < 0 && errno == EINTR, "getrandom failed (errno \(errno))")
      }
    }
  }
}
