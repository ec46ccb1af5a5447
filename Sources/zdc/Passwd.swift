import ArgumentParser
import Foundation
import ZDCAccount
import ZDCCrypto

extension ZDC {
  struct Passwd: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "passwd",
      abstract: "Change the passphrase that seals your keys (in the store and on this device).",
      discussion: """
        Asks for the current passphrase (or, with --recovery-key-file, uses your recovery key \
        instead: for a forgotten passphrase) and a new one. The copy of your keys in the store, \
        which new devices join with, is changed first; then this device's keystore. Your \
        recovery key stays valid. Other devices keep their own passphrases until you run \
        `zdc passwd --device-only` on them. A running mount is not affected.
        """)

    @OptionGroup var state: StateOptions
    @OptionGroup var pass: PassphraseOptions

    @Option(
      name: .customLong("new-passphrase-file"),
      help: "Read the new passphrase from the first line of this file (for scripts).")
    var newPassphraseFile: String?

    @Option(
      name: .customLong("recovery-key-file"),
      help: "Prove the right to change it with the recovery key in this file, not the passphrase.")
    var recoveryKeyFile: String?

    @Flag(help: "Change only this device's passphrase, not the store's copy.")
    var deviceOnly = false

    @Option(help: .hidden)
    var kdf: String?

    func run() throws {
      try runReportingErrors {
        let stateDirectory = state.stateDirectory
        guard stateDirectory.isInitialized else {
          throw AccountError.notInitialized(stateDirectory.url.path)
        }
        let credential: Keystore.Credential
        if let file = recoveryKeyFile {
          credential = .recoveryKey(try readRecoveryKey(file))
        } else {
          credential = .passphrase(
            try pass.passphrase(prompt: "Current passphrase: ", confirm: false))
        }
        let new = try readPassphrase(
          file: newPassphraseFile, fileOption: "--new-passphrase-file",
          environment: "ZDC_NEW_PASSPHRASE", prompt: "New passphrase: ", confirm: true)
        if new.isEmpty {
          FileHandle.standardError.write(
            Data(
              "zdc: warning: empty passphrase; your keys are protected only by file permissions and by the store's access control\n"
                .utf8))
        }
        let cost: KDFParameters?
        switch kdf {
        case nil, "default": cost = nil
        case "minimum": cost = .minimum
        default: throw CLIError.usage("--kdf takes default or minimum")
        }
        try Account.changePassphrase(
          stateDirectory: stateDirectory, credential: credential, newPassphrase: new,
          scope: deviceOnly ? .deviceOnly : .storeAndDevice, storeKDF: cost, localKDF: cost)
        print(
          deviceOnly
            ? "Passphrase changed on this device."
            : "Passphrase changed in the store and on this device.")
      }
    }
  }
}
