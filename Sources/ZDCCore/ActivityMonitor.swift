import Synchronization

#if canImport(Glibc)
  import Glibc
#endif

/// When the user last worked on the files (a request through the mount), so that background
/// sync work can give way to them.
public final class ActivityMonitor: Sendable {
  // Monotonic nanoseconds of the last activity; 0 = never.
  private let last = Atomic<Int64>(0)

  public init() {}

  /// Records activity now. Cheap enough to call on every request.
  public func touch() {
    last.store(Self.monotonicNanoseconds(), ordering: .relaxed)
  }

  /// Seconds since the last activity (`.infinity` if none yet).
  public var secondsSinceLastActivity: Double {
    let t = last.load(ordering: .relaxed)
    guard t > 0 else { return .infinity }
    return Double(Self.monotonicNanoseconds() - t) / 1e9
  }

  /// The coarse monotonic clock in nanoseconds (no system call; a few milliseconds' grain).
  public static func monotonicNanoseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
  }
}
