import Synchronization

#if canImport(Glibc)
  import Glibc
#endif

/// When something last happened — the user's last request through the mount, so that
/// background sync work can give way to them; the last write of a burst, so that work held
/// back waits for it to pause.
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

  /// How much longer, in seconds, until `quiet` seconds have passed since the last activity,
  /// or `nil` once they have.
  public func remainingUntilQuiet(_ quiet: Double) -> Double? {
    let since = secondsSinceLastActivity
    return since < quiet ? quiet - since : nil
  }

  /// The coarse monotonic clock in nanoseconds (no system call; a few milliseconds' grain).
  public static func monotonicNanoseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
  }
}
