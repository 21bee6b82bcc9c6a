// swift-tools-version:6.0
// roomcast: a one-thread epoll chat-room relay daemon (see README.md, docs/protocol/).
import PackageDescription

let package = Package(
    name: "roomcast",
    products: [
        .executable(name: "roomcastd", targets: ["roomcastd"]),
        .executable(name: "roomcast", targets: ["roomcast"]),
        .executable(name: "roomcast-bench", targets: ["roomcast-bench"]),
        .library(name: "RoomcastCore", targets: ["RoomcastCore"]),
        .library(name: "RoomcastClient", targets: ["RoomcastClient"]),
    ],
    targets: [
        // Glibc's Swift overlay lacks epoll, signalfd, timerfd, eventfd, accept4
        // and getopt_long: one small C target for them.
        .target(name: "CShim"),
        // roomcastd's alone: blocks SIGTERM, SIGINT and SIGHUP from an ELF
        // initializer, before the Swift runtime starts (a SIGHUP in the first
        // milliseconds used to kill the daemon). Never a dependency of anything
        // else: the client, the bench, the soak driver and the tests keep their signals.
        .target(name: "CEarlySignals"),
        // libsystemd (sd_listen_fds, sd_watchdog_enabled, sd_is_socket_inet; sd_notify only for vsock addresses).
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // hiredis (Redis pub/sub for rooms that span daemons, `[cluster]`): its
        // async API on the daemon's own epoll loop, no thread of its own.
        .systemLibrary(
            name: "CHiredis",
            pkgConfig: "hiredis",
            providers: [.apt(["libhiredis-dev"])]
        ),
        // OpenSSL 3's libssl and libcrypto: all the daemon's cryptography (the
        // WebSocket handshake's SHA-1 and base64, HMAC-SHA256 and Ed25519 of
        // signed joins, CRYPTO_memcmp, TLS).
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),
        // Pure logic, standard library only (no imports): frame codec, proto2,
        // timing wheel, config parsing, relay policy, output queue. No clock,
        // no sockets, no files (RoomcastServer's Config.load reads the file).
        .target(name: "RoomcastCore"),
        // The kernel interfaces the daemon and the client share: the syscall
        // helper, the epoll selector and its registry, socket addresses.
        // Knows nothing of frames or rooms.
        .target(name: "RoomcastIO", dependencies: ["CShim"]),
        // The reactor and everything that talks to the kernel or systemd.
        // The cryptography the daemon and the client share (HMAC-SHA256 of HS256 tokens), from OpenSSL.
        .target(name: "RoomcastCrypto", dependencies: ["COpenSSL"]),
        .target(name: "RoomcastServer", dependencies: ["RoomcastCore", "RoomcastIO", "RoomcastCrypto", "CShim", "CSystemd", "CHiredis", "COpenSSL"]),
        .executableTarget(name: "roomcastd", dependencies: ["RoomcastServer", "RoomcastCore", "CEarlySignals"]),
        // The client library: one event loop, reconnects, heartbeats, TLS (OpenSSL).
        .target(name: "RoomcastClient", dependencies: ["RoomcastCore", "RoomcastIO", "RoomcastCrypto", "CShim", "COpenSSL"]),
        // The command-line client (chat, send, listen).
        .executableTarget(name: "roomcast", dependencies: ["RoomcastClient", "RoomcastCrypto", "CShim"]),
        // The chaos soak (`make soak`): ~2,000 loopback clients against the roomcastd built beside it.
        // One thread of top-level code: Swift 5 mode spares it the global-actor checks.
        .executableTarget(name: "roomcast-soak", dependencies: ["RoomcastCore", "CShim"],
                          swiftSettings: [.swiftLanguageMode(.v5)]),
        // libFuzzer targets (`make fuzz`): each one file
        // holding only LLVMFuzzerTestOneInput; a plain build makes no-op binaries.
        .executableTarget(name: "FuzzFrameDecoder", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzFrameDecoder"),
        .executableTarget(name: "FuzzProto2", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzProto2"),
        .executableTarget(name: "FuzzConfig", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzConfig"),
        .executableTarget(name: "FuzzWebSocket", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzWebSocket"),
        .executableTarget(name: "FuzzToken", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzToken"),
        .executableTarget(name: "FuzzProxyHeader", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzProxyHeader"),
        .executableTarget(name: "FuzzHTTP", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzHTTP"),
        .executableTarget(name: "FuzzModerationWire", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzModerationWire"),
        .executableTarget(name: "FuzzClusterWire", dependencies: ["RoomcastCore"], path: "Tests/Fuzz/FuzzClusterWire"),
        // The load generator of BENCHMARKS.md: one thread, its own small epoll loop
        // (CShim), the package's frame codec and proto2 bodies (RoomcastCore).
        .executableTarget(name: "roomcast-bench", dependencies: ["RoomcastCore", "RoomcastServer", "RoomcastCrypto", "CShim", "COpenSSL"]),
        // Test bundle only: OpenSSL initialised before main() without its
        // atexit cleanup, which races Swift Testing's worker threads under
        // LeakSanitizer (Tests/COpenSSLNoAtExit/no_atexit.c says how).
        .target(name: "COpenSSLNoAtExit", dependencies: ["COpenSSL"], path: "Tests/COpenSSLNoAtExit"),
        .testTarget(
            name: "RoomcastTests",
            // Not roomcastd: a test target links the objects of the executables it
            // depends on, and roomcastd's CEarlySignals would block the signals of
            // the test process. `swift build`/`swift test` build roomcastd anyway.
            dependencies: ["RoomcastCore", "RoomcastIO", "RoomcastServer", "RoomcastClient", "roomcast", "roomcast-bench", "COpenSSLNoAtExit"],
            // Reference/proto_ref.py is run by the tests with python3, not bundled.
            exclude: ["Reference"]
        ),
    ]
)
