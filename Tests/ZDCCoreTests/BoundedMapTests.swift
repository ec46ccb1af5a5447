import Testing
import ZDCCore

@Suite struct BoundedMapTests {
  @Test func keepsAtMostItsCapacityAndStartsOverWhenFull() {
    let map = BoundedMap<Int, String>(capacity: 3)
    for i in 0..<3 { map.put(i, "v\(i)") }
    #expect((0..<3).map { map.get($0) } == ["v0", "v1", "v2"])
    map.put(1, "w1")  // replacing needs no room
    #expect(map.get(0) == "v0")
    #expect(map.get(1) == "w1")
    map.put(3, "v3")  // full: starts over with the new entry
    #expect(map.get(0) == nil)
    #expect(map.get(3) == "v3")
    map.remove(3)
    #expect(map.get(3) == nil)
    map.put(4, "v4")
    map.removeAll()
    #expect(map.get(4) == nil)
  }

  @Test func aBatchPutFollowsTheSameRuleAsSinglePuts() {
    let map = BoundedMap<Int, String>(capacity: 3)
    map.put(contentsOf: [(0, "v0"), (1, "v1")])
    #expect(map.get(0) == "v0" && map.get(1) == "v1")
    // The third fills it; the fourth starts over (the entries before it in the batch go too).
    map.put(contentsOf: [(1, "w1"), (2, "v2"), (3, "v3"), (4, "v4")])
    #expect(map.get(0) == nil && map.get(1) == nil && map.get(2) == nil)
    #expect(map.get(3) == "v3" && map.get(4) == "v4")
    map.put(contentsOf: [])
    #expect(map.get(3) == "v3")
  }
}
