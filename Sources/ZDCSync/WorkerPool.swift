import Foundation
import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

/// A fixed set of threads running submitted jobs in order of submission, at a chosen CPU
/// priority (unlike Dispatch's shared threads, whose priority must not be changed).
final class WorkerPool: @unchecked Sendable {
  // @unchecked: `jobs` and `stopped` are only touched under `cond`.
  private let cond = NSCondition()
  private var jobs: [@Sendable () -> Void] = []
  private var stopped = false

  /// Starts `count` threads named `name` at nice value `nice` (0: unchanged); throws when the
  /// system refuses one (those already started end).
  init(name: String, count: Int, nice: Int32) throws {
    do {
      for i in 0..<max(1, count) {
        try Threads.start(name: "\(name).\(i)") { [self] in
          Threads.lowerPriority(nice: nice)
          loop()
        }
      }
    } catch {
      stop()
      throw error
    }
  }

  deinit { stop() }

  /// Runs `job` on one of the threads.
  func submit(_ job: @escaping @Sendable () -> Void) {
    cond.withLock {
      jobs.append(job)
      cond.signal()
    }
  }

  /// Lets the threads finish the jobs already submitted, then end.
  func stop() {
    cond.withLock {
      stopped = true
      cond.broadcast()
    }
  }

  private func loop() {
    while true {
      let job = cond.withLock { () -> (@Sendable () -> Void)? in
        while jobs.isEmpty && !stopped { cond.wait() }
        return jobs.isEmpty ? nil : jobs.removeFirst()
      }
      guard let job else { return }
      job()
    }
  }
}
