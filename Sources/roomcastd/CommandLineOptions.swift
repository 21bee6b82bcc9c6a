import RoomcastCore

/// The version printed by `--version`.

/// roomcastd's command line (GNU style: `--opt VALUE` or `--opt=VALUE`).
struct CommandLineOptions: Equatable {
    var configPath = "/etc/roomcast/roomcastd.conf"
    var listen: [ListenAddress] = []
    var checkConfig = false
    var showHelp = false
    var showVersion = false

    struct UsageError: Error, Equatable { var message: String }

    static let usage = """
        Usage: roomcastd [OPTIONS]

        The roomcast chat-room relay daemon: relays join, leave, text and gift
        frames among the clients of a room (one thread, epoll, systemd-native).

        Options:
          -c, --config FILE     config file (default /etc/roomcast/roomcastd.conf)
          -l, --listen ADDR     listen on ADDR (1.2.3.4:PORT or [::1]:PORT) instead of
                                [server] listen; repeatable
          -t, --check-config    validate the config file and exit (0 valid, 78 invalid)
          -V, --version         print the version and exit
          -h, --help            print this help and exit

        Signals: SIGHUP reloads the config file; SIGINT stops gracefully; SIGTERM
        too, except under a unit with an fd store ($FDSTORE), where it flushes and
        then hands the connections to systemd's fd store (a restart keeps them).
        Exit status: 0 ok, 1 runtime failure, 64 bad usage, 78 invalid config.
        """

    static func parse(_ args: [String]) -> Result<CommandLineOptions, UsageError> {
        var o = CommandLineOptions()
        var i = 0
        func value(_ name: String, inline: String?) -> Result<String, UsageError> {
            if let inline { return .success(inline) }
            i += 1
            guard i < args.count else { return .failure(UsageError(message: "option '\(name)' requires an argument")) }
            return .success(args[i])
        }
        while i < args.count {
            let arg = args[i]
            var name = arg
            var inline: String?
            if arg.hasPrefix("--"), let eq = arg.firstIndex(of: "=") {
                name = String(arg[..<eq])
                inline = String(arg[arg.index(after: eq)...])
            }
            switch name {
            case "-c", "--config":
                switch value(name, inline: inline) {
                case .success(let v): o.configPath = v
                case .failure(let e): return .failure(e)
                }
            case "-l", "--listen":
                switch value(name, inline: inline) {
                case .success(let v):
                    guard let address = ListenAddress.parse(v) else {
                        return .failure(UsageError(message: "option '\(name)': '\(v)' is not an address like 127.0.0.1:9898 or [::1]:9898"))
                    }
                    o.listen.append(address)
                case .failure(let e): return .failure(e)
                }
            case "-t", "--check-config": o.checkConfig = true
            case "-V", "--version": o.showVersion = true
            case "-h", "--help": o.showHelp = true
            default:
                if arg.hasPrefix("-") { return .failure(UsageError(message: "unknown option '\(name)'")) }
                return .failure(UsageError(message: "unexpected argument '\(arg)'"))
            }
            if inline != nil && ["-t", "--check-config", "-V", "--version", "-h", "--help"].contains(name) {
                return .failure(UsageError(message: "option '\(name)' takes no argument"))
            }
            i += 1
        }
        return .success(o)
    }
}
