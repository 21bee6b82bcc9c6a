@preconcurrency import Glibc

/// CPU seconds a process has used, in user space and in the kernel.
struct CPUTimes {
    var user: Double
    var system: Double
    var total: Double { user + system }
    static func - (a: CPUTimes, b: CPUTimes) -> CPUTimes { CPUTimes(user: a.user - b.user, system: a.system - b.system) }
}

/// This process's CPU times, from getrusage(2).
func selfCPUTimes() -> CPUTimes {
    var ru = rusage()
    getrusage(RUSAGE_SELF.rawValue, &ru)
    return CPUTimes(user: Double(ru.ru_utime.tv_sec) + Double(ru.ru_utime.tv_usec) / 1e6,
                    system: Double(ru.ru_stime.tv_sec) + Double(ru.ru_stime.tv_usec) / 1e6)
}

/// CPU seconds (user + system) this process has used, from getrusage(2).
func selfCPUSeconds() -> Double { selfCPUTimes().total }

/// Seconds this (one-thread) process was runnable but waiting for a CPU.
func selfRunQueueWaitSeconds() -> Double { schedstatWait("/proc/self/schedstat") ?? 0 }

/// The run-queue wait of a schedstat file (nanoseconds, the second field) in seconds.
private func schedstatWait(_ path: String) -> Double? {
    guard let s = readProcFile(path) else { return nil }
    let fields = s.split(whereSeparator: { $0 == " " || $0 == "\n" })
    guard fields.count >= 2, let ns = Double(fields[1]) else { return nil }
    return ns / 1e9
}

/// Peak RSS of this process in KiB (getrusage ru_maxrss).
func selfMaxRSSKiB() -> Int {
    var ru = rusage()
    getrusage(RUSAGE_SELF.rawValue, &ru)
    return Int(ru.ru_maxrss)
}

/// Reads a /proc file whole, with read(2) until end of file; nil if it cannot
/// be opened or a read fails. Not `String(contentsOfFile:)`: Foundation trusts
/// st_size, which is 0 for /proc files, and returns only the first read, one
/// page (4 KiB): /proc/net/tcp with 300 sockets is 45 KB. The tests use it too.
func readProcFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n < 0 { return nil }
        if n == 0 { break }
        bytes.append(contentsOf: chunk[0..<n])
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// Another process (the server under test) seen through /proc.
struct ProcessProbe {
    let pid: Int32
    static let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))

    /// VmRSS in KiB from /proc/PID/status.
    func rssKiB() -> Int? {
        guard let s = readProcFile("/proc/\(pid)/status") else { return nil }
        for line in s.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return Int(line.dropFirst(6).split(whereSeparator: { $0 == " " || $0 == "\t" }).first ?? "")
        }
        return nil
    }

    /// utime and stime in seconds from /proc/PID/stat (fields 14 and 15).
    func cpuTimes() -> CPUTimes? {
        guard let s = readProcFile("/proc/\(pid)/stat"), let close = s.lastIndex(of: ")") else { return nil }
        // After "pid (comm)": field 3 (state) is index 0, so utime (14) is index 11.
        let fields = s[s.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let u = Double(fields[11]), let st = Double(fields[12]) else { return nil }
        return CPUTimes(user: u / Self.ticksPerSecond, system: st / Self.ticksPerSecond)
    }

    /// utime + stime in seconds.
    func cpuSeconds() -> Double? { cpuTimes()?.total }

    /// Seconds its main thread was runnable but waiting for a CPU
    /// (/proc/PID/schedstat, second field; sched-stats.rst): on a shared
    /// machine, the time other work took from it.
    func runQueueWaitSeconds() -> Double? { schedstatWait("/proc/\(pid)/schedstat") }
}

/// Raises the soft descriptor limit to the hard one; returns the new soft limit.
func raiseDescriptorLimit() -> Int {
    var rl = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl)
    if rl.rlim_cur < rl.rlim_max {
        rl.rlim_cur = rl.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl)
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl)
    }
    return Int(rl.rlim_cur)
}
