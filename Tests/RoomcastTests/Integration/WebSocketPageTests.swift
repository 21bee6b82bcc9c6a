// The chat page served by the WebSocket listener (docs/protocol/websocket.md §15,
// "The page"): `[websocket] page = yes` with a page_dir, plain GETs of the
// directory's own files only, the upgrade at `/` unchanged.
import Foundation
import Glibc
import Testing

@Suite("WebSocket page")
struct WebSocketPageTests {
    /// A page directory: the three files, a file beside the directory (the
    /// target of traversal attempts), a subdirectory, a symlink out of it
    /// and a dot file, none of which may be served.
    static func pageDirectory() throws -> (TempDirectory, String) {
        let root = try TempDirectory()
        let web = root.path + "/web"
        #expect(mkdir(web, 0o755) == 0 && mkdir(web + "/sub", 0o755) == 0)
        try "<!doctype html><title>t</title>".write(toFile: web + "/index.html", atomically: false, encoding: .utf8)
        try "body{}".write(toFile: web + "/chat.css", atomically: false, encoding: .utf8)
        try "\"use strict\";".write(toFile: web + "/chat.js", atomically: false, encoding: .utf8)
        try "outside".write(toFile: root.path + "/secret.txt", atomically: false, encoding: .utf8)
        try "inside a subdirectory".write(toFile: web + "/sub/page.html", atomically: false, encoding: .utf8)
        try "dot".write(toFile: web + "/.hidden.txt", atomically: false, encoding: .utf8)
        #expect(symlink(root.path + "/secret.txt", web + "/link.txt") == 0)
        return (root, web)
    }

    /// Sends `request` on a fresh connection and reads the answer until the daemon closes it.
    static func get(_ d: Daemon, _ request: String) throws -> (head: String, body: String) {
        let c = try WebSocketTestClient(d)
        try c.connection.sendRaw(Array(request.utf8))
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let deadline = monotonicMs() + 5_000
        while monotonicMs() < deadline {
            var p = pollfd(fd: c.connection.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 500) >= 0 else { break }
            if p.revents == 0 { continue }
            let n = buffer.withUnsafeMutableBytes { recv(c.connection.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n <= 0 { break }
            bytes += buffer[0..<n]
        }
        let text = String(decoding: bytes, as: UTF8.self)
        guard let split = text.range(of: "\r\n\r\n") else { return (text, "") }
        return (String(text[..<split.lowerBound]), String(text[split.upperBound...]))
    }

    @Test("GET / and its files: 200 with the file's bytes and Content-Type, then closed; the upgrade at / still works")
    func servesThePage() throws {
        let (root, web) = try Self.pageDirectory()
        _ = root
        let d = try Daemon(WebSocketIntegrationTests.settings.merging(["websocket.page": "yes", "websocket.page_dir": web]) { $1 })
        for (path, type, body) in [("/", "text/html; charset=utf-8", "<!doctype html><title>t</title>"),
                                   ("/index.html", "text/html; charset=utf-8", "<!doctype html><title>t</title>"),
                                   ("/chat.css", "text/css; charset=utf-8", "body{}"),
                                   ("/chat.js?v=2", "text/javascript; charset=utf-8", "\"use strict\";")] {
            let r = try Self.get(d, "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            #expect(r.head.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(path): \(r.head)")
            #expect(r.head.contains("\r\nContent-Type: \(type)"), "\(path): \(r.head)")
            #expect(r.head.contains("\r\nContent-Length: \(body.utf8.count)"), "\(path): \(r.head)")
            #expect(r.body == body, "\(path)")
        }
        let w = try WebSocketTestClient.open(d)
        try w.sendJSON(["cmd": "nickname", "nickname": "viewer"])
        #expect(w.receiveJSON()?["cmd"] as? String == "join")
    }

    @Test("no directory traversal: dot-dot paths, encoded ones, subdirectories, symlinks and dot files are 404",
          arguments: ["/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt", "/sub/page.html", "/sub/", "/link.txt",
                      "/.hidden.txt", "/chat.js/..", "//etc/passwd", "/web/index.html", "/CHAT.JS"])
    func noTraversal(path: String) throws {
        let (root, web) = try Self.pageDirectory()
        _ = root
        let d = try Daemon(WebSocketIntegrationTests.settings.merging(["websocket.page": "yes", "websocket.page_dir": web]) { $1 })
        let r = try Self.get(d, "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        #expect(r.head.hasPrefix("HTTP/1.1 404 "), "\(path): \(r.head)")
        #expect(!r.body.contains("outside") && !r.body.contains("inside") && !r.body.contains("dot"), "\(path): \(r.body)")
    }

    @Test("GET only: POST and HEAD of / are 405; page = no answers a plain GET of / with 426")
    func getOnly() throws {
        let (root, web) = try Self.pageDirectory()
        _ = root
        let d = try Daemon(WebSocketIntegrationTests.settings.merging(["websocket.page": "yes", "websocket.page_dir": web]) { $1 })
        for method in ["POST", "HEAD"] {
            let r = try Self.get(d, "\(method) / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
            #expect(r.head.hasPrefix("HTTP/1.1 405 "), "\(method): \(r.head)")
        }
        let off = try Daemon(WebSocketIntegrationTests.settings)
        #expect(try Self.get(off, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").head.hasPrefix("HTTP/1.1 426 "))
    }

    @Test("SIGHUP reads the page again; a page_dir gone bad keeps the page in use (REASON=page_dir_invalid)")
    func reload() throws {
        let (root, web) = try Self.pageDirectory()
        _ = root
        let d = try Daemon(WebSocketIntegrationTests.settings.merging(["websocket.page": "yes", "websocket.page_dir": web]) { $1 })
        try "<p>new</p>".write(toFile: web + "/index.html", atomically: false, encoding: .utf8)
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(for: "configuration reloaded"))
        #expect(try Self.get(d, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").body == "<p>new</p>")
        #expect(unlink(web + "/index.html") == 0)
        d.child.kill(SIGHUP)
        #expect(d.stderr.wait(for: "REASON=page_dir_invalid"))
        #expect(try Self.get(d, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").body == "<p>new</p>", "the page in use is kept")
    }

    @Test("page = yes with a page_dir that is missing or has no index.html refuses the start (exit 78), naming it")
    func badPageDirectory() throws {
        let dir = try TempDirectory()
        let empty = dir.path + "/empty"
        #expect(mkdir(empty, 0o755) == 0)
        for (pageDir, needle) in [(dir.path + "/missing", "cannot open the page directory"), (empty, "no index.html")] {
            let conf = try dir.write("c.conf", "[websocket]\npage = yes\npage_dir = \(pageDir)\n")
            let r = try runRoomcastd(["--config", conf, "--listen", "127.0.0.1:0"])
            #expect(r.status == 78, "\(r.stderr)")
            #expect(r.stderr.contains(pageDir) && r.stderr.contains(needle), "\(r.stderr)")
        }
    }
}
