import ArgumentParser
import Foundation
import ZDCAccount
import ZDCCrypto

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
      help: "Where the encrypted objects live: a folder path (default ~/.local/share/zdcfs/store).")
    var store: String?

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
        let location =
          try store.map { try StoreLocation(argument: $0) }
          ?? .localFolder(path: StateDirectory.defaultStoreFolder().path)
        let (storeKDF, localKDF) = try kdfParameters()
        let device = deviceName ?? ProcessInfo.processInfo.hostName
        if join {
          let credential: JoinCredential
          var localPass: String? = nil
          if let file = recoveryKeyFile {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
              throw CLIError.usage("cannot read recovery key file \(file)")
            }
            credential = .recoveryKey(try RecoveryKey(text: text))
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
