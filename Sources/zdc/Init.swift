import ArgumentParser
import Foundation
import Logging
import ZDCAccount
import ZDCCore
import ZDCCrypto
import ZDCS3Store

/// Options shared by every command that works on an account.
struct StateOptions: ParsableArguments {
  @Option(
    name: .customLong("state-dir"),
    help: "This device's state directory (default: $ZDC_STATE_DIR, else ~/.local/state/zdcfs).")
  var stateDir: String?

  var stateDirectory: StateDirectory { StateDirectory.resolve(explicit: stateDir) }
}

extension ZDC {
  struct Init: ParsableCommand {
    static let configuration = CommandConfiguration(
      abstract: "Create your account on this device, or join this device to it (--join).",
      discussion: """
        Without --join: creates a new user (keys, a recovery key to write down) in the store. \
        The private keys are sealed with your passphrase (Argon2id) both in the store and in \
        this device's state directory.

        With --join: finds your user in the store and unlocks it with your passphrase or your \
        recovery key, so this device becomes the same user.
        """)

    @OptionGroup var state: StateOptions
    @OptionGroup var pass: PassphraseOptions

    @Option(
      help: ArgumentHelp(
        "Where the encrypted objects live: a folder path, or s3://BUCKET/PREFIX.",
        discussion: "Default: ~/.local/share/zdcfs/store. For S3, the credentials come from "
          + "the AWS environment or profile whenever the store is opened; they are never "
          + "recorded."))
    var store: String?

    @OptionGroup(title: "S3 stores") var s3: S3StoreOptions

    @Flag(help: "Join an existing account in the store instead of creating one.")
    var join = false

    @Option(help: "With --join: the user to join, when the store holds several.")
    var user: String?

    @Option(
      name: .customLong("recovery-key-file"),
      help: "With --join: read the recovery key from this file instead of using the passphrase.")
    var recoveryKeyFile: String?

    @Option(help: "This device's name, shown in conflicted-copy names (default: the host name).")
    var deviceName: String?

    @Option(help: .hidden)
    var kdf: String?

    func run() throws {
      try runReportingErrors {
        let stateDirectory = state.stateDirectory
        let location = try s3.prepare(
          try s3.location(store)
            ?? .localFolder(path: StateDirectory.defaultStoreFolder().path))
        let (storeKDF, localKDF) = try kdfParameters()
        let device = deviceName ?? ProcessInfo.processInfo.hostName
        if join {
          let credential: JoinCredential
          var localPass: String? = nil
          if let file = recoveryKeyFile {
            credential = .recoveryKey(try readRecoveryKey(file))
            localPass = try pass.passphrase(
              prompt: "New passphrase for this device: ", confirm: true)
          } else {
            credential = .passphrase(try pass.passphrase(prompt: "Passphrase: ", confirm: false))
          }
          let account = try Account.join(
            stateDirectory: stateDirectory, store: location, credential: credential,
            userID: user, localPassphrase: localPass, deviceName: device, localKDF: localKDF)
          print("Joined user \(account.config.userID) as device \(account.config.deviceName).")
          print("State: \(stateDirectory.url.path)")
          print("Store: \(account.config.store)")
        } else {
          let passphrase = try pass.passphrase(prompt: "New passphrase: ", confirm: true)
          if passphrase.isEmpty {
            FileHandle.standardError.write(
              Data(
                "zdc: warning: empty passphrase; your keys are protected only by file permissions and by the store's access control\n"
                  .utf8))
          }
          let (account, recovery) = try Account.create(
            stateDirectory: stateDirectory, store: location, passphrase: passphrase,
            deviceName: device, storeKDF: storeKDF, localKDF: localKDF)
          print("Created user \(account.config.userID).")
          print("State: \(stateDirectory.url.path)")
          print("Store: \(account.config.store)")
          print("")
          print("Recovery key (write it down; with it and the store, any device can join):")
          print("  \(recovery)")
        }
      }
    }

    func kdfParameters() throws -> (KDFParameters, KDFParameters) {
      switch kdf {
      case nil, "default": return (.moderate, .interactive)
      case "interactive": return (.interactive, .interactive)
      case "minimum": return (.minimum, .minimum)
      default: throw CLIError.usage("--kdf takes default, interactive or minimum")
      }
    }
  }
}

/// The options of an `s3://` store at `zdc init`.
struct S3StoreOptions: ParsableArguments {
  @Option(
    help: ArgumentHelp(
      "The S3 endpoint URL.",
      discussion: "Default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url, "
        + "else AWS."))
  var endpoint: String?

  @Option(help: "The S3 region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile, us-east-1).")
  var region: String?

  @Flag(help: "Address the bucket path-style (https://endpoint/bucket/key).")
  var pathStyle = false

  @Option(help: "The AWS profile to take credentials from at every use (default: AWS_PROFILE).")
  var profile: String?

  @Flag(help: "Create the bucket if it does not exist.")
  var createBucket = false

  @Flag(
    help: ArgumentHelp(
      "Use a store that ignores If-None-Match/If-Match (unsafe).",
      discussion: "Two devices writing at the same moment may then overwrite each other's "
        + "changes without either noticing."))
  var allowUnconditionalWrites = false

  var given: Bool {
    endpoint != nil || region != nil || pathStyle || profile != nil || createBucket
      || allowUnconditionalWrites
  }

  /// The location a `--store` argument names, with these options for an `s3://` store.
  func location(_ argument: String?) throws -> StoreLocation? {
    guard let argument else {
      if given { throw CLIError.usage("--endpoint, --region, … need --store s3://BUCKET/PREFIX") }
      return nil
    }
    let location = try StoreLocation(
      argument: argument, endpoint: endpoint, region: region, pathStyle: pathStyle,
      profile: profile)
    if case .localFolder = location, given {
      throw CLIError.usage("--endpoint, --region, … apply to s3:// stores only")
    }
    return location
  }

  /// Checks a new S3 store before an account is made on it: the bucket is there (created
  /// with `--create-bucket`), the credentials are accepted, and the server honours
  /// conditional writes (else refused, or accepted with a warning under
  /// `--allow-unconditional-writes`). Other locations pass unchanged.
  func prepare(_ location: StoreLocation) throws -> StoreLocation {
    guard case .s3(var l) = location else { return location }
    var logger = Logger(label: "zdc.s3")
    logger.logLevel = .warning  // no retry notices on the terminal
    let store = S3Store(configuration: try l.configuration(), logger: logger)
    let place = "\(l.url) at \(l.endpoint ?? "AWS")"
    do {
      if createBucket { try store.createBucket() }
      try store.checkBucket()
      let support = try store.probeConditionalWrites()
      if !support.isComplete {
        guard allowUnconditionalWrites else {
          throw CLIError.storeLacksFeature(
            "the store \(place) does not honour conditional writes (\(support)): devices "
              + "writing at the same time could overwrite each other's changes unseen. Use a "
              + "server that honours If-None-Match and If-Match (AWS S3, MinIO, recent Ceph), "
              + "or pass --allow-unconditional-writes to accept the risk")
        }
        FileHandle.standardError.write(
          Data(
            ("zdc: warning: the store \(place) does not honour conditional writes "
              + "(\(support)); devices writing at the same time may overwrite each other's "
              + "changes\n").utf8))
        l.unconditionalWritesAccepted = true
      }
    } catch let e as StoreError {
      throw Self.explain(e, place, bucket: l.bucket)
    }
    return .s3(l)
  }

  /// A store failure met while checking a new store, as a message that says what to do.
  static func explain(_ e: StoreError, _ place: String, bucket: String) -> any Error {
    switch e {
    case .transient(let m):
      return CLIError.storeUnavailable("cannot reach the store \(place): \(m)")
    case .unavailable:
      return CLIError.storeUnavailable(
        "the bucket \(bucket) does not exist (\(place)): create it, or pass --create-bucket")
    case .accessDenied(let m):
      return CLIError.accessDenied(
        "the store \(place) refused access (\(m)): check the credentials "
          + "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile) and the bucket's policy")
    case .unsupported(let m):
      return CLIError.storeUnavailable("the store \(place) refused the request: \(m)")
    default:
      return e
    }
  }
}
