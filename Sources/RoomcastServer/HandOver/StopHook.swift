import CSystemd
import Glibc

/// `roomcastd --stop-hook $MAINPID`, run by the unit as `ExecStop=+...`:
/// as root and outside the sandbox, before systemd sends SIGTERM. It asks
/// PID 1 which job is stopping the service and, when it is a restart, sends
/// the daemon SIGUSR2, so that the SIGTERM which follows hands every
/// connection over to the next process (HandOver.swift) instead of closing
/// it. A `systemctl stop` must still close the connections gracefully:
/// systemd 252 empties the fd store on a stop, so handed-over clients would
/// only lose what they were owed.
///
/// systemd 252 tells a service nothing about why it is stopped, and the
/// daemon's own sandbox cannot ask: with DynamicUser=, PrivateUsers= or
/// PrivateNetwork= every D-Bus call failed (ENOTCONN, measured in the test
/// container), hence this hook with `+`.
///
/// It never fails the stop: whatever goes wrong, it exits 0 and the daemon
/// stops as it always did (clients see a close).
public enum StopHook {
    /// SIGUSR2: "the SIGTERM that follows is a restart".
    public static let restartSignal = SIGUSR2

    /// - Parameter mainPID: `$MAINPID` as systemd expands it ("" when the
    ///   main process is gone).
    /// - Returns: the exit status (always 0).
    public static func run(mainPID: String) -> Int32 {
        guard let pid = Int32(mainPID), pid > 0 else {
            say("no main process: nothing to tell")
            return 0
        }
        switch jobType() {
        case .success(let type?) where type == "restart" || type == "try-restart":
            if kill(pid, restartSignal) == 0 {
                say("job \(type): asked roomcastd (PID \(pid)) to hand its connections over to the next process")
            } else {
                say("job \(type): cannot signal PID \(pid): \(String(cString: strerror(errno)))")
            }
        case .success(let type):
            say("job \(type ?? "none"): roomcastd stops and closes its connections")
        case .failure(let why):
            say("cannot tell a restart from a stop (\(why.text)): roomcastd stops and closes its connections")
        }
        return 0
    }

    struct Failure: Error { var text: String }

    /// The type of the job PID 1 runs on the unit this process belongs to
    /// (`restart`, `stop`, ...), nil when there is none.
    static func jobType() -> Result<String?, Failure> {
        guard let bus = connect() else { return .failure(Failure(text: "no connection to systemd")) }
        defer { sd_bus_flush_close_unref(bus) }
        _ = sd_bus_set_method_call_timeout(bus, 2_000_000)
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer? = nil
        // unit/self: the unit of the calling process (this hook runs in the
        // service's cgroup).
        var r = sd_bus_get_property(bus, "org.freedesktop.systemd1", "/org/freedesktop/systemd1/unit/self",
                                    "org.freedesktop.systemd1.Unit", "Job", &error, &reply, "(uo)")
        guard r >= 0, let reply else { return .failure(Failure(text: "Job: " + message(error, r))) }
        defer { sd_bus_message_unref(reply) }
        var id: UInt32 = 0
        var path: UnsafePointer<CChar>? = nil
        r = sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "r")), "uo")
        if r >= 0 { r = sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "u")), &id) }
        if r >= 0 { r = sd_bus_message_read_basic(reply, CChar(UInt8(ascii: "o")), &path) }
        guard r >= 0, let path else { return .failure(Failure(text: "Job: " + message(error, r))) }
        if id == 0 { return .success(nil) }
        var type: UnsafeMutablePointer<CChar>? = nil
        r = sd_bus_get_property_string(bus, "org.freedesktop.systemd1", path, "org.freedesktop.systemd1.Job", "JobType", &error, &type)
        guard r >= 0, let type else { return .failure(Failure(text: "JobType: " + message(error, r))) }
        defer { free(type) }
        return .success(String(cString: type))
    }

    /// PID 1's private socket (root, no D-Bus daemon needed), else the system bus.
    private static func connect() -> OpaquePointer? {
        var bus: OpaquePointer? = nil
        if geteuid() == 0, sd_bus_new(&bus) >= 0 {
            if sd_bus_set_address(bus, "unix:path=/run/systemd/private") >= 0, sd_bus_start(bus) >= 0 { return bus }
            sd_bus_flush_close_unref(bus)
            bus = nil
        }
        return sd_bus_open_system(&bus) >= 0 ? bus : nil
    }

    private static func message(_ error: sd_bus_error, _ r: Int32) -> String {
        if let m = error.message { return String(cString: m) }
        return String(cString: strerror(-r))
    }

    /// One line on stdout: the journal, under the unit.
    private static func say(_ text: String) {
        print("roomcastd --stop-hook: " + text)
    }
}
