public import Foundation

/// A source of the current time, replaceable in tests.
public protocol Clock: Sendable {
  /// The current time.
  func now() -> Date
}

/// The system's wall clock.
public struct SystemClock: Clock {
  public init() {}
  public func now() -> Date { Date() }
}
