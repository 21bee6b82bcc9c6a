// `[limits]`: slow consumers and rate limits per client.

extension Config {
    /// `shed`: what a slow consumer stops being given before it is cut
    /// (docs/protocol/rooms.md §6, "Shedding").
    public enum Shed: String, Equatable, Sendable, CaseIterable {
        /// Text frames (type 2) sent by others are not given to a connection
        /// whose backlog is above `output_soft_bytes`; it is told how many
        /// with the notice `skipped` once it is back at or under it (default).
        case text
        /// Nothing is shed: a slow consumer gets every frame until a limit cuts it.
        case none
    }

    /// `[limits]`: per-client output queue (slow consumers).
    public struct Limits: Equatable, Sendable {
        /// `output_soft_bytes`: queue size above which the soft timer runs.
        /// Default 256K; must not exceed `output_hard_bytes`.
        public var outputSoftBytes: Int
        /// `output_soft_seconds` (a duration despite the name): how long the
        /// queue may stay above the soft size before the client is closed.
        /// 0 ... 24h, default 10s.
        public var outputSoftMs: UInt64
        /// `output_hard_bytes`: queue size that closes the client at once.
        /// Default 4M; at least `max_frame_bytes` + 6 so one frame of the
        /// maximum size can always be queued.
        public var outputHardBytes: Int
        /// `frames_per_second`: frames a client may send per second (token
        /// bucket); frames over it are dropped and count as violations.
        /// 0 = no limit (default).
        public var framesPerSecond: Int
        /// `frames_burst`: bucket size for `frames_per_second`; 0 = one
        /// second's worth (default).
        public var framesBurst: Int
        /// `bytes_per_second`: bytes (headers included) a client may send per
        /// second, as above. 0 = no limit (default).
        public var bytesPerSecond: Int
        /// `bytes_burst`: bucket size for `bytes_per_second`, at least one
        /// frame of `max_frame_bytes`; 0 = one second's worth (default).
        public var bytesBurst: Int
        /// `shed`: `text` (default) or `none`, see `Shed`. Applies on SIGHUP
        /// to connected clients.
        public var shed: Shed = .text
    }
}

extension SectionSpec {
    /// `[limits]`: its keys, in the order of config/roomcastd.conf.
    static let limits = SectionSpec(section: "limits", keys: [
        KeySpec(name: "output_soft_bytes") { c, v throws(ValueError) in
            c.limits.outputSoftBytes = try size(v, 0...Int.max)
        },
        KeySpec(name: "output_soft_seconds") { c, v throws(ValueError) in
            c.limits.outputSoftMs = try duration(v, 0...oneDayMs)
        },
        KeySpec(name: "output_hard_bytes") { c, v throws(ValueError) in
            c.limits.outputHardBytes = try size(v, 1...Int.max)
        },
        KeySpec(name: "frames_per_second") { c, v throws(ValueError) in
            c.limits.framesPerSecond = try integer(v, 0...100_000_000)
        },
        KeySpec(name: "frames_burst") { c, v throws(ValueError) in
            c.limits.framesBurst = try integer(v, 0...100_000_000)
        },
        KeySpec(name: "bytes_per_second") { c, v throws(ValueError) in
            c.limits.bytesPerSecond = try size(v, 0...(1 << 40))
        },
        KeySpec(name: "bytes_burst") { c, v throws(ValueError) in
            c.limits.bytesBurst = try size(v, 0...(1 << 40))
        },
        KeySpec(name: "shed") { c, v throws(ValueError) in c.limits.shed = try choice(v) },
    ])
}

extension Config {
    /// `[limits]`'s rules: the soft size under the hard one, and every limit
    /// large enough for one frame of the maximum size of each dialect.
    func checkLimitsRules(_ rule: RuleContext) throws(ConfigError) {
        let p = self.protocol
        if limits.outputSoftBytes > limits.outputHardBytes {
            throw rule.fail(["limits.output_soft_bytes", "limits.output_hard_bytes"],
                            "limits.output_soft_bytes (\(formatSize(limits.outputSoftBytes))) must not exceed "
                            + "limits.output_hard_bytes (\(formatSize(limits.outputHardBytes)))")
        }
        if limits.outputHardBytes < p.maxFrameBytes + 6 {
            throw rule.fail(["limits.output_hard_bytes", "protocol.max_frame_bytes"],
                            "limits.output_hard_bytes (\(formatSize(limits.outputHardBytes))) must be at least "
                            + "protocol.max_frame_bytes + 6 (\(p.maxFrameBytes + 6)) so one frame of the "
                            + "maximum size can always be queued")
        }
        // A bucket smaller than one frame of the maximum size would refuse
        // such frames forever (the JSON limit counts when JSON is listened on).
        let burst = limits.bytesBurst != 0 ? limits.bytesBurst : limits.bytesPerSecond
        let largest = max(p.maxFrameBytes + 6, json.listen.isEmpty ? 0 : json.maxFrameBytes + 4)
        if limits.bytesPerSecond != 0 && burst < largest {
            throw rule.fail(["limits.bytes_per_second", "limits.bytes_burst", "protocol.max_frame_bytes", "json.max_frame_bytes"],
                            "limits.bytes_burst (or bytes_per_second when the burst is 0) is \(formatSize(burst)): it must hold "
                            + "one frame of max_frame_bytes (\(largest) with its header)")
        }
        if limits.outputHardBytes < json.maxFrameBytes + 4 {
            throw rule.fail(["limits.output_hard_bytes", "json.max_frame_bytes"],
                            "limits.output_hard_bytes (\(formatSize(limits.outputHardBytes))) must be at least "
                            + "json.max_frame_bytes + 4 (\(json.maxFrameBytes + 4))")
        }
    }
}
