import Foundation
import Testing
import ZDCCore

@Suite struct TreesystemPathTests {
  @Test func componentsParentAppending() throws {
    let p = try TreesystemPath(["foo", "bar"])
    #expect(p.trunk == .home)
    #expect(p.name == "bar")
    #expect(p.parent == (try TreesystemPath(["foo"])))
    #expect(p.parent?.parent == TreesystemPath(trunk: .home))
    #expect(TreesystemPath(trunk: .home).parent == nil)
    #expect(try p.appending("soap").components == ["foo", "bar", "soap"])
    #expect(p.description == "/home/foo/bar")
  }

  @Test func anyUnicodeIsLegalButEmptyIsNot() throws {
    let odd = ["a/b", ".", "..", ".data", "名前", "🙂", String(repeating: "x", count: 1000), "\u{1}"]
    let p = try TreesystemPath(odd)
    #expect(p.components == odd)
    #expect(throws: CoreError.invalidName("")) { try TreesystemPath(["a", ""]) }
    #expect(throws: CoreError.invalidName("")) { try p.appending("") }
  }

  @Test func descendantComparesNamesCaseInsensitively() throws {
    let a = try TreesystemPath(["Docs", "Report.txt"])
    #expect(a.isDescendant(of: try TreesystemPath(["docs"])))
    #expect(a.isDescendant(of: TreesystemPath(trunk: .home)))
    #expect(!a.isDescendant(of: try TreesystemPath(["doc"])))
    #expect(!a.isDescendant(of: TreesystemPath(trunk: .prefs)))
  }

  @Test func ordering() throws {
    let paths = [
      try TreesystemPath(["b"]), try TreesystemPath(["a", "z"]), try TreesystemPath(["a"]),
      TreesystemPath(trunk: .prefs), TreesystemPath(trunk: .home),
    ]
    #expect(
      paths.sorted().map(\.description) == ["/home", "/home/a", "/home/a/z", "/home/b", "/prefs"])
  }

  @Test func codableRoundTrip() throws {
    let p = try TreesystemPath(["x", "y"], trunk: .msgsOut)
    let back = try JSONDecoder().decode(TreesystemPath.self, from: JSONEncoder().encode(p))
    #expect(back == p)
  }
}

@Suite struct NameKeyTests {
  @Test func caseAndNormalisationFold() {
    #expect(NameKey("Foo.TXT") == NameKey("foo.txt"))
    #expect(NameKey("caf\u{E9}") == NameKey("cafe\u{301}"))  // NFC vs NFD
    #expect(NameKey("CAF\u{C9}") == NameKey("cafe\u{301}"))
    #expect(NameKey("a") != NameKey("b"))
  }

  /// A case variant's key is its name's key followed by the variant's suffix.
  @Test func caseVariantKeysStartWithTheNameKey() throws {
    for name in ["Makefile", "CAF\u{C9}.txt", "x"] {
      let variant = CaseVariant.name(for: name)
      #expect(CaseVariant.base(of: variant) == name)
      let split = try #require(CaseVariant.splitKey(NameKey(variant).value))
      #expect(String(split.base) == NameKey(name).value)
      #expect(split.suffix.utf8.count == CaseVariant.suffixLength)
      #expect(NameKey(variant) != NameKey(CaseVariant.name(for: name.uppercased())))
    }
    #expect(CaseVariant.splitKey(NameKey("plain.txt").value) == nil)
    #expect(CaseVariant.base(of: "plain.txt") == nil)
  }
}

@Suite struct ShareListTests {
  @Test func permissionStrings() throws {
    #expect(try Permissions(string: "rws") == [.read, .write, .share])
    #expect(try Permissions(string: "swr").description == "rws")
    #expect(try Permissions(string: "").isEmpty)
    #expect(throws: CoreError.invalidPermissions("rx")) { try Permissions(string: "rx") }
  }

  @Test func ownerListAndCodable() throws {
    var list = ShareList.owner("u1")
    #expect(list[.user("u1")]?.permissions == [.read, .write, .share])
    list.set(ShareItem(permissions: [.read], wrappedKey: Data([1, 2])), for: .user("u2"))
    #expect(list.userIDs == ["u1", "u2"])
    let back = try JSONDecoder().decode(ShareList.self, from: JSONEncoder().encode(list))
    #expect(back == list)
    list.remove(.user("u1"))
    #expect(list.userIDs == ["u2"])
    #expect(SharePrincipal(key: "UID:abc") == .user("abc"))
    #expect(SharePrincipal(key: "XYZ:abc") == nil)
  }
}

@Suite struct FileTimeTests {
  @Test func nanosecondRoundTrip() {
    for ns: Int64 in [0, 1, 999_999_999, 1_700_000_000_123_456_789, -1, -1_500_000_000] {
      let t = FileTime(totalNanoseconds: ns)
      #expect(t.totalNanoseconds == ns)
      #expect(t.nanoseconds >= 0 && t.nanoseconds < 1_000_000_000)
    }
    #expect(FileTime(seconds: 1, nanoseconds: 5) < FileTime(seconds: 1, nanoseconds: 6))
  }

  @Test func dateConversionIsCloseEnough() {
    let t = FileTime(seconds: 1_700_000_000, nanoseconds: 250_000_000)
    let back = FileTime(t.date)
    #expect(back.seconds == t.seconds)
    #expect(abs(Int(back.nanoseconds) - Int(t.nanoseconds)) < 1000)
  }
}

@Suite struct CloudLayoutTests {
  @Test func keysAndParse() {
    let l = CloudLayout(userID: "u", treeID: "t")
    let prefix = Trunk.home.dirPrefix
    let r = l.rcrdKey(dirPrefix: prefix, cloudName: "abc")
    #expect(r == "u/t/00000000000000000000000000000000/abc.rcrd")
    #expect(l.parse(key: r)! == (prefix, "abc", true))
    #expect(l.parse(key: l.dataKey(dirPrefix: "P", cloudName: "n"))! == ("P", "n", false))
    #expect(l.parse(key: "u/t/changes/01H-dev") == nil)
    #expect(l.parse(key: "other/t/P/n.rcrd") == nil)
    #expect(l.changeKey(ulid: "01H", deviceID: "d") == "u/t/changes/01H-d")
  }

  @Test func trunkPrefixesAreFixed() {
    #expect(Trunk.home.dirPrefix.count == 32)
    #expect(Set(Trunk.allCases.map(\.dirPrefix)).count == 4)
  }
}

@Suite struct StoreErrorTests {
  @Test func onlyTransientIsRetryable() {
    #expect(StoreError.transient("x").isRetryable)
    #expect(!StoreError.preconditionFailed(key: "k").isRetryable)
    #expect(!StoreError.notFound(key: "k").isRetryable)
  }
}

@Suite struct ULIDTests {
  @Test func sortsByTimeAndRoundTrips() {
    let a = ULID(date: Date(timeIntervalSince1970: 1_700_000_000))
    let b = ULID(date: Date(timeIntervalSince1970: 1_700_000_001))
    #expect(a < b)
    #expect(a.string.count == 26)
    #expect(a.milliseconds == 1_700_000_000_000)
    #expect(ULID(a.string.lowercased()) == a)
    #expect(ULID("not a ulid") == nil)
    #expect(ULID(date: Date()) != ULID(date: Date()))
  }
}

@Suite struct DigitsTests {
  @Test func zeroPaddedInAnyRadix() {
    #expect(Digits.zeroPadded(7, width: 2) == "07")
    #expect(Digits.zeroPadded(2026, width: 4) == "2026")
    #expect(Digits.zeroPadded(12345, width: 2) == "12345")
    #expect(Digits.zeroPadded(0, width: 9) == "000000000")
    #expect(Digits.zeroPadded(-5, width: 3) == "-005")
    #expect(Digits.zeroPadded(UInt64(0xBEEF), width: 16, radix: 16) == "000000000000beef")
    #expect(Digits.zeroPadded(UInt64.max, width: 16, radix: 16) == "ffffffffffffffff")
    #expect(FileTime(seconds: 12, nanoseconds: 3400).description == "12.000003400")
  }
}

@Suite struct ByteSizeTests {
  @Test func sizesAsPeopleWriteThem() {
    #expect(ByteSize.parse("1048576") == 1_048_576)
    #expect(ByteSize.parse("0") == 0)
    #expect(ByteSize.parse("512K") == 512 * 1024)
    #expect(ByteSize.parse("1M") == 1 << 20)
    #expect(ByteSize.parse("1m") == 1 << 20)
    #expect(ByteSize.parse("2GiB") == 2 << 30)
    #expect(ByteSize.parse("1.5G") == 3 << 29)
    #expect(ByteSize.parse("1T") == 1 << 40)
    #expect(ByteSize.parse("100B") == 100)
    #expect(ByteSize.parse("1KB") == 1000)
    #expect(ByteSize.parse("20GB") == 20_000_000_000)
    #expect(ByteSize.parse(" 3M ") == 3 << 20)
  }

  @Test(arguments: ["", "M", "banana", "12Q", "-5M", "1.5", "1.2.3G", "1 M", "99999999T", "١٢M"])
  func notSizes(text: String) {
    #expect(ByteSize.parse(text) == nil)
  }
}

@Suite struct RandomBytesTests {
  /// Small draws come from blocks drawn from the kernel, large ones straight from it: every
  /// draw is fresh and the bytes are evenly spread (a block handed out twice, or left zeroed,
  /// fails this).
  @Test func drawsNeverRepeatAndLookRandom() {
    var seen = Set<Data>()
    var counts = [Int](repeating: 0, count: 256)
    var total = 0
    for i in 0..<6000 {
      let d = RandomBytes.data(i % 89 == 0 ? 3000 : 16 + i % 23)
      #expect(d.count == (i % 89 == 0 ? 3000 : 16 + i % 23))
      #expect(seen.insert(d.prefix(16)).inserted)
      for b in d { counts[Int(b)] += 1 }
      total += d.count
    }
    let expected = Double(total) / 256
    #expect(counts.allSatisfy { abs(Double($0) - expected) < expected * 0.2 })
  }

  /// The generator over the pool gives 64-bit values that do not repeat, and ULIDs made in the
  /// same millisecond differ in their random part.
  @Test func generatorAndULIDsDrawFreshValues() {
    var g = PooledRandomGenerator()
    var values = Set<UInt64>()
    for _ in 0..<5000 { values.insert(g.next()) }
    #expect(values.count == 5000)
    let date = Date(timeIntervalSince1970: 1_700_000_000)
    let ulids = Set((0..<2000).map { _ in ULID(date: date).string })
    #expect(ulids.count == 2000)
    #expect(ulids.allSatisfy { $0.hasPrefix(ULID(date: date).string.prefix(10)) })
  }
}
