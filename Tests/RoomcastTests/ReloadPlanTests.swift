// The reload diff (Config.reloadPlan): what a SIGHUP applies at once and
// what waits for a restart, without a daemon.
import Testing
@testable import RoomcastCore

@Suite struct ReloadPlanTests {
    static func config(_ text: String) throws -> Config { try Config.parse(text, file: "t") }

    @Test("live settings apply; listen, byte order and log target keep their running values and are named")
    func restartOnlySettingsAreKept() throws {
        let running = try Self.config("[server]\nlisten = 127.0.0.1:9000\n[json]\nlisten = 127.0.0.1:9001\n"
            + "[websocket]\nlisten = 127.0.0.1:9002\n")
        let file = try Self.config("""
            [server]
            listen = 127.0.0.1:9100
            default_room = hall
            [protocol]
            byte_order = big
            echo = no
            [heartbeat]
            timeout = 5s
            [log]
            target = stderr
            level = debug
            [json]
            listen = 127.0.0.1:9101
            [websocket]
            listen = 127.0.0.1:9102
            max_message_bytes = 1K
            """)
        let plan = running.reloadPlan(to: file, listenOverridden: false, socketActivated: false)
        #expect(plan.needRestart == ["server.listen", "json.listen", "websocket.listen", "protocol.byte_order", "log.target"])
        #expect(plan.applied.webSocket.listen == running.webSocket.listen)
        #expect(plan.applied.webSocket.maxMessageBytes == 1024)
        #expect(plan.applied.server.listen == running.server.listen)
        #expect(plan.applied.json.listen == running.json.listen)
        #expect(plan.applied.protocol.byteOrder == .little)
        #expect(plan.applied.log.target == running.log.target)
        #expect(plan.applied.server.defaultRoom == "hall")
        #expect(plan.applied.protocol.echo == false)
        #expect(plan.applied.heartbeat.timeoutMs == 5_000)
        #expect(plan.applied.log.level == .debug)
    }

    @Test("an unchanged file needs no restart and changes nothing")
    func unchangedFile() throws {
        let running = try Self.config("[server]\nlisten = 127.0.0.1:9000\n")
        let plan = running.reloadPlan(to: running, listenOverridden: false, socketActivated: false)
        #expect(plan.needRestart.isEmpty)
        #expect(plan.applied == running)
    }

    @Test("listen addresses not in use (--listen, socket activation) are not reported")
    func listenNotInUse() throws {
        let running = try Self.config("[server]\nlisten = 127.0.0.1:9000\n")
        let file = try Self.config("[server]\nlisten = 127.0.0.1:9100\n[json]\nlisten = 127.0.0.1:9101\n")
        #expect(running.reloadPlan(to: file, listenOverridden: true, socketActivated: false).needRestart == ["json.listen"])
        let activated = running.reloadPlan(to: file, listenOverridden: false, socketActivated: true)
        #expect(activated.needRestart.isEmpty)
        #expect(activated.applied.server.listen == running.server.listen && activated.applied.json.listen == running.json.listen)
    }
}

@Suite struct ClusterReloadPlanTests {
    @Test("a changed Redis or cluster name waits for a restart; timeout and max_output_bytes apply at once")
    func clusterKeys() throws {
        let running = try ReloadPlanTests.config("[cluster]\nredis = 127.0.0.1:6379\nname = a\n")
        let file = try ReloadPlanTests.config("[cluster]\nredis = unix:/run/redis.sock\nname = b\ntimeout = 5s\nmax_output_bytes = 1M\n")
        let plan = running.reloadPlan(to: file, listenOverridden: false, socketActivated: true)
        #expect(plan.needRestart == ["cluster.redis", "cluster.name"])
        #expect(plan.applied.cluster.redis == running.cluster.redis)
        #expect(plan.applied.cluster.name == "a")
        #expect(plan.applied.cluster.timeoutMs == 5_000)
        #expect(plan.applied.cluster.maxOutputBytes == 1 << 20)
    }

    @Test("turning the cluster on or off by reload is refused too")
    func onOff() throws {
        let off = try ReloadPlanTests.config("")
        let on = try ReloadPlanTests.config("[cluster]\nredis = 127.0.0.1:6379\n")
        #expect(off.reloadPlan(to: on, listenOverridden: false, socketActivated: false).needRestart == ["cluster.redis"])
        #expect(off.reloadPlan(to: on, listenOverridden: false, socketActivated: false).applied.cluster.redis == nil)
        #expect(on.reloadPlan(to: off, listenOverridden: false, socketActivated: false).applied.cluster.redis == on.cluster.redis)
    }
}
