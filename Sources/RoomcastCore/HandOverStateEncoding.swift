// Writing a hand-over state (the format: HandOverState.swift; the tags: HandOverStateTags.swift).
extension HandOverState {
    // MARK: - Encoding

    /// At least the bytes `encode` writes for one connection with fields of
    /// these sizes (in bytes), so that a writer can keep a state under what
    /// its reader accepts before it encodes anything.
    public static func recordBytesBound(address: Int, room: Int, identity: Int, nickname: Int, input: Int, output: Int,
                                        claims: Int = 0, webSocketMessage: Int = 0) -> Int {
        // 6 per record header, 8 per integer, every field present.
        6 + FieldTag.allCount * 14 + address + room + identity + nickname + input + output + claims
            + (webSocketMessage > 0 ? 6 + 16 * 14 + webSocketMessage : 0)
    }

    /// At least the bytes `encode` writes for the cluster record `c`: its
    /// header, three integers, and per stream a header, the room's bytes and
    /// two integers.
    /// At least the bytes of the moderation records.
    public static func moderationBytesBound(_ records: [ModerationRecord]) -> Int {
        records.reduce(0) { $0 + 3 * 6 + $1.field.utf8.count + $1.value.utf8.count }
    }

    /// At least the bytes of the room stream records.
    public static func roomsBytesBound(_ rooms: [RoomStream]) -> Int {
        rooms.reduce(0) { $0 + 6 + 3 * 14 + 6 + $1.room.bytes.count + $1.position.epoch.utf8.count
            + $1.history.reduce(0) { $0 + 3 * 6 + 8 + $1.frame.count } }
    }

    public static func clusterBytesBound(_ c: Cluster) -> Int {
        c.streams.reduce(6 + 3 * 14) { $0 + 6 + 6 + $1.room.bytes.count + 2 * 14 }
            + c.positions.reduce(0) { $0 + 6 + 6 + $1.room.bytes.count + 3 * 14 }
    }

    /// At least the bytes of the header and the globals, with `writer`
    /// bytes of text in them (version, box name, socket options).
    public static func globalsBytesBound(writer: Int) -> Int { headerSize + 6 + 16 * 14 + writer }

    /// The bytes of this state in the current version. O(total size): one
    /// buffer, records written in place and their lengths patched after.
    public func encode() -> [UInt8] {
        var w = Writer()
        w.bytes.reserveCapacity(Self.headerSize + 64 + connections.reduce(0) { $0 + 160 + $1.input.count + $1.output.count + ($1.identity?.count ?? 0) })
        w.bytes += Self.magic
        appendLE(&w.bytes, Self.currentVersion)
        appendLE(&w.bytes, UInt16(Self.headerSize))
        w.bytes += [UInt8](repeating: 0, count: Self.headerSize - 8)  // payload length and CRC, patched below
        w.nested(RecordTag.globals.rawValue) { w in
            w.u64(GlobalTag.stoppedReadingMs.rawValue, stoppedReadingMs)
            w.bytes(GlobalTag.writer.rawValue, writer.utf8)
            let webSockets = connections.reduce(0) { $0 + ($1.webSocket == nil ? 0 : 1) }
            w.u32(GlobalTag.connectionCount.rawValue, UInt32(connections.count - webSockets))
            if webSockets > 0 { w.u32(GlobalTag.webSocketCount.rawValue, UInt32(webSockets)) }
            w.bytes(GlobalTag.boxName.rawValue, boxName.utf8)
            w.bytes(GlobalTag.socketOptions.rawValue, socketOptions.utf8)
            if handOvers > 0 { w.u64(GlobalTag.handOvers.rawValue, handOvers) }
        }
        for c in connections {
            w.nested(c.webSocket == nil ? RecordTag.connection.rawValue : RecordTag.webSocketConnection.rawValue) { w in
                w.u64(FieldTag.key.rawValue, c.key)
                w.u8(FieldTag.dialect.rawValue, c.dialect.rawValue)
                w.bytes(FieldTag.peerAddress.rawValue, c.peerAddress.utf8)
                if let room = c.room { w.bytes(FieldTag.room.rawValue, room.bytes) }
                if let identity = c.identity { w.bytes(FieldTag.identity.rawValue, identity) }
                if let nickname = c.nickname { w.bytes(FieldTag.nickname.rawValue, nickname.utf8) }
                if !c.input.isEmpty { w.bytes(FieldTag.input.rawValue, c.input) }
                if !c.output.isEmpty { w.bytes(FieldTag.output.rawValue, c.output) }
                if let ms = c.heartbeatRemainingMs { w.u32(FieldTag.heartbeatRemainingMs.rawValue, ms) }
                if let ms = c.partialFrameRemainingMs { w.u32(FieldTag.partialFrameRemainingMs.rawValue, ms) }
                if c.violations > 0 { w.u32(FieldTag.violations.rawValue, c.violations) }
                if let t = c.frameMilliTokens { w.u64(FieldTag.frameMilliTokens.rawValue, UInt64(bitPattern: t)) }
                if let t = c.byteMilliTokens { w.u64(FieldTag.byteMilliTokens.rawValue, UInt64(bitPattern: t)) }
                if c.draining { w.u8(FieldTag.draining.rawValue, 1) }
                if c.tornBytes > 0 { w.u64(FieldTag.tornBytes.rawValue, c.tornBytes) }
                if let ms = c.softLimitElapsedMs { w.u32(FieldTag.softLimitElapsedMs.rawValue, ms) }
                if let claims = c.authClaims { w.bytes(FieldTag.authClaims.rawValue, claims.json) }
                if let ws = c.webSocket { w.nested(FieldTag.webSocket.rawValue) { w in Self.encode(ws, &w) } }
                if c.positions { w.u8(FieldTag.positions.rawValue, 1) }
                if c.textsShed > 0 { w.u32(FieldTag.textsShed.rawValue, c.textsShed) }
                if let ms = c.lastTextMs { w.u64(FieldTag.lastTextMs.rawValue, ms) }
            }
        }
        if let cluster {
            w.nested(RecordTag.cluster.rawValue) { w in
                w.u64(ClusterTag.origin.rawValue, cluster.origin)
                w.u64(ClusterTag.lastStream.rawValue, cluster.lastStream)
                if let by = cluster.returnByMs { w.u64(ClusterTag.returnBy.rawValue, by) }
                for s in cluster.streams {
                    w.nested(ClusterTag.stream.rawValue) { w in
                        w.bytes(ClusterTag.room.rawValue, s.room.bytes)
                        w.u64(ClusterTag.id.rawValue, s.id)
                        w.u64(ClusterTag.seq.rawValue, s.seq)
                    }
                }
                for p in cluster.positions {
                    w.nested(ClusterTag.position.rawValue) { w in
                        w.bytes(ClusterTag.room.rawValue, p.room.bytes)
                        w.u64(ClusterTag.positionOrigin.rawValue, p.origin)
                        w.u64(ClusterTag.id.rawValue, p.stream)
                        w.u64(ClusterTag.seq.rawValue, p.seq)
                    }
                }
            }
        }
        for m in moderation {
            w.nested(RecordTag.moderation.rawValue) { w in
                w.bytes(ModerationTag.field.rawValue, m.field.utf8)
                w.bytes(ModerationTag.value.rawValue, m.value.utf8)
            }
        }
        for room in rooms {
            w.nested(RecordTag.room.rawValue) { w in
                w.bytes(RoomTag.name.rawValue, room.room.bytes)
                w.bytes(RoomTag.epoch.rawValue, room.position.epoch.utf8)
                w.u64(RoomTag.seq.rawValue, UInt64(bitPattern: room.position.seq))
                for f in room.history {
                    w.nested(RoomTag.frame.rawValue) { w in
                        w.u64(RoomTag.frameSeq.rawValue, UInt64(bitPattern: f.seq))
                        w.bytes(RoomTag.frameBytes.rawValue, f.frame)
                    }
                }
            }
        }
        // Idempotency-Keys (HandOverStateIdempotency.swift): one record each.
        for e in idempotency {
            w.nested(RecordTag.idempotency.rawValue) { w in
                w.bytes(IdempotencyTag.key.rawValue, e.key)
                w.bytes(IdempotencyTag.fingerprint.rawValue, e.fingerprint)
                w.u64(IdempotencyTag.delivered.rawValue, e.delivered)
                w.u32(IdempotencyTag.remainingMs.rawValue, e.remainingMs)
            }
        }
        let payloadBytes = w.bytes.count - Self.headerSize
        let crc = w.bytes.withUnsafeBytes { CRC32.checksum(UnsafeRawBufferPointer(rebasing: $0[Self.headerSize...])) }
        w.patch(at: 8, UInt64(payloadBytes))
        w.patch(at: 16, crc)
        return w.bytes
    }

    private static func encode(_ ws: WebSocket, _ w: inout Writer) {
        w.u8(WebSocketTag.upgraded.rawValue, ws.upgraded ? 1 : 0)
        w.bytes(WebSocketTag.subprotocol.rawValue, ws.subprotocol.rawValue.utf8)
        if ws.echo { w.u8(WebSocketTag.echo.rawValue, 1) }
        let d = ws.decoder
        if let op = d.messageOpcode { w.u8(WebSocketTag.messageOpcode.rawValue, op.rawValue) }
        if !d.message.isEmpty { w.bytes(WebSocketTag.message.rawValue, d.message) }
        w.bytes(WebSocketTag.utf8.rawValue, d.utf8.packed)
        if d.checkedOfPartialFrame > 0 {
            w.u64(WebSocketTag.checkedOfPartialFrame.rawValue, UInt64(d.checkedOfPartialFrame))
            w.bytes(WebSocketTag.partialUTF8.rawValue, d.partialUTF8.packed)
        }
        if let ms = ws.upgradeRemainingMs { w.u32(WebSocketTag.upgradeRemainingMs.rawValue, ms) }
        if let ms = ws.nextPingMs { w.u32(WebSocketTag.nextPingMs.rawValue, ms) }
    }

}

// MARK: - Records

/// Appends tag-length-value records to one buffer.
private struct Writer {
    var bytes: [UInt8] = []

    mutating func bytes(_ tag: UInt16, _ value: some Collection<UInt8>) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(value.count))
        bytes += value
    }

    mutating func u8(_ tag: UInt16, _ v: UInt8) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(1))
        bytes.append(v)
    }

    mutating func u32(_ tag: UInt16, _ v: UInt32) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(4))
        appendLE(&bytes, v)
    }

    mutating func u64(_ tag: UInt16, _ v: UInt64) {
        appendLE(&bytes, tag)
        appendLE(&bytes, UInt32(8))
        appendLE(&bytes, v)
    }

    /// A record whose value is the records `body` writes, in place: its
    /// length is patched once they are written.
    mutating func nested(_ tag: UInt16, _ body: (inout Writer) -> Void) {
        appendLE(&bytes, tag)
        let lengthAt = bytes.count
        appendLE(&bytes, UInt32(0))
        body(&self)
        patch(at: lengthAt, UInt32(bytes.count - lengthAt - 4))
    }

    mutating func patch<T: FixedWidthInteger>(at offset: Int, _ value: T) {
        withUnsafeBytes(of: value.littleEndian) { v in
            for i in 0..<v.count { bytes[offset + i] = v[i] }
        }
    }
}

private func appendLE<T: FixedWidthInteger>(_ out: inout [UInt8], _ value: T) {
    var v = value.littleEndian
    withUnsafeBytes(of: &v) { out.append(contentsOf: $0) }
}
