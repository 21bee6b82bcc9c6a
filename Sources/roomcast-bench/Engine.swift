@preconcurrency import COpenSSL
import CShim
@preconcurrency import Glibc
import RoomcastCore

/// A connection's part in the workload.
enum Role: UInt8 {
    /// Sends data frames; in the room (roomcast) but never counted as a recipient.
    case publisher
    /// Receives data frames: every one it gets is a delivery.
    case member
    /// Idle or storm connection (group 1): joins its own small room, heartbeats.
    case extra
}

enum ConnState: UInt8 { case free, connecting, handshaking, open, closed }

/// A member's WebSocket phase (`--websocket-port`; RFC 6455 §4): none (LTB),
/// waiting for the 101 answer, or exchanging frames.
enum WebSocketPhase: UInt8 { case none, upgrading, open }

/// One client connection. Kept in a raw array: the hot loop touches it
/// through a pointer, with no ARC, no copy-on-write and no exclusivity checks.
struct Conn {
    var fd: Int32 = -1
    var role = Role.member
    var state = ConnState.free
    var writeArmed = false
    var webSocket = WebSocketPhase.none
    var retries: UInt8 = 0
    /// Publisher index (publishers), room number within the group (extras).
    var index: Int32 = 0
    var room: Int32 = 0
    /// Bytes of an incomplete message kept between reads.
    var carry: UnsafeMutableRawPointer?
    var carryLen = 0
    var carryCap = 0
    /// Output not yet accepted by the kernel.
    var out: UnsafeMutableRawPointer?
    var outStart = 0
    var outLen = 0
    var outCap = 0
    /// `--tls`: the OpenSSL session (`SSL *`).
    var ssl: OpaquePointer?
}

/// The single-threaded epoll load generator (level-triggered, one read per
/// readiness event into one 256 KiB scratch buffer, one clock read per read).
final class Engine {
    let o: Options
    let wire: Wire
    let epfd: Int32
    let capacity: Int
    let conns: UnsafeMutablePointer<Conn>
    var count = 0
    let scratch: UnsafeMutableRawPointer
    let scratchCap: Int
    let eventCap = 1024
    let events: UnsafeMutablePointer<epoll_event>
    var address = sockaddr_in()
    /// One per `--port` (the first is `address`): members are spread over them.
    var addresses: [sockaddr_in] = []
    let heartbeatBytes: [UInt8]
    static let connectBurst = 64

    // Publishers (closed-loop window state: ring of per-frame receipt counts).
    var publisherIDs: [Int] = []
    var templates: [UnsafeMutableRawPointer] = []
    var payloadAt = 0
    var messageLen = 0
    var nextSeq: UnsafeMutablePointer<UInt64>
    var oldest: UnsafeMutablePointer<UInt64>
    var ring: UnsafeMutablePointer<Int32>
    let ringSize: Int
    /// Recipients of each data frame (members of the main room).
    var recipients: Int32 = 0

    // API publishers (`--api-port`): one request outstanding per connection.
    let apiKey: String
    /// This run's part of every Idempotency-Key: a daemon remembers keys for
    /// 5 minutes, and a second run's keys must not be the first run's.
    let runID = UInt64.random(in: 1...UInt64.max)
    var apiRequests: [APIPublishRequest] = []
    var apiAddress = sockaddr_in()
    /// Whether publisher p's request awaits its answer, and when it was sent (ns).
    let awaiting: UnsafeMutablePointer<Bool>
    let requestSentNs: UnsafeMutablePointer<UInt64>
    /// Publishes answered 200 (all, and while measuring), answered otherwise.
    var apiOK: UInt64 = 0
    var measuredPublishes: UInt64 = 0
    var apiErrors: UInt64 = 0
    /// 200 answers whose `{"delivered": N}` was not the room's members.
    var deliveredMismatch: UInt64 = 0
    /// Request latency: the request's send to its whole answer (measured requests).
    var requestHist = Histogram()

    // Connecting.
    var launchNext = 0
    var launchLimit = 0
    var inflight = 0
    var inflightLimit = 512
    var openCount = [0, 0]
    var connectErrors = 0
    var closedByServer = 0
    var firstError: String?

    // Set-up confirmations: join frames received (roomcast), subscribe replies (Redis).
    var joinsReceived = [0, 0]
    var subscribed = [0, 0]

    // Load.
    var sending = false
    var framesLimit: UInt64 = .max
    var framesSent: UInt64 = 0
    var rateStartNs: UInt64 = 0
    var rateSent: UInt64 = 0
    var maxSendLagNs: UInt64 = 0
    var maxTurnNs: UInt64 = 0
    var deliveries: UInt64 = 0
    var measuredDeliveries: UInt64 = 0
    var completedFrames: UInt64 = 0
    var measuring = false
    var inStorm = false
    var hist = Histogram()
    var stormHist = Histogram()
    var publisherReceipts: UInt64 = 0
    var otherFrames: UInt64 = 0
    var pongs: UInt64 = 0
    var serverErrors: UInt64 = 0
    var bytesIn: UInt64 = 0
    /// read(2) calls that returned data, and their bytes, while measuring:
    /// how the server's writes reach the generator (many small ones cost it more).
    var measuredReads: UInt64 = 0
    var measuredBytesIn: UInt64 = 0
    /// Next sequence number each member expects from each publisher
    /// ([member id * publishers + publisher]).
    let nextExpected: UnsafeMutablePointer<UInt64>
    /// Data frames that arrived out of order, twice, after a gap, or from no publisher.
    var orderErrors: UInt64 = 0

    // Heartbeats.
    var heartbeatStartNs: UInt64 = 0
    var heartbeatCursor = 0
    var heartbeatsDone: UInt64 = 0
    var heartbeatsSent: UInt64 = 0
    var lastPeriodicNs: UInt64 = 0

    /// - Parameters: `apiKey`, the bearer key of the `--api-port` publishers.
    init(_ o: Options, capacity: Int, apiKey: String = "") {
        self.o = o
        self.apiKey = apiKey
        self.wire = Wire(o)
        self.capacity = capacity
        epfd = epoll_create1(Int32(EPOLL_CLOEXEC))
        precondition(epfd >= 0, "epoll_create1 failed")
        conns = .allocate(capacity: max(1, capacity))
        conns.initialize(repeating: Conn(), count: max(1, capacity))
        scratchCap = max(o.readSize, 4 * (o.size + 256)) + o.size + 256
        scratch = .allocate(byteCount: scratchCap, alignment: 16)
        events = .allocate(capacity: eventCap)
        events.initialize(repeating: epoll_event(), count: eventCap)
        heartbeatBytes = wire.heartbeat()
        let p = max(1, o.publishers)
        ringSize = o.window
        nextSeq = .allocate(capacity: p); nextSeq.initialize(repeating: 0, count: p)
        oldest = .allocate(capacity: p); oldest.initialize(repeating: 0, count: p)
        ring = .allocate(capacity: p * ringSize); ring.initialize(repeating: 0, count: p * ringSize)
        let members = o.publishers > 0 ? max(1, capacity) * p : 1
        nextExpected = .allocate(capacity: members); nextExpected.initialize(repeating: 0, count: members)
        awaiting = .allocate(capacity: p); awaiting.initialize(repeating: false, count: p)
        requestSentNs = .allocate(capacity: p); requestSentNs.initialize(repeating: 0, count: p)
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = o.port.bigEndian
        guard inet_pton(AF_INET, o.host, &address.sin_addr) == 1 else { fatal("bad IPv4 address '\(o.host)'") }
        addresses = (o.ports.isEmpty ? [o.port] : o.ports).map { port in
            var a = address
            a.sin_port = port.bigEndian
            return a
        }
        apiAddress = address
        apiAddress.sin_port = (o.apiPort ?? o.port).bigEndian
    }

    /// `--tls`: one client context for every connection (no verification).
    lazy var tlsContext: OpaquePointer = {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else { fatal("SSL_CTX_new failed") }
        // SSL_write retried from the same bytes at a moved address (the output buffer grows).
        _ = SSL_CTX_ctrl(ctx, SSL_CTRL_MODE, Int(SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE), nil)
        return ctx
    }()
}

func fatal(_ message: String) -> Never {
    fputs("roomcast-bench: \(message)\n", stderr)
    exit(1)
}
