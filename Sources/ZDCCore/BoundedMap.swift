import Foundation

/// A map of at most `capacity` entries, safe to share between threads, that starts over when
/// full: for caches whose worth is in the entries of the last moments.
public final class BoundedMap<Key: Hashable & Sendable, Value: Sendable>: @unchecked Sendable {
  // @unchecked: `entries` is only touched under `lock`.
  private let lock = NSLock()
  private var entries: [Key: Value] = [:]
  /// The most entries kept.
  public let capacity: Int

  public init(capacity: Int) { self.capacity = capacity }

  public func get(_ key: Key) -> Value? { lock.withLock { entries[key] } }

  public func put(_ key: Key, _ value: Value) {
    lock.withLock { insertLocked(key, value) }
  }
  /// Puts several entries under one lock.
  public func put(contentsOf pairs: [(Key, Value)]) {
    guard !pairs.isEmpty else { return }
    lock.withLock { for (key, value) in pairs { insertLocked(key, value) } }
  }
  private func insertLocked(_ key: Key, _ value: Value) {
    if entries.count >= capacity, entries[key] == nil {
      entries.removeAll(keepingCapacity: true)
    }
    entries[key] = value
  }
  public func remove(_ key: Key) { _ = lock.withLock { entries.removeValue(forKey: key) } }

  public func removeAll() { lock.withLock { entries.removeAll() } }
}
