import Foundation
import ZDCFileSystem

/// What the mount needs from the sync engine (PushManager and PullManager) once it lands.
///
/// `zdc mount` starts it with the engine's delegate, the control socket's `sync` command calls
/// ``syncNow()``, and unmount calls ``drain(timeout:progress:)`` before the process exits. Until
/// an implementation is wired in `Mount.serve`, `status` reports the sync engine as not running
/// and `sync` answers with an error.
protocol MountSyncHooks: AnyObject, Sendable {
  /// Starts pushing and pulling with this delegate.
  func start(delegate: FileSystemSyncDelegate) throws
  /// Pulls now and pushes everything ready (`zdc sync`).
  func syncNow() throws
  /// Waits until the push queue is empty or `timeout` passes; reports (items, bytes) left.
  func drain(timeout: TimeInterval, progress: (Int, UInt64) -> Void) -> Bool
  /// Stops both managers; what is left stays queued for the next mount.
  func stop()
}
