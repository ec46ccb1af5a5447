import ArgumentParser
import Foundation
import ZDCCrypto

/// Options naming where a passphrase comes from.
struct PassphraseOptions: ParsableArguments {
  @Option(
    name: .customLong("passphrase-file"),
    help: "Read the passphrase from the first line of this file (for scripts).")
  var passphraseFile: String?

  /// The passphrase from, in order: --passphrase-file, ZDC_PASSPHRASE, a prompt on the terminal.
  func passphrase(prompt: String, confirm: Bool) throws -> String {
    try readPassphrase(
      file: passphraseFile, fileOption: "--passphrase-file", environment: "ZDC_PASSPHRASE",
      prompt: prompt, confirm: confirm)
  }
}

/// A passphrase from, in order: the first line of `file`, the environment variable
/// `environment`, a prompt on the terminal (asked twice when `confirm`).
func readPassphrase(
  file: String?, fileOption: String, environment: String, prompt: String, confirm: Bool
) throws -> String {
  if let path = file {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
      throw CLIError.usage("cannot read passphrase file \(path)")
    }
    return String(text.split(separator: "\n", omittingEmptySubsequences: false).first ?? "")
  }
  if let env = ProcessInfo.processInfo.environment[environment] { return env }
  guard isatty(STDIN_FILENO) == 1 else {
    throw CLIError.usage(
      "no passphrase: type it at a terminal, or set \(environment), or use \(fileOption)")
  }
  let first = try readSecret(prompt)
  if confirm {
    let again = try readSecret("Repeat passphrase: ")
    guard first == again else { throw CLIError.usage("the passphrases do not match") }
  }
  return first
}

/// Reads a line from the terminal with echo off.
func readSecret(_ prompt: String) throws -> String {
  FileHandle.standardError.write(Data(prompt.utf8))
  var old = termios()
  let haveTTY = tcgetattr(STDIN_FILENO, &old) == 0
  if haveTTY {
    var noEcho = old
    noEcho.c_lflag &= ~tcflag_t(ECHO)
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &noEcho)
  }
  defer {
    if haveTTY {
      tcsetattr(STDIN_FILENO, TCSAFLUSH, &old)
      FileHandle.standardError.write(Data("\n".utf8))
    }
  }
  guard let line = readLine(strippingNewline: true) else {
    throw CLIError.usage("no passphrase given")
  }
  return line
}

/// The recovery key written in `file`.
func readRecoveryKey(_ file: String) throws -> RecoveryKey {
  guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
    throw CLIError.usage("cannot read recovery key file \(file)")
  }
  return try RecoveryKey(text: text)
}
