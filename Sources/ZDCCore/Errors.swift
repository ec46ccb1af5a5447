/// Errors in the core vocabulary: invalid names, paths and values.
public enum CoreError: Error, Sendable, Equatable, CustomStringConvertible {
  /// A node name that the treesystem cannot hold (only the empty string).
  case invalidName(String)
  /// A permission string with an unknown flag.
  case invalidPermissions(String)
  /// A value that fails validation, with a reason.
  case invalidValue(String)

  public var description: String {
    switch self {
    case .invalidName(let n): return "invalid node name \(n.debugDescription)"
    case .invalidPermissions(let p): return "invalid permission string \(p.debugDescription)"
    case .invalidValue(let m): return "invalid value: \(m)"
    }
  }
}
