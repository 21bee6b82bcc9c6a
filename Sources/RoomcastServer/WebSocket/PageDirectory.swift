import Glibc
import RoomcastCore

// PageDirectory.swift: reading `[websocket] page_dir` into ``PageFiles``,
// once at start (a bad directory refuses the start, exit 78) and again on
// reload (a bad one keeps the page in use). Only the directory's own
// regular files with a served extension are read; subdirectories,
// symlinks and dot files are skipped, so no request can reach outside it.

extension Server {
    /// The directory `page_dir` names; empty: `share/roomcast/web` beside
    /// the directory of the running binary's `bin/` (readlink of
    /// /proc/self/exe, proc(5)), e.g. /usr/share/roomcast/web.
    static func pageDirectory(_ config: Config) -> String {
        if !config.webSocket.pageDir.isEmpty { return config.webSocket.pageDir }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return "/usr/share/roomcast/web" }
        let exe = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var parts = exe.split(separator: "/", omittingEmptySubsequences: true)
        parts.removeLast(min(2, parts.count))  // roomcastd, then bin
        return "/" + (parts + ["share", "roomcast", "web"]).joined(separator: "/")
    }

    /// The page's files when `[websocket] page = yes`, else nil.
    /// - Throws: `ConfigError` naming the directory: it cannot be opened,
    ///   a file cannot be read, a file is over ``PageFiles/maxFileBytes``,
    ///   there are more than ``PageFiles/maxFiles``, or `index.html` is missing.
    public static func loadPage(_ config: Config) throws(ConfigError) -> PageFiles? {
        guard config.webSocket.page else { return nil }
        let dir = pageDirectory(config)
        func fail(_ reason: String) -> ConfigError {
            ConfigError(file: dir, line: nil, reason: "websocket.page_dir: " + reason)
        }
        let dirFD = Glibc.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dirFD >= 0 else { throw fail("cannot open the page directory: \(String(cString: strerror(errno)))") }
        guard let stream = fdopendir(dirFD) else {
            let e = errno
            Glibc.close(dirFD)
            throw fail("cannot list the page directory: \(String(cString: strerror(e)))")
        }
        defer { closedir(stream) }
        var page = PageFiles()
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            guard PageFiles.contentType(of: name) != nil else { continue }
            // O_NOFOLLOW: a symlink fails with ELOOP and is skipped, as is anything not a regular file.
            let fd = openat(dirFD, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
            guard fd >= 0 else {
                if errno == ELOOP { continue }
                throw fail("cannot open \(name): \(String(cString: strerror(errno)))")
            }
            defer { Glibc.close(fd) }
            var st = stat()
            guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { continue }
            guard st.st_size <= PageFiles.maxFileBytes else {
                throw fail("\(name) is \(st.st_size) bytes, over the \(PageFiles.maxFileBytes) a page file may have")
            }
            var body = [UInt8](repeating: 0, count: Int(st.st_size))
            var got = 0
            while got < body.count {
                let n = body.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + got, $0.count - got) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw fail("cannot read \(name): \(n == 0 ? "short read" : String(cString: strerror(errno)))") }
                got += n
            }
            guard page.add(name: name, body: body) else {
                throw fail("more than \(PageFiles.maxFiles) files to serve")
            }
        }
        guard page.paths.contains("/") else { throw fail("no index.html in \(dir)") }
        return page
    }

    /// SIGHUP: the page read again (or dropped with `page = no`); a bad
    /// directory keeps the page in use and says why.
    func reloadPage() {
        do {
            page = try Self.loadPage(config)
        } catch {
            logger.error("page reload failed, keeping the page in use: \(error)",
                         ["REASON": "page_dir_invalid", "DETAIL": error.description])
        }
    }
}
