import Foundation

/// Runs `executable` to completion (bounded by the tool itself), returning its
/// status, stdout and stderr (`environment`: the child's whole environment; nil: this process's). Both pipes are drained before the wait, so a tool
/// that writes more than a pipe holds cannot block.
func runProcess(_ executable: String, _ arguments: [String], environment: [String: String]? = nil) throws -> (status: Int32, out: String, err: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    if let environment { p.environment = environment }
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    let stdout = out.fileHandleForReading.readDataToEndOfFile()
    let stderr = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
}

/// `runProcess` for a tool that must succeed: its stdout.
/// - Throws: `HarnessError` with the tool's stderr when it exits with another status than 0.
func runTool(_ executable: String, _ arguments: [String]) throws -> String {
    let r = try runProcess(executable, arguments)
    guard r.status == 0 else { throw HarnessError("\(executable) \(arguments) exited with \(r.status): \(r.err)") }
    return r.out
}
