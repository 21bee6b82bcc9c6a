// roomcast: the command-line client of roomcastd. See `roomcast --help`.
import CShim
import Glibc
import RoomcastClient

// SIGINT and SIGTERM are read from a signalfd inside the event loop, so each
// subcommand can leave its room politely; block them before anything else.
let signalFD = cshim_block_signals_fd([SIGINT, SIGTERM, 0])
signal(SIGPIPE, SIG_IGN)  // a closed stdout or socket is an error return, not a death

if CommandLine.arguments.count > 1 && CommandLine.arguments[1] == "admin" {
    var environment: [String: String] = [:]
    for name in ["ROOMCAST_API", "ROOMCAST_API_KEY"] { if let v = getenv(name) { environment[name] = String(cString: v) } }
    exit(runAdmin(Array(CommandLine.arguments.dropFirst(2)), environment: environment))
}

switch parseCommandLine(Array(CommandLine.arguments.dropFirst())) {
case .failure(let error):
    let help = "roomcast" + (error.command.map { " " + $0.rawValue } ?? "") + " --help"
    writeAll(2, "roomcast: \(error.message)\nTry '\(help)'.\n")
    exit(exitUsage)
case .success(let invocation):
    if invocation.help {
        writeAll(1, usage(invocation.topLevel ? nil : invocation.command) + "\n")
        exit(0)
    }
    if invocation.version {
        writeAll(1, "roomcast \(roomcastVersion)\n")
        exit(0)
    }
    switch invocation.command {
    case .send: exit(runSend(invocation, signalFD: signalFD))
    case .listen: exit(runListen(invocation, signalFD: signalFD))
    case .chat: exit(runChat(invocation, signalFD: signalFD))
    case .token: exit(runToken(invocation))
    }
}
