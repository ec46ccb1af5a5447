import Testing
import ZDCSync

@Test func progressStartsIdle() {
  #expect(ProgressTracker().snapshot.isIdle)
}
