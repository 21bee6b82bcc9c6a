// The field tags of the hand-over state's records (the format: HandOverState.swift).
extension HandOverState {
    enum RecordTag: UInt16 {
        case globals = 1
        case connection = 2
        case cluster = 3
        case webSocketConnection = 4
        case moderation = 5
        case room = 6
        /// One remembered Idempotency-Key (`IdempotencyTag`, HandOverStateIdempotency.swift):
        /// far from the sequence above, so that records other changes add there cannot collide.
        case idempotency = 0x4901
    }

    enum RoomTag: UInt16 {
        case name = 1, epoch, seq, frame
        /// Inside a frame record.
        case frameSeq = 10, frameBytes
    }

    enum ModerationTag: UInt16 {
        case field = 1, value
    }

    enum ClusterTag: UInt16 {
        case origin = 1, lastStream, stream
        /// A tracker position: room, origin (`positionOrigin`), id (its stream), seq.
        case position = 4
        /// `Cluster.returnByMs` (an older reader skips it).
        case returnBy = 5
        /// Inside a stream or position record.
        case room = 10, id, seq, positionOrigin
    }

    enum GlobalTag: UInt16 {
        case stoppedReadingMs = 1
        case writer = 2
        /// The number of connection records, a cross-check.
        case connectionCount = 3
        case boxName = 4
        case socketOptions = 5
        case handOvers = 6
        /// The number of WebSocket connection records (tag 4), a cross-check;
        /// far from the sequence above, so that tags other changes add there cannot collide.
        case webSocketCount = 0x5701
    }

    enum WebSocketTag: UInt16 {
        case upgraded = 1, subprotocol, echo, messageOpcode, message, utf8, checkedOfPartialFrame, partialUTF8
        case upgradeRemainingMs, nextPingMs
    }

    enum FieldTag: UInt16 {
        case key = 1, dialect, peerAddress, room, identity, nickname, input, output
        case heartbeatRemainingMs, partialFrameRemainingMs, violations, frameMilliTokens, byteMilliTokens, draining
        case tornBytes = 15, softLimitElapsedMs = 16
        /// Signed joins: far from the sequence above, so fields other changes add there cannot collide with it.
        case authClaims = 0x4101
        /// Positions (docs/protocol/positions.md §4): far from the others for the same reason.
        case positions = 0x5001
        /// Texts shed in the open episode: far from the others for the same reason.
        case textsShed = 0x5E01
        /// Slow mode's last text time: far from the others for the same reason.
        case lastTextMs = 0x5801
        /// A WebSocket connection's state (nested records, `WebSocketTag`).
        case webSocket = 0x5701

        /// More than the number of fields (tags need not be dense).
        static let allCount = 32
    }
}
