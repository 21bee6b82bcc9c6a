import Glibc
import RoomcastClient

// `roomcast admin VERB ...`: the backend API (docs/api.md) for shell use.
// The key comes from `--key-file` or `$ROOMCAST_API_KEY`, never from the
// command line (argv is readable by every user of the machine).

/// sysexits(3): the API could not be reached or answered garbage.
let exitUnavailable: Int32 = 69
/// sysexits(3): the API refused the key or the peer (401, 403).
let exitNoPermission: Int32 = 77

let adminUsage = """
    Usage: roomcast admin VERB [--api URL] [--key-file PATH] [OPTIONS] ARGS

    Calls the backend API of roomcastd (docs/api.md) and prints its JSON answer.
      publish ROOM --text TEXT --name NAME [--level N] [--icon URL] [--idempotency-key K]
      publish ROOM --gift NAME --name NAME [--gift-url URL] [--count N] [--idempotency-key K]
      publish ROOM --type N --body-base64 B64 [--idempotency-key K]
      kick ROOM (--sub SUB | --name NAME)
      ban ROOM SUB --seconds N [--reason TEXT]      unban ROOM SUB
      mute ROOM SUB --seconds N [--reason TEXT]
      slow ROOM SECONDS                             0 (off) or 3 ... 120
      rooms [--limit N] [--cursor C]                room ROOM [--limit N] [--cursor C]

    Options:
      --api URL          http://HOST:PORT or unix:/PATH (default $ROOMCAST_API, else http://127.0.0.1:9899)
      --key-file PATH    the bearer key: the file's first line that is not blank or a # comment
                         (default: $ROOMCAST_API_KEY; none on a Unix socket, where the caller's uid decides)
      --timeout MS       for the whole request (default 5000)

    Exit status: 0 answered 2xx (the JSON on stdout); 1 answered an error (its JSON on
    stdout, a line on stderr); 64 usage; 69 the API unreachable or no answer in time;
    77 the key or the caller refused (401, 403).
    """

/// Runs `roomcast admin` with the arguments after `admin`.
func runAdmin(_ arguments: [String], environment: [String: String]) -> Int32 {
    if arguments.isEmpty || arguments.contains("--help") || arguments.contains("-h") {
        _ = writeAll(arguments.isEmpty ? 2 : 1, adminUsage + "\n")
        return arguments.isEmpty ? exitUsage : 0
    }
    let invocation: AdminInvocation
    do {
        invocation = try AdminCommand.parse(arguments, environment: environment)
    } catch {
        _ = writeAll(2, "roomcast admin: \(error.message)\nTry 'roomcast admin --help'.\n")
        return exitUsage
    }
    let endpoint = AdminEndpoint.parse(invocation.api)!
    var key = environment["ROOMCAST_API_KEY"].flatMap { $0.isEmpty ? nil : $0 }
    if let path = invocation.keyFile {
        switch readKey(path) {
        case .success(let k): key = k
        case .failure(let e):
            _ = writeAll(2, "roomcast admin: \(e.description)\n")
            return exitUsage
        }
    }
    if key == nil, case .tcp = endpoint {
        _ = writeAll(2, "roomcast admin: the API on TCP needs a key: --key-file PATH or ROOMCAST_API_KEY\n")
        return exitUsage
    }
    let response: AdminResponse
    do {
        response = try AdminHTTP.send(invocation.request, to: endpoint, key: key, timeoutMs: invocation.timeoutMs)
    } catch {
        _ = writeAll(2, "roomcast admin: \(invocation.api): \(error.description)\n")
        return exitUnavailable
    }
    _ = writeAll(1, response.body.hasSuffix("\n") ? response.body : response.body + "\n")
    guard (200..<300).contains(response.status) else {
        _ = writeAll(2, "roomcast admin: \(invocation.request.method) \(invocation.request.path): HTTP \(response.status)\n")
        return response.status == 401 || response.status == 403 ? exitNoPermission : 1
    }
    return 0
}

/// The first line of `path` that is not blank or a `#` comment, trimmed.
private func readKey(_ path: String) -> Result<String, AdminTransportError> {
    guard let f = fopen(path, "r") else { return .failure(AdminTransportError(description: "\(path): \(String(cString: strerror(errno)))")) }
    defer { fclose(f) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while bytes.count < 1 << 20 {
        let n = fread(&chunk, 1, chunk.count, f)
        if n == 0 { break }
        bytes += chunk[0..<n]
    }
    for line in String(decoding: bytes, as: UTF8.self).split(whereSeparator: { $0 == "\n" || $0 == "\r\n" }) {
        let t = line.trimmingPrefix(while: { $0 == " " || $0 == "\t" || $0 == "\r" })
        var k = Substring(t)
        while let last = k.last, last == " " || last == "\t" || last == "\r" { k = k.dropLast() }
        if k.isEmpty || k.hasPrefix("#") { continue }
        return .success(String(k))
    }
    return .failure(AdminTransportError(description: "\(path) holds no key (only blank lines and # comments)"))
}
