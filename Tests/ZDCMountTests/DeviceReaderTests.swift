import CFuse
import Foundation
import Testing
import ZDCTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// Who reads the FUSE device while busy polling is on: one worker during a burst, which hands
/// the device on before a request that may take long and keeps it after a short one; a request
/// that blocks all the same must not hold up other programs' requests.
@Suite(.serialized) struct DeviceReaderTests {
  // Opcodes and sizes of include/uapi/linux/fuse.h.
  static let lookup: UInt32 = 1
  static let getattr: UInt32 = 3
  static let open: UInt32 = 14
  static let read: UInt32 = 15
  static let write: UInt32 = 16
  static let fsync: UInt32 = 20
  static let flush: UInt32 = 25
  static let create: UInt32 = 35
  static let ioctl: UInt32 = 39
  static let setattr: UInt32 = 4
  /// `struct fuse_in_header` plus `struct fuse_write_in`.
  static let writeHeaders: UInt32 = 40 + 40

  @Test func requestsThatMayTakeLongAreTold() {
    for op in [Self.lookup, Self.getattr, Self.flush, Self.create, Self.ioctl] {
      #expect(zdc_fuse_request_may_take_long(op, 64) == 0, "opcode \(op)")
    }
    // Reads go to the disk or the network; opening may download; fsync waits for the disk;
    // a size change may copy the file.
    for op in [Self.read, Self.open, Self.fsync, Self.setattr] {
      #expect(zdc_fuse_request_may_take_long(op, 80) == 1, "opcode \(op)")
    }
    #expect(zdc_fuse_request_may_take_long(Self.write, Self.writeHeaders + 4096) == 0)
    #expect(zdc_fuse_request_may_take_long(Self.write, Self.writeHeaders + 65536) == 0)
    #expect(zdc_fuse_request_may_take_long(Self.write, Self.writeHeaders + 65537) == 1)
    #expect(zdc_fuse_request_may_take_long(Self.write, Self.writeHeaders + (1 << 20)) == 1)
    // Unknown opcodes may take long.
    #expect(zdc_fuse_request_may_take_long(4000, 64) == 1)
  }

  /// A fake FUSE device: one end of a socket pair that keeps message boundaries, read by
  /// workers through `zdc_fuse_read_request` (see `start`); each worker "serves" what it reads with
  /// `serve` (which may block) and records which worker read which request.
  final class FakeDevice: @unchecked Sendable {
    // @unchecked: `log` and `readersDone` are touched under `lock` only.
    let server: Int32
    let client: Int32
    let lock = NSLock()
    private(set) var log: [(worker: Int, opcode: UInt32)] = []
    var readersDone = 0

    init() throws {
      var fds: [Int32] = [0, 0]
      try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &fds) == 0)
      server = fds[0]
      client = fds[1]
      // Busy polling on; this also starts a new session's bookkeeping.
      zdc_fuse_set_busy_poll(200)
    }

    func start(threads: Int, serve: @escaping @Sendable (UInt32) -> Void) {
      for worker in 0..<threads {
        Thread.detachNewThread { [self] in
          var buf = [UInt8](repeating: 0, count: 4096)
          while true {
            let n = buf.withUnsafeMutableBytes {
              zdc_fuse_read_request(server, $0.baseAddress, 4096)
            }
            if n <= 0 { break }
            let opcode = buf.withUnsafeBytes { $0.load(fromByteOffset: 4, as: UInt32.self) }
            lock.withLock { log.append((worker, opcode)) }
            serve(opcode)
          }
          lock.withLock { readersDone += 1 }
        }
      }
    }

    /// Sends a request (a bare `struct fuse_in_header`) and waits until a worker has read it;
    /// how long that took, or nil after `timeout` seconds.
    @discardableResult
    func send(_ opcode: UInt32, timeout: Double = 10) -> Double? {
      let before = lock.withLock { log.count }
      var header = [UInt32](repeating: 0, count: 10)
      header[0] = 40
      header[1] = opcode
      header[2] = 1  // unique: an answer to it is an answer
      let start = Date()
      _ = header.withUnsafeBytes { Glibc.write(client, $0.baseAddress, 40) }
      while lock.withLock({ log.count }) == before {
        if Date().timeIntervalSince(start) > timeout { return nil }
        usleep(50)
      }
      return Date().timeIntervalSince(start)
    }

    /// Answers a request the way the session's workers do: a bare `struct fuse_out_header`.
    func answer() {
      var out: (UInt32, Int32, UInt64) = (16, 0, 1)
      withUnsafeMutableBytes(of: &out) { raw in
        var iov = iovec(iov_base: raw.baseAddress, iov_len: 16)
        _ = zdc_fuse_write_answer(server, &iov, 1)
      }
    }

    /// Waits for an answer on the program's side; whether one came within `timeout` seconds.
    func receiveAnswer(timeout: Int32 = 10_000) -> Bool {
      var p = pollfd(fd: client, events: Int16(POLLIN), revents: 0)
      guard poll(&p, 1, timeout) == 1 else { return false }
      var buf = [UInt8](repeating: 0, count: 64)
      return buf.withUnsafeMutableBytes { Glibc.read(client, $0.baseAddress, 64) } == 16
    }

    /// Ends the session (the workers' reads return 0) and waits for the workers.
    func end(threads: Int) -> Bool {
      Glibc.close(client)
      for _ in 0..<6000 where lock.withLock({ readersDone }) < threads { usleep(1000) }
      Glibc.close(server)
      return lock.withLock { readersDone } == threads
    }
  }

  @Test func aSequentialProgramsShortRequestsAreReadByOneWorker() throws {
    let device = try FakeDevice()
    device.start(threads: 4) { _ in }
    for _ in 0..<300 { #expect(device.send(Self.lookup) != nil) }
    let log = device.lock.withLock { device.log }
    var byWorker: [Int: Int] = [:]
    for entry in log { byWorker[entry.worker, default: 0] += 1 }
    // A burst: one worker polls and reads each request as it comes; the others wait off the
    // device (sleeping in read(2), they would take turns at the requests: about 75 each). On a
    // machine busy with other tests the requests may come further apart than a burst's, when
    // two workers sleep in read(2): so the two busiest read nearly all of them.
    let counts = byWorker.values.sorted(by: >)
    #expect(counts.prefix(2).reduce(0, +) >= 280, "requests read per worker: \(byWorker)")
    #expect(device.end(threads: 4), "a worker still waits after the session ended")
  }

  @Test func nobodyPollsDuringARunOfReads() throws {
    let device = try FakeDevice()
    device.start(threads: 2) { _ in device.answer() }
    func polls(after opcode: UInt32) -> Int {
      device.send(opcode)
      #expect(device.receiveAnswer())
      return Int(zdc_fuse_polling_wanted())
    }
    // After a short request answered within a burst the reader polls; a machine busy with other
    // tests may leave more than a burst's gap between two requests now and then, so once in
    // a while is enough here. A program reading a run of reads waits for each answer in the
    // page cache's read path: a thread polling for its next request would share its CPU and
    // serialize the two. A single read among other requests (a small file's) keeps the polling.
    var afterLookup = 0
    var afterOneRead = 0
    var afterTwoReads = 0
    var afterThreeReads = 0
    for _ in 0..<100 {
      afterLookup += polls(after: Self.lookup)
      afterOneRead += polls(after: Self.read)
      afterTwoReads += polls(after: Self.read)
      afterThreeReads += polls(after: Self.read)
    }
    #expect(afterLookup > 0)
    #expect(afterOneRead > 0)
    #expect(afterTwoReads == 0)
    #expect(afterThreeReads == 0)
    #expect(device.end(threads: 2), "a worker still waits after the session ended")
  }

  @Test(arguments: [Self.read, Self.lookup])
  func aRequestThatBlocksItsWorkerDoesNotHoldUpTheNext(opcode: UInt32) throws {
    let device = try FakeDevice()
    let blocked = Self.ioctl
    device.start(threads: 3) { op in
      if op == blocked { usleep(3_000_000) }
    }
    for _ in 0..<20 { device.send(Self.lookup) }
    // A long request is handed on at once; a short one that blocks all the same is taken over
    // within milliseconds. Either way the next request does not wait for it.
    let first = opcode == Self.read ? Self.read : blocked
    device.send(first)
    if first == Self.read {
      // (This worker's read is quick; the next request also reaches another worker.)
      device.send(Self.lookup)
    }
    device.send(blocked)
    let waited = device.send(Self.lookup, timeout: 2.5)
    #expect(waited != nil, "the request after a blocked one waited for it")
    #expect(waited ?? 99 < 1, "the request after a blocked one waited \(waited ?? 99) s")
    #expect(device.end(threads: 3), "a worker still waits after the session ended")
  }
}
