import CLinux

#if canImport(Glibc)
  import Glibc
#endif

/// Starting the process's own long-lived threads.
public enum Threads {
  /// Runs `body` on a new detached POSIX thread named `name` (`ps` and `top` show its first 15
  /// bytes); throws ``ThreadStartError`` when the system refuses a thread.
  ///
  /// Not Foundation's `Thread`: on Linux it keeps the `pthread_t` of a thread that has ended and
  /// may use it after the thread's memory was reused (swift-corelibs-foundation issue 5240).
  /// In this project's tests, heap corruptions found at thread exit, after many short-lived
  /// `Thread`s, stopped with this change.
  public static func start(name: String, _ body: @escaping @Sendable () -> Void) throws {
    let box = Unmanaged.passRetained(ThreadBody(name: name, body: body)).toOpaque()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    var thread = pthread_t()
    let rc = pthread_create(
      &thread, &attributes,
      { argument in
        let box = Unmanaged<ThreadBody>.fromOpaque(argument!).takeRetainedValue()
        _ = zdc_set_thread_name(box.name)
        box.body()
        return nil
      }, box)
    guard rc == 0 else {
      Unmanaged<ThreadBody>.fromOpaque(box).release()
      throw ThreadStartError(name: name, code: rc)
    }
  }
}

extension Threads {
  /// Lowers the calling thread's CPU priority to nice value `nice` (above 0; on Linux the nice
  /// value belongs to the thread) and its disk I/O to the lowest best-effort priority, so that
  /// its work gives way to the user's. Best effort: a refusal changes nothing.
  public static func lowerPriority(nice: Int32) {
    guard nice > 0 else { return }
    _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, nice)
    _ = zdc_lower_io_priority()
  }
}

/// The system refused a new thread (`pthread_create` failed, e.g. `EAGAIN`).
public struct ThreadStartError: Error, CustomStringConvertible, Sendable {
  /// The thread's name.
  public let name: String
  /// `pthread_create`'s error number.
  public let code: Int32

  public var description: String { "cannot start thread \(name): error \(code)" }
}

/// What a new thread runs, handed over through `pthread_create`'s argument.
private final class ThreadBody {
  let name: String
  let body: @Sendable () -> Void

  init(name: String, body: @escaping @Sendable () -> Void) {
    self.name = name
    self.body = body
  }
}
