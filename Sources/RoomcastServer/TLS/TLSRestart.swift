import COpenSSL
import RoomcastCore
import RoomcastIO

// TLSRestart.swift: TLS clients at a restart (docs/operations/network.md, "TLS").
// A TLS session's keys and sequence numbers live in this process's OpenSSL,
// which cannot hand a live session to another process, so TLS clients are
// not handed over: they are told to come back (a `restarting` notice), and
// closed cleanly. A crash loses them (they are never in the live box).

extension Server {
    /// How soon a TLS client told `restarting` may reconnect, in ms: the
    /// next process takes the listener from systemd's fd store at once, and
    /// connections made meanwhile wait in its backlog.
    static let tlsRestartRetryMs: Int64 = 1_000

    /// At SIGTERM with an fd store: every open TLS client gets the notice
    /// `restarting` with `retry_after_ms` (docs/protocol/tls.md §16), flushed
    /// with everyone's output before the hand-over.
    func noticeTLSRestart() {
        for id in table.ids where table.slots[id]!.tls != nil && table.isOpen(id) {
            sendNotice(id, Notice(code: "restarting", text: "the server is restarting: reconnect", retryAfterMs: Self.tlsRestartRetryMs))
        }
    }

    /// At the hand-over: close_notify to every TLS client, the socket shut
    /// down and the session freed; each is marked closing, so that it is not
    /// handed over (and is reaped as a plain socket if the hand-over fails).
    /// - Returns: how many were closed (the hand-over's journal line).
    func closeTLSForRestart() -> Int {
        var n = 0
        for id in table.ids {
            guard let ssl = table.slots[id]!.tls else { continue }
            ERR_clear_error()
            _ = SSL_shutdown(ssl)
            ERR_clear_error()
            Sys.shutdownBoth(table.slots[id]!.fd)
            forgetTLS(id, ssl)
            SSL_free(ssl)
            if table.state(id) != .closing { table.close(id, "restart: a TLS session cannot move to the next process") }
            n += 1
        }
        return n
    }
}
