// swift-tools-version:6.0
// roomcast: a one-thread epoll chat-room relay daemon (see README.md, PROTOCOL.md).
import PackageDescription

let package = Package(
    name: "roomcast",
    products: [
        .executable(name: "roomcastd", targets: ["roomcastd"]),
        .executable(name: "roomcast-bench", targets: ["roomcast-bench"]),
        .library(name: "RoomcastCore", targets: ["RoomcastCore"]),
    ],
    targets: [
        // Glibc's Swift overlay lacks epoll, signalfd, timerfd, eventfd, accept4
        // and getopt_long (notes/swift-linux.md §2): one small C target for them.
        .target(name: "CShim"),
        // libsystemd (sd_notify, sd_listen_fds, sd_watchdog_enabled, sd_journal_sendv).
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        // Pure logic, standard library only: frame codec, proto2, timing wheel,
        // config, relay policy. No clock, no sockets (only Config.load reads a file).
        .target(name: "RoomcastCore"),
        // The reactor and everything that talks to the kernel or systemd.
        .target(name: "RoomcastServer", dependencies: ["RoomcastCore", "CShim", "CSystemd"]),
        .executableTarget(name: "roomcastd", dependencies: ["RoomcastServer", "RoomcastCore"]),
        // The load generator of BENCHMARKS.md: one thread, its own small epoll loop
        // (CShim), the package's frame codec and proto2 bodies (RoomcastCore).
        .executableTarget(name: "roomcast-bench", dependencies: ["RoomcastCore", "CShim"]),
        .testTarget(
            name: "RoomcastTests",
            dependencies: ["RoomcastCore", "RoomcastServer", "roomcastd", "roomcast-bench"],
            // Reference/proto_ref.py is run by the tests with python3, not bundled.
            exclude: ["Reference"]
        ),
    ]
)
