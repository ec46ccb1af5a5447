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
}
