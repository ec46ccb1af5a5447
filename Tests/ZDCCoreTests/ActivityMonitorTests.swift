import Foundation
import Testing
import ZDCCore

@Suite struct ActivityMonitorTests {
  @Test func theTimeLeftUntilQuietCountsFromTheLastActivity() throws {
    let monitor = ActivityMonitor()
    // Nothing happened yet: quiet already.
    #expect(monitor.remainingUntilQuiet(60) == nil)
    monitor.touch()
    let left = try #require(monitor.remainingUntilQuiet(60))
    #expect(left > 59 && left <= 60)
    Thread.sleep(forTimeInterval: 0.1)
    #expect(monitor.remainingUntilQuiet(0.05) == nil)
  }
}
