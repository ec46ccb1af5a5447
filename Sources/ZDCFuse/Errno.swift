import Foundation
import ZDCFileSystem

#if canImport(Glibc)
  import Glibc
#endif

/// The only errno table: engine errors to the codes `fuse_reply_err` sends.
func errnoCode(for error: any Error) -> Int32 {
  guard let e = error as? FileSystemError else { return EIO }
  switch e {
  case .notFound: return ENOENT
  case .exists: return EEXIST
  case .notADirectory: return ENOTDIR
  case .isADirectory: return EISDIR
  case .notEmpty: return ENOTEMPTY
  case .notPermitted: return EPERM
  case .invalidArgument: return EINVAL
  case .nameTooLong: return ENAMETOOLONG
  case .noAttribute: return ENODATA
  case .notSupported: return EOPNOTSUPP
  case .badHandle: return EBADF
  case .range: return ERANGE
  case .tooBig: return E2BIG
  case .io: return EIO
  case .unavailable: return EIO
  case .noSpace: return ENOSPC
  case .accessDenied: return EACCES
  case .illegalByteSequence: return EILSEQ
  case .fileTooLarge: return EFBIG
  }
}
