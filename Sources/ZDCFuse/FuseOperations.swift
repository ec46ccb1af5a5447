import CFuse
import Foundation
import ZDCCore
import ZDCFileSystem

#if canImport(Glibc)
  import Glibc
#endif

/// The low-level callbacks. Each decodes its arguments, makes one call into the engine and sends
/// exactly one reply. They are plain nonisolated functions: libfuse calls them on its threads.
enum FuseOperations {
  /// The mount's context; every request counts as the user's activity (background uploads
  /// give way to it).
  static func context(_ req: fuse_req_t?) -> FuseContext {
    let ctx = Unmanaged<FuseContext>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
    ctx.fs.activity.touch()
    return ctx
  }

  /// A name (or symlink target) the kernel sent. The treesystem's names are UTF-8 text: bytes
  /// that are not UTF-8 name nothing here (`illegalByteSequence`, not a lossy conversion that
  /// would make two names one).
  static func name(_ p: UnsafePointer<CChar>?) throws -> String {
    guard let p else { return "" }
    guard let s = String(validatingCString: p) else { throw FileSystemError.illegalByteSequence }
    return s
  }

  /// The process a request comes from.
  static func caller(_ req: fuse_req_t?) -> Caller {
    guard let c = fuse_req_ctx(req) else { return .superuser }
    return Caller(uid: c.pointee.uid, gid: c.pointee.gid)
  }

  /// Refuses an access that `ino`'s permission bits do not give the caller, when the kernel
  /// leaves permission checks to the file system (no `default_permissions`); the superuser
  /// passes.
  static func require(
    _ req: fuse_req_t?, _ ctx: FuseContext, _ ino: fuse_ino_t, _ mask: AccessMask
  ) throws {
    guard !ctx.kernelChecksPermissions else { return }
    let c = caller(req)
    guard !c.isSuperuser else { return }
    try ctx.fs.checkAccess(Inode(ino), mask, caller: c)
  }

  /// Refuses a change of a directory's entries the caller may not make (see ``require``).
  static func requireEntryChange(_ req: fuse_req_t?, _ parent: fuse_ino_t) throws {
    try require(req, context(req), parent, [.write, .execute])
  }

  /// Refuses a change of an inode's mode or times by a caller that neither owns the inode
  /// nor is the superuser (`utimensat` to the current time needs only write access), when
  /// the kernel leaves permission checks to the file system.
  static func requireOwner(
    _ req: fuse_req_t?, _ ctx: FuseContext, _ ino: fuse_ino_t, orWrite: Bool
  ) throws {
    guard !ctx.kernelChecksPermissions else { return }
    let c = caller(req)
    guard !c.isSuperuser, try ctx.fs.getattr(Inode(ino)).uid != c.uid else { return }
    if orWrite {
      try ctx.fs.checkAccess(Inode(ino), .write, caller: c)
    } else {
      throw FileSystemError.notPermitted
    }
  }

  static func stat(_ a: Attributes) -> stat {
    var st = Glibc.stat()
    st.st_ino = ino_t(a.inode)
    let typeBits: UInt32
    switch a.type {
    case .regular: typeBits = S_IFREG
    case .directory: typeBits = S_IFDIR
    case .symlink: typeBits = S_IFLNK
    case .fifo: typeBits = S_IFIFO
    case .socket: typeBits = S_IFSOCK
    }
    st.st_mode = mode_t(typeBits | a.mode)
    st.st_nlink = nlink_t(a.linkCount)
    st.st_uid = a.uid
    st.st_gid = a.gid
    st.st_size = off_t(Int64(bitPattern: a.size))
    st.st_blksize = 4096
    st.st_blocks = blkcnt_t((a.size + 511) / 512)
    let t = timespec(tv_sec: Int(a.mtime.seconds), tv_nsec: Int(a.mtime.nanoseconds))
    let c = timespec(tv_sec: Int(a.ctime.seconds), tv_nsec: Int(a.ctime.nanoseconds))
    st.st_mtim = t
    st.st_atim = t
    st.st_ctim = c
    return st
  }

  static func entry(_ a: Attributes, _ ctx: FuseContext) -> fuse_entry_param {
    var e = zdc_fuse_entry_param_zero()
    e.ino = fuse_ino_t(a.inode)
    e.generation = 1
    e.attr = stat(a)
    e.attr_timeout = ctx.timeout
    e.entry_timeout = ctx.timeout
    return e
  }

  static func fail(_ req: fuse_req_t?, _ error: any Error) {
    fuse_reply_err(req, logged(error, context(req), what: "request"))
  }

  /// The errno for `error`, logged: a warning for I/O errors and a full disk, else at debug
  /// level.
  static func logged(_ error: any Error, _ ctx: FuseContext, what: String) -> Int32 {
    let code = errnoCode(for: error)
    if code == EIO || code == ENOSPC {
      ctx.log.warning("\(what) failed: \(error)")
    } else {
      ctx.log.debug("\(what) failed with errno \(code)")
    }
    return code
  }

  static func replyEntry(_ req: fuse_req_t?, _ body: (FileSystem) throws -> Attributes) {
    let ctx = context(req)
    do {
      var e = entry(try body(ctx.fs), ctx)
      fuse_reply_entry(req, &e)
    } catch { fail(req, error) }
  }

  static func replyAttr(_ req: fuse_req_t?, _ body: (FileSystem) throws -> Attributes) {
    let ctx = context(req)
    do {
      var st = stat(try body(ctx.fs))
      fuse_reply_attr(req, &st, ctx.timeout)
    } catch { fail(req, error) }
  }

  static func replyOK(_ req: fuse_req_t?, _ body: (FileSystem) throws -> Void) {
    do {
      try body(context(req).fs)
      fuse_reply_err(req, 0)
    } catch { fail(req, error) }
  }

  static func time(_ ts: timespec) -> FileTime {
    FileTime(seconds: Int64(ts.tv_sec), nanoseconds: Int32(ts.tv_nsec))
  }

  static func fill(_ ops: inout fuse_lowlevel_ops) {
    ops.`init` = { userdata, conn in
      guard let conn else { return }
      // Directories open without a round trip (and without RELEASEDIR); the kernel keeps
      // their listings, which directory changes and pulls invalidate.
      zdc_conn_want(conn, UInt32(FUSE_CAP_NO_OPENDIR_SUPPORT))
      if zdc_conn_wanted(conn) & UInt32(FUSE_CAP_NO_OPENDIR_SUPPORT) != 0, let userdata {
        Unmanaged<FuseContext>.fromOpaque(userdata).takeUnretainedValue()
          .kernelSkipsOpendir.store(true, ordering: .releasing)
      }
      zdc_conn_want(conn, UInt32(FUSE_CAP_ATOMIC_O_TRUNC))
      zdc_conn_want(conn, UInt32(FUSE_CAP_READDIRPLUS))
      zdc_conn_want(conn, UInt32(FUSE_CAP_READDIRPLUS_AUTO))
      zdc_conn_want(conn, UInt32(FUSE_CAP_ASYNC_READ))
      zdc_conn_want(conn, UInt32(FUSE_CAP_SPLICE_READ))
      // Write-back caching would let the kernel reorder size and mtime changes; not handled.
      zdc_conn_unwant(conn, UInt32(FUSE_CAP_WRITEBACK_CACHE))
      // No lock callbacks: the kernel keeps POSIX and flock locks locally.
      zdc_conn_unwant(conn, UInt32(FUSE_CAP_POSIX_LOCKS))
      zdc_conn_unwant(conn, UInt32(FUSE_CAP_FLOCK_LOCKS))
      conn.pointee.max_write = 1 << 20
      conn.pointee.max_readahead = 1 << 20
    }
    ops.lookup = { req, parent, name in
      let ctx = FuseOperations.context(req)
      do {
        let n = try FuseOperations.name(name)
        try FuseOperations.require(req, ctx, parent, .execute)
        var e = FuseOperations.entry(try ctx.fs.lookup(parent: Inode(parent), name: n), ctx)
        fuse_reply_entry(req, &e)
      } catch FileSystemError.notFound, FileSystemError.illegalByteSequence {
        // A negative entry the kernel may cache (a pull that adds the name invalidates it),
        // so `open(O_CREAT)` after a failed lookup does not ask again. A name that is not
        // UTF-8 names nothing (creating it is refused).
        var e = zdc_fuse_entry_param_zero()
        e.entry_timeout = ctx.timeout
        fuse_reply_entry(req, &e)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.forget = { req, ino, nlookup in
      FuseOperations.context(req).fs.forget(Inode(ino), count: nlookup)
      fuse_reply_none(req)
    }
    ops.forget_multi = { req, count, forgets in
      let fs = FuseOperations.context(req).fs
      if let forgets {
        for i in 0..<count { fs.forget(Inode(forgets[i].ino), count: forgets[i].nlookup) }
      }
      fuse_reply_none(req)
    }
    ops.getattr = { req, ino, _ in
      FuseOperations.replyAttr(req) { try $0.getattr(Inode(ino)) }
    }
    ops.setattr = { req, ino, attr, toSet, fi in
      var changes = AttributeChanges()
      if let a = attr?.pointee {
        if toSet & FUSE_SET_ATTR_MODE != 0 { changes.mode = UInt32(a.st_mode) & 0o7777 }
        if toSet & FUSE_SET_ATTR_UID != 0 { changes.uid = a.st_uid }
        if toSet & FUSE_SET_ATTR_GID != 0 { changes.gid = a.st_gid }
        if toSet & FUSE_SET_ATTR_SIZE != 0 { changes.size = UInt64(max(0, a.st_size)) }
        if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 {
          changes.mtime = .now
        } else if toSet & FUSE_SET_ATTR_MTIME != 0 {
          changes.mtime = .time(FuseOperations.time(a.st_mtim))
        }
        if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 {
          changes.atime = .now
        } else if toSet & FUSE_SET_ATTR_ATIME != 0 {
          changes.atime = .time(FuseOperations.time(a.st_atim))
        }
      }
      let handle = fi.map { FileHandleID($0.pointee.fh) }
      let ctx = FuseOperations.context(req)
      FuseOperations.replyAttr(req) { fs in
        if changes.size != nil, handle == nil { try FuseOperations.require(req, ctx, ino, .write) }
        if changes.mode != nil || changes.mtime != nil || changes.atime != nil {
          let onlyNow =
            changes.mode == nil
            && [changes.mtime, changes.atime].allSatisfy { $0 == nil || $0 == .now }
          try FuseOperations.requireOwner(req, ctx, ino, orWrite: onlyNow)
        }
        let a = try fs.setattr(
          Inode(ino), changes, handle: handle, caller: FuseOperations.caller(req))
        if changes.size != nil { ctx.waitForStores(ino) }
        return a
      }
      // A directory that lost search or read bits has the kernel forget its entries and
      // listing: delivered before this thread takes another request, so the next path lookup
      // through it (`chmod 0600 d; cat d/a`) meets the check.
      ctx.fs.settleNotifications()
    }
    ops.readlink = { req, ino in
      do {
        let target = try FuseOperations.context(req).fs.readlink(Inode(ino))
        fuse_reply_readlink(req, target)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.mkdir = { req, parent, name, mode in
      FuseOperations.replyEntry(req) {
        let n = try FuseOperations.name(name)
        try FuseOperations.requireEntryChange(req, parent)
        return try $0.mkdir(parent: Inode(parent), name: n, mode: UInt32(mode))
      }
    }
    ops.mknod = { req, parent, name, mode, _ in
      FuseOperations.replyEntry(req) {
        let n = try FuseOperations.name(name)
        try FuseOperations.requireEntryChange(req, parent)
        return try $0.mknod(parent: Inode(parent), name: n, mode: UInt32(mode))
      }
    }
    ops.symlink = { req, link, parent, name in
      FuseOperations.replyEntry(req) {
        let n = try FuseOperations.name(name)
        let target = try FuseOperations.name(link)
        try FuseOperations.requireEntryChange(req, parent)
        return try $0.symlink(target: target, parent: Inode(parent), name: n)
      }
    }
    ops.link = { req, ino, newParent, newName in
      FuseOperations.replyEntry(req) {
        let n = try FuseOperations.name(newName)
        return try $0.link(Inode(ino), newParent: Inode(newParent), newName: n)
      }
    }
    ops.unlink = { req, parent, name in
      FuseOperations.replyOK(req) {
        let n = try FuseOperations.name(name)
        try FuseOperations.requireEntryChange(req, parent)
        try $0.unlink(parent: Inode(parent), name: n)
      }
    }
    ops.rmdir = { req, parent, name in
      FuseOperations.replyOK(req) {
        let n = try FuseOperations.name(name)
        try FuseOperations.requireEntryChange(req, parent)
        try $0.rmdir(parent: Inode(parent), name: n)
      }
    }
    ops.rename = { req, parent, name, newParent, newName, flags in
      let ctx = FuseOperations.context(req)
      FuseOperations.replyOK(req) {
        let a = try FuseOperations.name(name)
        let b = try FuseOperations.name(newName)
        try FuseOperations.require(req, ctx, parent, [.write, .execute])
        if newParent != parent {
          try FuseOperations.require(req, ctx, newParent, [.write, .execute])
          if !ctx.kernelChecksPermissions {
            let caller = FuseOperations.caller(req)
            try $0.checkDirectoryMove(
              parent: Inode(parent), name: a, newParent: Inode(newParent), caller: caller)
            // An exchange moves the target the other way.
            if RenameFlags(rawValue: flags).contains(.exchange) {
              try $0.checkDirectoryMove(
                parent: Inode(newParent), name: b, newParent: Inode(parent), caller: caller)
            }
          }
        }
        try $0.rename(
          parent: Inode(parent), name: a, newParent: Inode(newParent), newName: b,
          flags: RenameFlags(rawValue: flags))
      }
    }
    ops.open = { req, ino, fi in
      do {
        guard let fi else { throw FileSystemError.badHandle }
        let ctx = FuseOperations.context(req)
        let flags = fi.pointee.flags
        var mask: AccessMask = []
        let accmode = flags & O_ACCMODE
        if accmode != O_WRONLY { mask.insert(.read) }
        if accmode != O_RDONLY || flags & O_TRUNC != 0 { mask.insert(.write) }
        try FuseOperations.require(req, ctx, ino, mask)
        let opened = try ctx.fs.open(Inode(ino), flags: flags, caller: FuseOperations.caller(req))
        if flags & O_ACCMODE != O_RDONLY { ctx.waitForStores(ino) }
        fi.pointee.fh = UInt64(opened.handle)
        zdc_fi_set_keep_cache(fi, opened.keepCache ? 1 : 0)
        // `flush` commits writes only: a read-only descriptor's close needs no round trip.
        zdc_fi_set_noflush(fi, fi.pointee.flags & O_ACCMODE == O_RDONLY ? 1 : 0)
        fuse_reply_open(req, fi)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.create = { req, parent, name, mode, fi in
      let ctx = FuseOperations.context(req)
      do {
        let n = try FuseOperations.name(name)
        guard let fi else { throw FileSystemError.badHandle }
        try FuseOperations.requireEntryChange(req, parent)
        let (attrs, opened) = try ctx.fs.create(
          parent: Inode(parent), name: n, mode: UInt32(mode), flags: fi.pointee.flags,
          caller: FuseOperations.caller(req))
        // It may have opened an existing file (a name another device just created).
        ctx.waitForStores(fuse_ino_t(attrs.inode))
        fi.pointee.fh = UInt64(opened.handle)
        // Its writes bypass the page cache. The cache of a file this descriptor writes goes at
        // the next open anyway (a writable open forgets what the kernel may keep), and the
        // kernel then asks no `security.capability` question before the file's first write.
        // Only where shared mappings of such a descriptor still work, and the kernel drops
        // cached pages a write changes (FUSE_DIRECT_IO_ALLOW_MMAP).
        if zdc_fuse_direct_io_mmap_state() & 2 != 0 { zdc_fi_set_direct_io(fi, 1) }
        var e = FuseOperations.entry(attrs, ctx)
        fuse_reply_create(req, &e, fi)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.read = { req, ino, size, off, fi in
      let ctx = FuseOperations.context(req)
      let n: Int
      do {
        guard let fi else { throw FileSystemError.badHandle }
        let buf = ReplyBuffers.shared.take(size)
        var used = size  // until the read says how much it wrote
        defer { ReplyBuffers.shared.give(buf, used: used) }
        n = try ctx.fs.read(
          FileHandleID(fi.pointee.fh), offset: UInt64(max(0, off)),
          into: UnsafeMutableRawBufferPointer(rebasing: buf[0..<size]))
        used = n
        ctx.fs.activity.touch()  // as `fsync`: a read may have waited for a download
        fuse_reply_buf(req, buf.baseAddress?.assumingMemoryBound(to: CChar.self), n)
      } catch {
        FuseOperations.fail(req, error)
        return
      }
      // After the reply (its pages are unlocked then): the rest of the chunk it decrypted.
      if let fi {
        FuseOperations.storeChunk(ctx, ino, FileHandleID(fi.pointee.fh), UInt64(max(0, off)), n)
      }
    }
    ops.write = { req, _, bytes, size, off, fi in
      do {
        guard let fi else { throw FileSystemError.badHandle }
        let n = try FuseOperations.context(req).fs.write(
          FileHandleID(fi.pointee.fh), offset: UInt64(max(0, off)),
          bytes: UnsafeRawBufferPointer(start: bytes, count: size),
          fromPageCache: zdc_fi_get_writepage(fi) != 0)
        fuse_reply_write(req, n)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.fallocate = { req, _, mode, off, length, fi in
      let h = fi.map { FileHandleID($0.pointee.fh) } ?? 0
      // (Never ENOSYS: the kernel would stop sending any mode.)
      FuseOperations.replyOK(req) {
        guard off >= 0, length >= 0 else { throw FileSystemError.invalidArgument }
        try $0.fallocate(
          h, mode: FileSystem.AllocationMode(rawValue: mode), offset: UInt64(off),
          length: UInt64(length))
      }
    }
    ops.flush = { req, _, fi in
      let h = fi.map { FileHandleID($0.pointee.fh) } ?? 0
      FuseOperations.replyOK(req) { try $0.flush(h) }
    }
    ops.release = { req, _, fi in
      let h = fi.map { FileHandleID($0.pointee.fh) } ?? 0
      guard zdc_fuse_uring_state() != Int32(ZDC_URING_ACTIVE) else {
        FuseOperations.replyOK(req) { try $0.release(h) }
        return
      }
      // Answered first, then done on this worker: the kernel sends a release after `close(2)`
      // has returned and waits for nothing from it, so the program's next request goes to
      // another worker (usually the polling one) at once. A queue of its own woke a thread
      // per release, which cost the daemon more CPU than the release itself.
      let ctx = FuseOperations.context(req)
      fuse_reply_err(req, 0)
      do { try ctx.fs.release(h) } catch { _ = FuseOperations.logged(error, ctx, what: "release") }
    }
    ops.fsync = { req, _, _, fi in
      let h = fi.map { FileHandleID($0.pointee.fh) } ?? 0
      FuseOperations.replyOK(req) { fs in
        // The program waited all along (a large file's flush to the disk takes seconds):
        // background uploads count it as busy until the answer, not from the request.
        defer { fs.activity.touch() }
        try fs.fsync(h)
      }
    }
    ops.opendir = { req, ino, fi in
      do {
        let ctx = FuseOperations.context(req)
        // ENOSYS tells the kernel not to ask again; READDIR checks read permission instead.
        if ctx.kernelSkipsOpendir.load(ordering: .acquiring) {
          fuse_reply_err(req, ENOSYS)
          return
        }
        let attrs = try ctx.fs.getattr(Inode(ino))
        guard attrs.type == .directory else { throw FileSystemError.notADirectory }
        try FuseOperations.require(req, ctx, ino, .read)
        fuse_reply_open(req, fi)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.releasedir = { req, _, _ in fuse_reply_err(req, 0) }
    ops.fsyncdir = { req, _, _, _ in
      FuseOperations.replyOK(req) { fs in
        defer { fs.activity.touch() }  // as `fsync`
        try fs.fsyncDirectory()
      }
    }
    ops.readdir = { req, ino, size, off, _ in
      FuseOperations.readdir(req, ino, size, off, plus: false)
    }
    ops.readdirplus = { req, ino, size, off, _ in
      FuseOperations.readdir(req, ino, size, off, plus: true)
    }
    ops.statfs = { req, _ in
      let s = FuseOperations.context(req).fs.statfs()
      var v = statvfs()
      v.f_bsize = UInt(s.blockSize)
      v.f_frsize = UInt(s.blockSize)
      v.f_blocks = fsblkcnt_t(s.blocks)
      v.f_bfree = fsblkcnt_t(s.freeBlocks)
      v.f_bavail = fsblkcnt_t(s.availableBlocks)
      v.f_files = fsfilcnt_t(s.files)
      v.f_ffree = fsfilcnt_t(s.freeFiles)
      v.f_favail = fsfilcnt_t(s.freeFiles)
      v.f_namemax = UInt(s.nameMax)
      fuse_reply_statfs(req, &v)
    }
    ops.setxattr = { req, ino, name, value, size, flags in
      let data = value.map { Data(bytes: $0, count: size) } ?? Data()
      let mode: XattrMode =
        flags & 1 != 0 ? .create : (flags & 2 != 0 ? .replace : .any)  // XATTR_CREATE, _REPLACE
      FuseOperations.replyOK(req) {
        let n = try FuseOperations.name(name)
        if n.hasPrefix("user.") {
          try FuseOperations.require(req, FuseOperations.context(req), ino, .write)
        }
        try $0.setxattr(Inode(ino), name: n, value: data, mode: mode)
      }
    }
    ops.getxattr = { req, ino, name, size in
      do {
        let n = try FuseOperations.name(name)
        // Only `user.` names are checked: the kernel's own `security.capability` question
        // before a write must not fail on a file the writer may not read.
        let ctx = FuseOperations.context(req)
        if n.hasPrefix("user.") { try FuseOperations.require(req, ctx, ino, .read) }
        let v = try ctx.fs.getxattr(Inode(ino), name: n)
        FuseOperations.replyXattr(req, v, size)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.listxattr = { req, ino, size in
      do {
        // Listing needs no permission bits (as on a local file system); reading a value does.
        let names = try FuseOperations.context(req).fs.listxattr(Inode(ino))
        var bytes = Data()
        for n in names {
          bytes.append(contentsOf: Array(n.utf8))
          bytes.append(0)
        }
        FuseOperations.replyXattr(req, bytes, size)
      } catch { FuseOperations.fail(req, error) }
    }
    ops.removexattr = { req, ino, name in
      FuseOperations.replyOK(req) {
        let n = try FuseOperations.name(name)
        if n.hasPrefix("user.") {
          try FuseOperations.require(req, FuseOperations.context(req), ino, .write)
        }
        try $0.removexattr(Inode(ino), name: n)
      }
    }
    ops.access = { req, ino, mask in
      let caller = FuseOperations.caller(req)
      FuseOperations.replyOK(req) { try $0.access(Inode(ino), mask: mask, caller: caller) }
    }
  }

  /// Puts the rest of the chunk a small read decrypted into the kernel's page cache, so that
  /// reads of its other pages (random reads) need no request.
  ///
  /// Only after the read's reply, so that none of the pages it stores is locked by that read,
  /// and on the context's store queue, never on a worker (see `FuseContext.storeQueue`). A
  /// store marks its inode, then checks that the chunk is current (no writable handle, same
  /// version); a writable open, or a size change, waits for a marked store of its inode after
  /// the engine counted it and before the kernel hears of it (`waitForStores`). So a store
  /// either ends before the kernel can write or truncate those pages (a writable open then
  /// drops the stored pages, as `keep_cache` is off for it), or sees the change and stores
  /// nothing; if that wait gave up (a store stuck on page locks for over a second), the store
  /// invalidates what it stored once it ends.
  static func storeChunk(
    _ ctx: FuseContext, _ ino: fuse_ino_t, _ h: FileHandleID, _ offset: UInt64, _ count: Int
  ) {
    guard count > 0, count < FileSystem.contentChunkSize, let se = ctx.session else { return }
    let buf = UnsafeMutableRawBufferPointer.allocate(
      byteCount: FileSystem.contentChunkSize, alignment: 16)
    defer { buf.deallocate() }
    guard let chunk = ctx.fs.chunkForPageCache(h, at: offset, count: count, into: buf) else {
      return
    }
    let page: UInt64 = 4096
    let start = chunk.offset
    let end = chunk.offset + UInt64(chunk.count)
    // The pages before and after the read (the read's own pages are in place already).
    let readStart = max(start, offset & ~(page - 1))
    let readEnd = min(end, (offset + UInt64(count) + page - 1) & ~(page - 1))
    let pieces = [(start, readStart), (readEnd, end)].filter { $0.1 > $0.0 }
    guard !pieces.isEmpty, ctx.reserveStore() else { return }
    let bytes = Data(UnsafeRawBufferPointer(rebasing: buf[0..<chunk.count]))
    let session = SessionRef(se)
    ctx.storeQueue.async {
      ctx.beginStore(ino)
      var stored = false
      if ctx.fs.pageCacheChunkIsCurrent(h, chunk) {
        bytes.withUnsafeBytes { b in
          for (a, e) in pieces {
            let rc = zdc_notify_store(
              session.pointer, ino, off_t(a), b.baseAddress! + Int(a - start), Int(e - a))
            if rc != 0 {
              ctx.log.debug("page cache store failed: \(rc)")
              break
            }
            stored = true
          }
        }
      }
      if ctx.endStore(ino) && stored {
        _ = fuse_lowlevel_notify_inval_inode(
          session.pointer, ino, off_t(start), off_t(chunk.count))
      }
    }
  }

  /// The session pointer, handed to the store queue (the session outlives the loop's work).
  struct SessionRef: @unchecked Sendable {
    let pointer: OpaquePointer
    init(_ p: OpaquePointer) { pointer = p }
  }

  /// Replies to a size query (size 0) with the size, else with the bytes or ERANGE.
  static func replyXattr(_ req: fuse_req_t?, _ value: Data, _ size: Int) {
    if size == 0 {
      fuse_reply_xattr(req, value.count)
    } else if value.count > size {
      fail(req, FileSystemError.range)
    } else {
      _ = value.withUnsafeBytes {
        fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), value.count)
      }
    }
  }

  static func readdir(_ req: fuse_req_t?, _ ino: fuse_ino_t, _ size: Int, _ off: off_t, plus: Bool)
  {
    let ctx = context(req)
    let buf = UnsafeMutablePointer<CChar>.allocate(capacity: max(size, 1))
    defer { buf.deallocate() }
    var used = 0
    do {
      if ctx.kernelSkipsOpendir.load(ordering: .acquiring) {
        try require(req, ctx, ino, .read)
      }
      // An entry takes at least 24 bytes plus its name (152 with attributes).
      let expected = size / (plus ? 176 : 40) + 2
      try ctx.fs.readdir(Inode(ino), offset: UInt64(max(0, off)), plus: plus, expected: expected) {
        entry in
        let left = size - used
        let need: Int = entry.name.withCString { name in
          if plus {
            var e = FuseOperations.entry(entry.attributes, ctx)
            if entry.name == "." || entry.name == ".." {
              // Not looked up: the kernel does not count these.
              e.ino = 0
              e.attr.st_ino = ino_t(entry.attributes.inode)
            }
            return fuse_add_direntry_plus(
              req, buf + used, left, name, &e, off_t(Int64(bitPattern: entry.nextOffset)))
          }
          var st = FuseOperations.stat(entry.attributes)
          return fuse_add_direntry(
            req, buf + used, left, name, &st, off_t(Int64(bitPattern: entry.nextOffset)))
        }
        guard need <= left else { return false }
        used += need
        return true
      }
      fuse_reply_buf(req, buf, used)
    } catch { fail(req, error) }
  }
}

/// Reply buffers of reads, reused: a buffer of a large read (up to 1 MiB) allocated per request
/// came from a fresh mapping each time, and faulting its pages in, then unmapping them, cost
/// about a third of a sequential read. Buffers go back cleared (of the bytes a read put there).
final class ReplyBuffers: @unchecked Sendable {
  // @unchecked: `free` is guarded by `lock`.
  /// Bytes per pooled buffer: the largest read the kernel sends (`max_readahead`, `max_pages`).
  static let capacity = 1 << 20
  /// Buffers kept at most.
  static let kept = 8
  static let shared = ReplyBuffers()
  private let lock = NSLock()
  private var free: [UnsafeMutableRawBufferPointer] = []

  /// A buffer of at least `size` bytes (at least one).
  func take(_ size: Int) -> UnsafeMutableRawBufferPointer {
    guard size <= Self.capacity else {
      return .allocate(byteCount: max(1, size), alignment: 16)
    }
    return lock.withLock { free.popLast() }
      ?? .allocate(byteCount: Self.capacity, alignment: 16)
  }

  /// Returns a buffer whose first `used` bytes a read wrote.
  func give(_ buffer: UnsafeMutableRawBufferPointer, used: Int) {
    if used > 0 { explicit_bzero(buffer.baseAddress!, min(used, buffer.count)) }
    let keep =
      buffer.count == Self.capacity
      && lock.withLock { () -> Bool in
        guard free.count < Self.kept else { return false }
        free.append(buffer)
        return true
      }
    if !keep { buffer.deallocate() }
  }
}
