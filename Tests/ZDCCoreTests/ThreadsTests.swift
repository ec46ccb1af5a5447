import CLinux
import Foundation
import Synchronization
import Testing
import ZDCCore

#if canImport(Glibc)
  import Glibc
#endif

@Suite struct ThreadsTests {
  /// The nice value and I/O priority of a thread started with `Threads.start` that lowered its
  /// priority, and of the test's own thread afterwards.
  @Test func lowerPriorityLowersOnlyTheCallingThreadsCPUAndIOPriority() throws {
    let niceBefore = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
    let ioBefore = zdc_io_priority()
    let seen = Mutex<(nice: Int32, io: Int32)?>(nil)
    let done = DispatchSemaphore(value: 0)
    try Threads.start(name: "zdc.test.low") {
      Threads.lowerPriority(nice: 10)
      errno = 0
      let nice = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
      seen.withLock { $0 = (nice, zdc_io_priority()) }
      done.signal()
    }
    #expect(done.wait(timeout: .now() + 10) == .success)
    let low = try #require(seen.withLock { $0 })
    #expect(low.nice == max(10, niceBefore))
    #expect(low.io == (2 << 13) | 7)  // best effort, level 7
    // This thread keeps its own priorities.
    #expect(getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) == niceBefore)
    #expect(zdc_io_priority() == ioBefore)
  }
}
