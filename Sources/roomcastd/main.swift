// roomcastd: the chat-room relay daemon. See README.md.
import CEarlySignals
import CShim
@preconcurrency import Glibc
import RoomcastCore
import RoomcastServer

// SIGTERM, SIGINT, SIGHUP and SIGUSR2 are already blocked: CEarlySignals did it from
// an ELF initializer, before the Swift runtime started (their default action
// would kill a daemon signalled while starting). Asking for that mask keeps
// its object linked; block them here too (a no-op then), before anything can
// start a thread, and take them through a signalfd in the event loop
// (signalfd(2)). SIGPIPE never kills the process: sends use
// MSG_NOSIGNAL, and it is ignored.
let earlyBlocked = roomcastd_early_blocked_signals()
let signalFD = cshim_block_signals_fd([SIGTERM, SIGINT, SIGHUP, SIGUSR2, 0])
signal(SIGPIPE, SIG_IGN)

/// sysexits(3) codes.
let exUsage: Int32 = 64
let exConfig: Int32 = 78

setvbuf(stdout, nil, _IOLBF, 0)

/// Gives notifications still waiting for a busy PID 1, and log output
/// journald did not take, half a second each to get out before the process
/// exits (the event loop never waits for them).
func flushBeforeExit(_ systemd: Systemd, _ logger: Logger? = nil) {
    systemd.flushBeforeExit(timeoutMs: 500)
    logger?.flushBeforeExit(timeoutMs: 500)
}

func fail(_ message: String, status: Int32) -> Never {
    fputs("roomcastd: \(message)\n", stderr)
    exit(status)
}

guard signalFD >= 0 else { fail("signalfd: \(String(cString: strerror(errno)))", status: 1) }
if [SIGTERM, SIGINT, SIGHUP, SIGUSR2].contains(where: { earlyBlocked & (1 << UInt64($0 - 1)) == 0 }) {
    // Not fatal (they are blocked now), but a build that lost the initializer
    // can be killed by a signal in its first milliseconds again.
    fputs("roomcastd: warning: the early signal mask was not set (CEarlySignals' initializer did not run)\n", stderr)
}

let invocation: CommandLineOptions
switch CommandLineOptions.parse(Array(CommandLine.arguments.dropFirst())) {
case .success(let parsed): invocation = parsed
case .failure(let error): fail("\(error.message)\nTry 'roomcastd --help'.", status: exUsage)
}

if invocation.showHelp {
    print(CommandLineOptions.usage)
    exit(0)
}
if invocation.showVersion {
    print("roomcastd \(roomcastVersion)")
    exit(0)
}

// systemd's environment is read once, before anything else (sd_listen_fds(3)
// unsets LISTEN_*; getenv(3) is not thread-safe).
let systemd = Systemd.fromEnvironment()

var config: Config
// `[auth] key_file` is read with the config: a bad, foreign or readable-by-
// others key file refuses the start as a bad config does (exit 78).
var keys: AuthKeys?
// `[websocket] page_dir` likewise: with `page = yes`, a missing or unreadable
// page refuses the start (exit 78).
var page: PageFiles?
var apiKeys: APIKeySet?
// `[tls]`'s certificate and key too, when a listen_tls is set: a file OpenSSL
// refuses is reported at its line, with OpenSSL's reason (exit 78).
var tls: TLSContext?
do {
    config = try Config.load(path: invocation.configPath)
    if !invocation.listen.isEmpty { config.server.listen = invocation.listen }
    keys = try Server.loadKeys(config)
    page = try Server.loadPage(config)
    apiKeys = try Server.loadAPIKeys(config)
    tls = try Server.loadTLS(config, file: invocation.configPath, socketNames: systemd.listenFDs.map(\.name))
} catch {
    systemd.notify("STATUS=invalid configuration: \(error.description)\nERRNO=22")
    flushBeforeExit(systemd)
    fail(error.description, status: exConfig)
}

// Every address must be bound once: the file's check covers its own lines
// (exit 78 with the line), this one the command line's --listen, which
// replaces [server] listen, against itself and every other listener of the
// file, listen_tls included (exit 64, with the file's line). Under socket
// activation nothing is bound, so nothing can collide.
if !invocation.listen.isEmpty && systemd.listenFDs.isEmpty {
    do {
        try config.checkListenOverride(invocation.listen, file: invocation.configPath)
    } catch {
        fail(error.line == nil ? error.reason : error.description, status: exUsage)
    }
}

if invocation.checkConfig {
    print("\(invocation.configPath): configuration is valid")
    exit(0)
}

// ROOMCAST_JOURNAL_SOCKET is for tests: a fake journald's socket instead of
// /run/systemd/journal/socket (docs/operations/running.md, "Logs and fields").
let journalPath = getenv("ROOMCAST_JOURNAL_SOCKET").map { String(cString: $0) } ?? LogSink.defaultJournalPath
let logger = Logger(level: config.log.level, sink: LogSink.resolve(config.log.target, journalPath: journalPath), journalPath: journalPath)
logger.info("roomcastd \(roomcastVersion) starting", ["CONFIG_FILE": invocation.configPath])
if config.log.target == .journal, logger.sink != .journal {
    logger.warning("log.target = journal, but journald is not reachable (\(journalPath)); logging to stderr",
                   ["REASON": "journal_unavailable"])
}

do {
    let server = try Server(config: config,
                            options: .init(configPath: invocation.configPath, listenOverride: invocation.listen),
                            systemd: systemd, logger: logger, signalFD: signalFD, keys: keys, page: page, apiKeys: apiKeys, tls: tls)
    let status = try server.run()
    flushBeforeExit(systemd, logger)
    exit(status)
} catch {
    logger.error("fatal: \(error.description)", ["REASON": "fatal", "DETAIL": error.description])
    systemd.notify("STATUS=failed: \(error.description)\nERRNO=\(error.errno)")
    flushBeforeExit(systemd, logger)
    exit(1)
}
