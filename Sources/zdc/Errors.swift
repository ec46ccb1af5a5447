import ArgumentParser
import Foundation
import ZDCAccount
import ZDCCore
import ZDCCrypto
import ZDCS3Store

/// Errors of the CLI itself (bad arguments, missing input) and its checks of a new store.
enum CLIError: Error, CustomStringConvertible {
  case usage(String)
  /// The store cannot be reached or does not exist.
  case storeUnavailable(String)
  /// The store refused the credentials, or there are none.
  case accessDenied(String)
  /// The store lacks a feature zdcfs relies on (conditional writes).
  case storeLacksFeature(String)

  var description: String {
    switch self {
    case .usage(let m), .storeUnavailable(let m), .accessDenied(let m), .storeLacksFeature(let m):
      return m
    }
  }
}

/// The CLI's stable exit codes (sysexits.h values), documented in the CLI reference.
enum ExitStatus: Int32 {
  case ok = 0
  case failure = 1
  case usage = 64
  case dataError = 65
  case notInitialized = 66
  case storeUnavailable = 69
  case storeLacksFeature = 76
  case alreadyExists = 73
  case ioError = 74
  case temporaryFailure = 75
  case permissionDenied = 77
}

/// Maps any error to a one-line message and an exit code.
func classify(_ error: any Error) -> (String, ExitStatus) {
  switch error {
  case let e as CLIError:
    switch e {
    case .usage: return (e.description, .usage)
    case .storeUnavailable: return (e.description, .storeUnavailable)
    case .accessDenied: return (e.description, .permissionDenied)
    case .storeLacksFeature: return (e.description, .storeLacksFeature)
    }
  case let e as S3ConfigurationError:
    switch e {
    case .missingCredentials: return (e.description, .permissionDenied)
    case .invalidStoreURL, .invalidEndpoint, .missingBucket: return (e.description, .usage)
    }
  case let e as AccountError:
    switch e {
    case .alreadyInitialized, .userExistsInStore: return (e.description, .alreadyExists)
    case .notInitialized, .noUserInStore, .userNotFound: return (e.description, .notInitialized)
    case .ambiguousUser, .unsupportedStore: return (e.description, .usage)
    case .inconsistentKeys: return (e.description, .dataError)
    case .io, .devicePassphraseNotChanged: return (e.description, .ioError)
    case .storePassphraseDiffers: return (e.description, .permissionDenied)
    case .storeKeysChanged: return (e.description, .temporaryFailure)
    }
  case let e as CryptoError:
    switch e {
    case .wrongPassphrase: return (e.description, .permissionDenied)
    default: return (e.description, .dataError)
    }
  case let e as StoreError:
    switch e {
    case .transient: return (e.description, .temporaryFailure)
    case .accessDenied: return (e.description, .permissionDenied)
    case .io: return (e.description, .ioError)
    case .malformedResponse: return (e.description, .dataError)
    default: return (e.description, .storeUnavailable)
    }
  default: return ("\(error)", .failure)
  }
}

/// Runs a command body, printing `zdc: message` and exiting with the mapped code on failure.
func runReportingErrors(_ body: () throws -> Void) throws {
  do {
    try body()
  } catch let e as ExitCode {
    throw e
  } catch let e
    where e is CLIError || e is AccountError || e is CryptoError || e is StoreError
    || e is S3ConfigurationError
  {
    let (message, status) = classify(e)
    FileHandle.standardError.write(Data("zdc: \(message)\n".utf8))
    throw ExitCode(status.rawValue)
  }
}
