import RoomcastCore
import Testing

/// The page's files as served (docs/protocol/websocket.md §15, "The page").
@Suite struct PageFilesTests {
    @Test func contentTypesByExtension() {
        #expect(PageFiles.contentType(of: "index.html") == "text/html; charset=utf-8")
        #expect(PageFiles.contentType(of: "chat.css") == "text/css; charset=utf-8")
        #expect(PageFiles.contentType(of: "chat.js") == "text/javascript; charset=utf-8")  // RFC 9239
        #expect(PageFiles.contentType(of: "Logo.PNG") == "image/png")
    }

    @Test("names that are never served: no or unknown extension, dot files, paths, bytes outside [A-Za-z0-9._-]",
          arguments: ["README", "roomcastd.conf", ".htaccess.txt", "..", ".", "a/b.js", "..%2fx.js", "a b.html", "é.html", ""])
    func notServed(name: String) {
        #expect(PageFiles.contentType(of: name) == nil)
        var page = PageFiles()
        let added = page.add(name: name, body: [1])
        #expect(!added)
        #expect(page.paths.isEmpty)
    }

    @Test func indexIsAlsoTheRoot() throws {
        var page = PageFiles()
        let added = [page.add(name: "index.html", body: Array("<p>".utf8)), page.add(name: "chat.js", body: Array("x".utf8))]
        #expect(added == [true, true])
        #expect(page.paths == ["/", "/index.html", "/chat.js"])
        let answer = String(decoding: try #require(page.response(for: "/")), as: UTF8.self)
        #expect(answer.hasPrefix("HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: 3\r\n"))
        #expect(answer.hasSuffix("\r\nConnection: close\r\n\r\n<p>"))
        #expect(page.response(for: "/chat.js/..") == nil && page.response(for: "/../chat.js") == nil)
    }

    @Test func limits() {
        var page = PageFiles()
        let big = page.add(name: "big.js", body: [UInt8](repeating: 0, count: PageFiles.maxFileBytes + 1))
        #expect(!big)
        let fit = (0..<PageFiles.maxFiles).map { page.add(name: "f\($0).js", body: []) }
        #expect(fit.allSatisfy { $0 })
        let oneMore = page.add(name: "one-more.js", body: [])
        #expect(!oneMore)
    }
}
