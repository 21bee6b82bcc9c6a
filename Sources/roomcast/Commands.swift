import CShim
import Glibc
import RoomcastClient


/// Reads pending signals from the signalfd in the loop (no handlers, no races).
private func watchSignals(_ loop: EventLoop, _ signalFD: Int32, _ handler: @escaping (Int32) -> Void) {
    guard signalFD >= 0 else { return }
    _ = try? loop.watch(signalFD) { _ in
        while case let signal = cshim_read_signal(signalFD), signal > 0 { handler(signal) }
    }
}

private func makeLoop() -> EventLoop? {
    do {
        return try EventLoop()
    } catch {
        writeAll(2, "roomcast: \(error)\n")
        return nil
    }
}

private func room(_ name: String?) -> String { name.map(sanitized) ?? "the default room" }

// MARK: - send

/// `roomcast send`: join, send, wait for the daemon's echo, leave. Exit 0,
/// or 1 with one line on stderr (refused, timeout, rejected), or 128 + the
/// signal when SIGINT or SIGTERM interrupts it.
func runSend(_ invocation: Invocation, signalFD: Int32) -> Int32 {
    guard let loop = makeLoop(), let payload = invocation.payload else { return 1 }
    var configuration = invocation.configuration
    configuration.reconnect = .never
    configuration.connectTimeoutMs = invocation.timeoutMs
    let me = invocation.user(defaultName: "")
    let expected: ClientEvent = switch payload {
    case .text(let text): .text(ChatMessage(user: me, text: text))
    case .gift(let name, let url, let count): .gift(GiftMessage(user: me, giftname: name, giftURL: url, giftcount: count))
    }
    var status: Int32?
    var failure: String?
    var interruptedBy: Int32?
    var echoed = false
    var client: RoomcastClient!
    // The handlers below capture `client`, and the client holds them: break
    // the cycle on the way out (LeakSanitizer reports it otherwise).
    defer { client = nil }
    client = RoomcastClient(loop: loop, configuration: configuration, onEvent: { event in
        if !echoed, failure == nil, case .notice(let notice) = event, notice.isRefusal {
            // The daemon says why (docs/protocol/notices.md); `history`, `viewers` ... refuse nothing.
            failure = "refused: " + describe(notice)
            client.close()
            return
        }
        guard !echoed, event == expected else { return }
        echoed = true  // relayed: the daemon sent it back byte for byte
        try? client.leave()
        client.finish()
    }, onStatus: { change in
        switch change {
        case .connected:
            do {
                try client.join(me)
                switch payload {
                case .text(let text): try client.sendText(text)
                case .gift(let name, let url, let count): try client.sendGift(name: name, url: url, count: count)
                }
            } catch {
                failure = "rejected: \(error)"
                if case ClientError.bodyTooLarge = error { failure! += " (--max-frame-bytes raises it, up to the daemon's max_frame_bytes)" }
                client.close()
            }
        case .disconnected(let error) where !echoed && failure == nil:
            // The daemon closing on us arrives as EOF, or as a reset when it
            // closed with our bytes still unread: both mean it refused them.
            switch error {
            case .closedByPeer, .system(_, ECONNRESET):
                failure = "rejected: the daemon closed the connection before relaying the message "
                    + "(its log says why: a byte order other than --byte-order, a frame over its max_frame_bytes, ...)"
            default:
                failure = "\(error)"
            }
        case .closed:
            if echoed && failure == nil {
                status = 0
            } else {
                writeAll(2, "roomcast: \(failure ?? "connection closed")\n")
                // Interrupted: 128 + the signal, as shells report it (130 SIGINT, 143 SIGTERM).
                status = interruptedBy.map { 128 + $0 } ?? 1
            }
        default:
            break
        }
    })
    loop.schedule(afterMs: invocation.timeoutMs) {
        guard !echoed, status == nil else { return }
        failure = client.state == .connecting
            ? "timeout: no connection to \(invocation.server) within \(seconds(invocation.timeoutMs))"
            : "timeout: the daemon did not relay the message back within \(seconds(invocation.timeoutMs)) (is echo = no?)"
        client.close()
    }
    watchSignals(loop, signalFD) { signal in
        if failure == nil { failure = "interrupted"; interruptedBy = signal }
        client.close()
    }
    client.connect()
    return run(loop) { status }
}

// MARK: - listen

/// `roomcast listen`: join as an observer and print events (readable or JSON
/// lines) until interrupted or `--count` events. Exit 0; 1 if the first
/// connection fails (later drops reconnect).
func runListen(_ invocation: Invocation, signalFD: Int32) -> Int32 {
    guard let loop = makeLoop() else { return 1 }
    var configuration = invocation.configuration
    configuration.reconnect.retryInitialConnect = false
    let me = invocation.user(defaultName: "listener")
    var status: Int32?
    var printed = 0
    var stopping = false
    var everConnected = false
    var lastError: ClientError?
    var expectOwnJoin = false
    var rejoining = false
    var client: RoomcastClient!
    // The handlers below capture `client`, and the client holds them: break
    // the cycle on the way out (LeakSanitizer reports it otherwise).
    defer { client = nil }

    func stop() {
        guard !stopping else { return }
        stopping = true
        if client.state == .connected {
            try? client.leave()
            client.finish()
        } else {
            client.close()
        }
    }

    client = RoomcastClient(loop: loop, configuration: configuration, onEvent: { event in
        if expectOwnJoin, event == .join(me) {
            // Our own join, relayed back: we are in the room now.
            expectOwnJoin = false
            writeAll(2, "roomcast: \(rejoining ? "rejoined" : "listening in") \(room(me.room)) as \(sanitized(me.name))\n")
            return
        }
        guard !stopping else { return }
        let line = invocation.json ? jsonLine(event, room: invocation.room)
            : clockTime() + " " + describe(event, room: invocation.room)
        guard writeAll(1, line + "\n") else { return stop() }  // stdout closed (e.g. `| head`)
        printed += 1
        if let count = invocation.count, printed >= count { stop() }
    }, onStatus: { change in
        switch change {
        case .joined, .rejoined:
            // One line once the daemon relays our join back (not a second one now).
            expectOwnJoin = true
            if case .rejoined = change { rejoining = true } else { rejoining = false }
        case .connected:
            everConnected = true
            if let line = describe(change) { writeAll(2, "roomcast: \(line)\n") }
        case .disconnected(let error):
            lastError = error
            if everConnected && !stopping { writeAll(2, "roomcast: \(error)\n") }
        case .closed:
            if stopping || everConnected {
                status = 0
            } else {
                writeAll(2, "roomcast: \(lastError.map { "\($0)" } ?? "connection closed")\n")
                status = 1
            }
        default:
            if !stopping, let line = describe(change) { writeAll(2, "roomcast: \(line)\n") }
        }
    })
    watchSignals(loop, signalFD) { _ in
        if stopping { client.close() } else { stop() }
    }
    client.connect()
    do { try client.join(me) } catch {
        writeAll(2, "roomcast: \(error)\n")
        return 1
    }
    return run(loop) { status }
}

// MARK: - chat

/// `roomcast chat`: interactive. Lines typed are sent as text; `/gift`,
/// `/join`, `/leave`, `/quit`. Events on stdout, status on stderr, both
/// printed above the line being typed.
func runChat(_ invocation: Invocation, signalFD: Int32) -> Int32 {
    guard let loop = makeLoop() else { return 1 }
    var user = invocation.user(defaultName: "")
    func prompt() -> String { sanitized(user.name) + (user.room.map { "@" + sanitized($0) } ?? "") + "> " }
    let editor = LineEditor(prompt: prompt())
    var status: Int32?
    var quitting = false
    var endOfInput = false
    var outbox: [String] = []
    var client: RoomcastClient!
    // The handlers below capture `client`, and the client holds them: break
    // the cycle on the way out (LeakSanitizer reports it otherwise).
    defer { client = nil }

    func say(_ text: String) { editor.printAbove("* " + text, fd: 2) }

    func quit() {
        guard !quitting else { return }
        quitting = true
        if client.state == .connected {
            if client.isJoined { try? client.leave() }
            client.finish()
        } else {
            client.close()
        }
        loop.schedule(afterMs: 2_000) { client.close() }  // never hang on a dead peer
    }

    /// Handles one typed line; lines that need a connection wait in the outbox.
    func handle(_ line: String) {
        if line.isEmpty { return }
        var text = line
        if line.hasPrefix("/") && !line.hasPrefix("//") {
            let words = line.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
            switch words[0] {
            case "/quit":
                return quit()
            case "/help":
                for help in ["/gift NAME URL COUNT   send a gift", "/join ROOM             move to ROOM",
                             "/leave                 leave the room", "/quit                  leave and exit",
                             "//TEXT                 send TEXT starting with '/'"] { say(help) }
                return
            case "/join":
                guard words.count == 2 else { return say("usage: /join ROOM") }
                user.room = words[1]
                do { try client.join(user) } catch { return say("\(error)") }
                editor.prompt = prompt()
                if client.state != .connected { say("will join \(room(user.room)) when connected") }
                return
            case "/leave":
                guard client.isJoined else { return say("not in a room") }
                do { try client.leave() } catch { }
                say("left \(room(user.room))")
                editor.prompt = sanitized(user.name) + " (no room)> "
                return
            case "/gift":
                guard words.count == 4, let count = Int32(words[3]) else { return say("usage: /gift NAME URL COUNT") }
                guard client.state == .connected else { outbox.append(line); return say("not connected: will send when connected") }
                guard client.isJoined else { return say("not in a room: /join ROOM first") }
                do { try client.sendGift(name: words[1], url: words[2], count: count) } catch { say("\(error)") }
                return
            default:
                return say("unknown command \(words[0]) (try /help)")
            }
        }
        if line.hasPrefix("//") { text = String(line.dropFirst()) }
        guard client.state == .connected else { outbox.append(line); return say("not connected: will send when connected") }
        guard client.isJoined else { return say("not in a room: /join ROOM first") }
        do { try client.sendText(text) } catch { say("\(error)") }
    }

    func drainOutbox() {
        let lines = outbox
        outbox = []
        for line in lines { handle(line) }
        if endOfInput && outbox.isEmpty { quit() }
    }

    client = RoomcastClient(loop: loop, configuration: invocation.configuration, onEvent: { event in
        editor.printAbove(clockTime() + " " + describe(event, room: user.room), fd: 1)
    }, onStatus: { change in
        if !quitting, let line = describe(change) { say(line) }
        switch change {
        case .joined, .rejoined: drainOutbox()
        case .connected where !client.isJoined: drainOutbox()
        case .closed: status = quitting ? 0 : 1
        default: break
        }
    })

    var stdinWatch: WatchID?
    func input(_ bytes: ArraySlice<UInt8>, atEnd: Bool) {
        let (lines, end) = editor.feed(bytes)
        for line in lines { handle(line) }
        if atEnd || end {
            if let watch = stdinWatch { loop.unwatch(watch) }  // level-triggered EOF would spin
            stdinWatch = nil
            if let last = editor.flushPending() { handle(last) }
            endOfInput = true
            if outbox.isEmpty || client.state == .closed { quit() }
        }
    }
    var buffer = [UInt8](repeating: 0, count: 4096)
    func readStdin() -> Bool {
        let n = buffer.withUnsafeMutableBytes { read(0, $0.baseAddress!, $0.count) }
        if n < 0 && (errno == EINTR || errno == EAGAIN) { return true }
        input(buffer[0..<max(0, n)], atEnd: n <= 0)
        return n > 0
    }

    editor.start()
    client.connect()
    do { try client.join(user) } catch {
        editor.restore()
        writeAll(2, "roomcast: \(error)\n")
        return 1
    }
    do {
        stdinWatch = try loop.watch(0) { _ in _ = readStdin() }
    } catch {
        while readStdin() {}  // a regular file or /dev/null: epoll cannot watch it, and reading never blocks
    }
    watchSignals(loop, signalFD) { _ in
        if quitting { client.close() } else { quit() }
    }
    let code = run(loop) { status }
    editor.restore()
    return code
}

/// Runs the loop until `result()` has a value; an epoll failure is exit 1.
/// Then the loop lets go of its handlers (they capture the client and the
/// loop itself: LeakSanitizer reports the cycle at exit otherwise).
private func run(_ loop: EventLoop, _ result: () -> Int32?) -> Int32 {
    defer { loop.removeAll() }
    do {
        try loop.run { result() != nil }
    } catch {
        writeAll(2, "roomcast: \(error)\n")
        return 1
    }
    return result() ?? 1
}
