import Glibc
import RoomcastIO

/// A box of client descriptors (docs/operations/restarts.md, "Restarts, upgrades and crashes"): the receive
/// queue of an AF_UNIX stream socketpair, holding the descriptors in flight
/// (SCM_RIGHTS), 253 per message with their keys as the message's bytes
/// (little-endian, one per descriptor, in the same order; u32 for a
/// hand-over's own box, which earlier releases read too, u64 for the live
/// box's 64-bit serials: the reader tells them apart by the bytes per
/// descriptor). Only the
/// read end goes into systemd's fd store: one descriptor, where one per
/// client costs PID 1 O(n²) `kcmp` calls (1,000 clients: 0.55 s; 10,000: 59 s).
///
/// The write end is non-blocking: a full box gives `put` a short count, never
/// a stalled process (a blocking one deadlocked the prototype).
struct HandOverBox {
    let readEnd: Int32
    let writeEnd: Int32

    /// One entry: a descriptor and the key of its state record.
    struct Entry {
        var key: UInt64?
        var fd: Int32
    }

    /// A new, empty box, both ends close-on-exec, the write end non-blocking.
    /// - Parameter sendBuffer: the SO_SNDBUF asked for, in bytes (what the
    ///   box holds: the kernel caps it at net.core.wmem_max).
    /// - Throws: `SystemError` from socketpair(2).
    static func make(sendBuffer: Int32 = 4 << 20) throws(SystemError) -> HandOverBox {
        var sv: [Int32] = [-1, -1]
        _ = try Sys.blocking("socketpair") { socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &sv) }
        do { try Sys.setNonBlocking(sv[1]) } catch {
            Sys.close(sv[0])
            Sys.close(sv[1])
            throw error
        }
        // Room for more than the 212 KiB default (best effort: capped at
        // net.core.wmem_max; SO_SNDBUFFORCE needs CAP_NET_ADMIN).
        Sys.setOption(sv[1], SOL_SOCKET, SO_SNDBUF, sendBuffer)
        return HandOverBox(readEnd: sv[0], writeEnd: sv[1])
    }

    /// Puts `entries` into the box, `CSHIM_MAX_FDS_PER_MESSAGE` per sendmsg(2),
    /// with u64 keys (`wideKeys`) or u32 keys (each must fit).
    /// - Returns: how many went in; fewer than all when the box is full
    ///   (EAGAIN) or sendmsg fails (the error, for the log).
    func put(_ entries: ArraySlice<(key: UInt64, fd: Int32)>, wideKeys: Bool = true) -> (count: Int, error: SystemError?) {
        var sent = 0
        var start = entries.startIndex
        while start < entries.endIndex {
            let end = min(start + Sys.maxDescriptorsPerMessage, entries.endIndex)
            var keys: [UInt8] = []
            keys.reserveCapacity((end - start) * 8)
            for e in entries[start..<end] {
                if wideKeys {
                    withUnsafeBytes(of: e.key.littleEndian) { keys.append(contentsOf: $0) }
                } else {
                    withUnsafeBytes(of: UInt32(e.key).littleEndian) { keys.append(contentsOf: $0) }
                }
            }
            switch keys.withUnsafeBytes({ Sys.sendDescriptors(writeEnd, $0, entries[start..<end].map(\.fd)) }) {
            case .done(let n) where n == keys.count:
                break
            case .done:
                // A stream socket takes part of the bytes only when the box is
                // nearly full; the descriptors went with the first byte, and
                // keys cut off would make the box unreadable.
                return (sent, SystemError("sendmsg to the hand-over box: short write", errno: EAGAIN))
            case .wouldBlock, .endOfFile:
                return (sent, nil)
            case .failed(let e):
                return (sent, SystemError("sendmsg to the hand-over box", errno: e))
            }
            sent += end - start
            start = end
        }
        return (sent, nil)
    }

    /// How many descriptors one box holds on this machine: its send buffer
    /// (SO_SNDBUF as granted, capped by net.core.wmem_max) over what one
    /// message of `Sys.maxDescriptorsPerMessage` costs there (SO_MEMINFO,
    /// the skb's truesize: 2,304 bytes on Linux 6.18, so about 46,800 at the
    /// default wmem_max of 212,992 bytes), measured with a pipe's descriptor.
    /// nil when it cannot be measured.
    static func measureCapacity() -> Int? {
        guard let box = try? make() else { return nil }
        defer {
            Sys.close(box.writeEnd)
            Sys.close(box.readEnd)
        }
        var p: [Int32] = [-1, -1]
        guard pipe(&p) == 0 else { return nil }
        defer { p.forEach(Sys.close) }
        let entries = (0..<Sys.maxDescriptorsPerMessage).map { (key: UInt64($0), fd: p[0]) }
        guard box.put(entries[...]).count == entries.count else { return nil }
        // SO_MEMINFO (socket(7)): u32 SK_MEMINFO_VARS; [2] wmem_alloc, [3] sndbuf.
        var info = [UInt32](repeating: 0, count: 9)
        var size = socklen_t(info.count * 4)
        guard info.withUnsafeMutableBytes({ getsockopt(box.writeEnd, SOL_SOCKET, 55, $0.baseAddress, &size) }) == 0, info[2] > 0 else { return nil }
        return Int(info[3]) / Int(info[2]) * Sys.maxDescriptorsPerMessage
    }

    /// Closes the write end: the box is complete (its reader sees EOF after
    /// the last entry).
    func seal() { Sys.close(writeEnd) }

    /// Takes every descriptor out of a box whose write end is closed (or
    /// whose writer died), then closes `readEnd`.
    /// - Returns: the entries in the order they were put in, u32 or u64 keys
    ///   as the bytes per descriptor say. When keys and
    ///   descriptors do not pair up (a damaged box), every key is nil:
    ///   the connections are served with fresh state. `problem` says why.
    static func drain(_ readEnd: Int32) -> (entries: [Entry], problem: String?) {
        defer { Sys.close(readEnd) }
        try? Sys.setNonBlocking(readEnd)
        var keyBytes: [UInt8] = []
        var fds: [Int32] = []
        var problem: String?
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var truncated = false
        reading: while true {
            switch buffer.withUnsafeMutableBytes({ Sys.receiveDescriptors(readEnd, into: $0, fds: &fds, truncated: &truncated) }) {
            case .done(let n): keyBytes += buffer[0..<n]
            case .endOfFile, .wouldBlock: break reading
            case .failed(let e):
                problem = SystemError("recvmsg from the hand-over box", errno: e).description
                break reading
            }
        }
        if truncated { problem = "descriptors were cut off (MSG_CTRUNC): the kernel closed them" }
        if problem == nil, keyBytes.count != fds.count * 4 && keyBytes.count != fds.count * 8 {
            problem = "\(keyBytes.count) key bytes for \(fds.count) descriptors"
        }
        if problem != nil { return (fds.map { Entry(key: nil, fd: $0) }, problem) }
        let wide = keyBytes.count == fds.count * 8
        let entries = fds.indices.map { i in
            Entry(key: keyBytes.withUnsafeBytes {
                wide ? UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: i * 8, as: UInt64.self))
                     : UInt64(UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: i * 4, as: UInt32.self)))
            }, fd: fds[i])
        }
        return (entries, nil)
    }
}

/// The hand-over state in a sealed memfd: written once, then nobody, not
/// even a process that gets hold of it later, can change it.
enum StateFile {
    /// A memfd holding `bytes`, sealed against writes, growth and shrinking.
    /// - Throws: `SystemError` from memfd_create(2), write(2) or fcntl(2).
    static func make(_ bytes: [UInt8], name: String) throws(SystemError) -> Int32 {
        try Sys.sealedMemfd(name, bytes)
    }

    /// The whole content of a state memfd (at most `limit` bytes), read from
    /// offset 0 whatever its file position.
    /// - Throws: `SystemError` from fstat(2) or pread(2); EFBIG over `limit`.
    static func read(_ fd: Int32, limit: Int) throws(SystemError) -> [UInt8] {
        var st = stat()
        _ = try Sys.blocking("fstat of the state") { fstat(fd, &st) }
        let size = Int(st.st_size)
        guard size <= limit else { throw SystemError("state of \(size) bytes", errno: EFBIG) }
        var bytes = [UInt8](repeating: 0, count: size)
        var offset = 0
        while offset < size {
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + offset, size - offset, off_t(offset)) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw SystemError("pread of the state", errno: errno) }
            if n == 0 { break }
            offset += n
        }
        return Array(bytes[0..<offset])
    }
}
