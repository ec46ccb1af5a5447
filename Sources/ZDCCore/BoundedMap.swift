public import Synchronization

/// A map of at most `capacity` entries, safe to share between threads, that starts over when
/// full: for caches whose worth is in the entries of the last moments.
///
/// Its methods are inlinable, so that each user's module specializes them for its key and value
/// types: the node cache and the name memos are read on every request, and the unspecialized
/// generic calls cost more than the lookups themselves.
public final class BoundedMap<Key: Hashable & Sendable, Value: Sendable>: Sendable {
  @usableFromInline let entries: Mutex<[Key: Value]>
  /// The most entries kept.
  public let capacity: Int

  public init(capacity: Int) {
    self.capacity = capacity
    entries = Mutex([:])
  }

  @inlinable public func get(_ key: Key) -> Value? { entries.withLock { $0[key] } }

  @inlinable public func put(_ key: Key, _ value: Value) {
    entries.withLock { Self.insert(key, value, into: &$0, capacity: capacity) }
  }

  /// Puts several entries under one lock.
  @inlinable public func put(contentsOf pairs: [(Key, Value)]) {
    guard !pairs.isEmpty else { return }
    entries.withLock {
      for (key, value) in pairs { Self.insert(key, value, into: &$0, capacity: capacity) }
    }
  }

  @inlinable static func insert(
    _ key: Key, _ value: Value, into entries: inout [Key: Value], capacity: Int
  ) {
    if entries.count >= capacity, entries[key] == nil {
      entries.removeAll(keepingCapacity: true)
    }
    entries[key] = value
  }

  @inlinable public func remove(_ key: Key) {
    _ = entries.withLock { $0.removeValue(forKey: key) }
  }

  @inlinable public func removeAll() { entries.withLock { $0.removeAll() } }
}
