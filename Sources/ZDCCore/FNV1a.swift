/// The 64-bit FNV-1a hash: names shortened with a hash of their bytes, lock stripes, and the
/// checksums of local journals and logs.
public enum FNV1a {
  /// The standard offset basis.
  public static let offsetBasis: UInt64 = 0xcbf2_9ce4_8422_2325

  /// The hash of `bytes`, starting from `basis` (a format's own basis keeps, for instance,
  /// all-zero bytes from passing for a checksummed record).
  @inlinable
  public static func hash<S: Sequence>(_ bytes: S, basis: UInt64 = offsetBasis) -> UInt64
  where S.Element == UInt8 {
    var h = basis
    for b in bytes {
      h ^= UInt64(b)
      h &*= 0x0000_0100_0000_01b3
    }
    return h
  }

  /// The hash of `bytes` (the same as the sequence's; not generic, so as fast unoptimized).
  public static func hash(_ bytes: UnsafeRawBufferPointer, basis: UInt64 = offsetBasis) -> UInt64 {
    var h = basis
    for b in bytes {
      h ^= UInt64(b)
      h &*= 0x0000_0100_0000_01b3
    }
    return h
  }
}
