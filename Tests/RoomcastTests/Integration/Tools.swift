import Foundation

/// Runs `executable` to completion, returning its status, stdout and stderr
/// (`environment`: the child's whole environment; nil: this process's). Both
/// pipes are read together (poll(2)), so a tool that fills one while the
/// other is read cannot block it. Past `timeout` (both pipes still open: the
/// tool, or a grandchild that inherited them, still runs) the tool is killed
/// (SIGKILL) and the test told, never left hanging.
/// - Throws: `HarnessError` when the pipes were not closed within `timeout`.
func runProcess(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                timeout: Duration = .seconds(120)) throws -> (status: Int32, out: String, err: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    if let environment { p.environment = environment }
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    let fds = [out.fileHandleForReading.fileDescriptor, err.fileHandleForReading.fileDescriptor]
    var data: [[UInt8]] = [[], []], open = [true, true]
    let deadline = ContinuousClock.now + timeout
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while open.contains(true) && ContinuousClock.now < deadline {
        var polls = fds.enumerated().filter { open[$0.offset] }.map { pollfd(fd: $0.element, events: Int16(POLLIN), revents: 0) }
        if poll(&polls, nfds_t(polls.count), 100) < 0 && errno != EINTR { break }
        for q in polls where q.revents != 0 {
            let i = fds.firstIndex(of: q.fd)!
            let n = read(q.fd, &buffer, buffer.count)
            if n > 0 { data[i] += buffer[0..<n] } else if n == 0 || errno != EINTR { open[i] = false }
        }
    }
    if open.contains(true) {
        // Not waited for: Foundation's Process learns of an exit only once
        // every inheritor of its pipes is gone, which may be never.
        kill(p.processIdentifier, SIGKILL)
        throw HarnessError("\(executable) \(arguments) did not end within \(timeout): killed; stderr: \(String(decoding: data[1], as: UTF8.self))")
    }
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: data[0], as: UTF8.self), String(decoding: data[1], as: UTF8.self))
}

/// `runProcess` for a tool that must succeed: its stdout.
/// - Throws: `HarnessError` with the tool's stderr when it exits with another status than 0.
func runTool(_ executable: String, _ arguments: [String]) throws -> String {
    let r = try runProcess(executable, arguments)
    guard r.status == 0 else { throw HarnessError("\(executable) \(arguments) exited with \(r.status): \(r.err)") }
    return r.out
}
