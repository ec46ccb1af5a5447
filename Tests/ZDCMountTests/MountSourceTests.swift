import Testing

@testable import ZDCFuse

/// The mount's source in the mount table (`zdcfs:STATE_DIR`), which `zdc unmount MOUNTPOINT`
/// reads back to find the mount's state directory.
@Suite struct MountSourceTests {
  @Test func aStateDirectoryIsRecordedOnlyWhenMountOptionsKeepItIntact() {
    #expect(
      FuseMount.source(stateDirectory: "/home/u/.local/state/zdcfs")
        == "zdcfs:/home/u/.local/state/zdcfs")
    #expect(FuseMount.source(stateDirectory: nil) == "zdcfs")
    #expect(FuseMount.source(stateDirectory: "relative/state") == "zdcfs")
    for odd in ["/a,b", "/a b", "/a\\b", "/a\tb", "/a\nb"] {
      #expect(FuseMount.source(stateDirectory: odd) == "zdcfs", "\(odd)")
    }
  }

  @Test func theStateDirectoryIsReadBackFromMountinfo() {
    let table = """
      22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
      40 22 0:50 / /home/u/My\\040Cloud rw,nosuid,nodev,relatime shared:30 - fuse.zdc zdcfs:/home/u/.local/state/zdcfs rw,user_id=1000,group_id=1000
      41 22 0:51 / /home/u/old rw,nosuid,nodev,relatime - fuse.zdc zdcfs rw,user_id=1000,group_id=1000
      42 22 0:52 / /home/u/remote rw,nosuid,nodev,relatime - fuse.sshfs zdcfs:/not/ours rw,user_id=1000,group_id=1000
      """
    #expect(
      FuseMount.stateDirectory(ofMountpoint: "/home/u/My Cloud", mountTable: table)
        == "/home/u/.local/state/zdcfs")
    // A mount that recorded no state directory, another file system, no mount at all.
    #expect(FuseMount.stateDirectory(ofMountpoint: "/home/u/old", mountTable: table) == nil)
    #expect(FuseMount.stateDirectory(ofMountpoint: "/home/u/remote", mountTable: table) == nil)
    #expect(FuseMount.stateDirectory(ofMountpoint: "/home/u/elsewhere", mountTable: table) == nil)
    #expect(FuseMount.unescape("a\\040b\\011c\\134d\\9x") == "a b\tc\\d\\9x")
  }

  @Test func theDeviceNumberOfTheMountOnTopIsReadFromMountinfo() {
    let table = """
      22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
      40 22 0:50 / /home/u/My\\040Cloud rw,nosuid,nodev,relatime shared:30 - fuse.zdc zdcfs:/s rw
      42 22 0:52 / /home/u/remote rw,nosuid,nodev,relatime - fuse.sshfs zdcfs:/not/ours rw
      43 40 0:53 / /home/u/My\\040Cloud rw,nosuid,nodev,relatime - fuse.zdc zdcfs:/t rw
      """
    #expect(FuseMount.deviceNumber(ofMountpoint: "/home/u/My Cloud", mountTable: table) == "0:53")
    #expect(FuseMount.deviceNumber(ofMountpoint: "/home/u/remote", mountTable: table) == nil)
    #expect(FuseMount.deviceNumber(ofMountpoint: "/", mountTable: table) == nil)
  }
}
