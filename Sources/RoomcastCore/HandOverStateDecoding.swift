// Reading a hand-over state (the format: HandOverState.swift; the records:
// HandOverStateTables.swift).
extension HandOverState {
    /// Why a state could not be read; `reason` is the log's `REASON=` code.
    public enum DecodeError: Error, Equatable, CustomStringConvertible {
        /// Written by a newer format than this binary knows.
        case unknownVersion(UInt16)
        /// Truncated, corrupted or not a hand-over state at all.
        case damaged(String)

        /// The log's `REASON=` code: `handover_state_version` or `handover_state_damaged`.
        public var reason: String {
            switch self {
            case .unknownVersion: "handover_state_version"
            case .damaged: "handover_state_damaged"
            }
        }

        /// The log line's text: what was wrong, where the bytes say it.
        public var description: String {
            switch self {
            case .unknownVersion(let v): "hand-over state version \(v) is newer than this binary's (\(HandOverState.currentVersion))"
            case .damaged(let why): "hand-over state damaged: \(why)"
            }
        }
    }

    /// Reads a state written by this version or any earlier one.
    /// - Throws: `DecodeError.unknownVersion` for a newer version,
    ///   `.damaged` for anything truncated, corrupted or inconsistent.
    public static func decode(_ bytes: [UInt8]) throws(DecodeError) -> HandOverState {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(DecodeError) in try decode(raw) } }
        return try result.get()
    }

    /// `decode` on bytes in place (e.g. a mapped memfd).
    /// - Throws: as `decode(_: [UInt8])`.
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> HandOverState {
        guard bytes.count >= 8 else { throw .damaged("\(bytes.count) bytes, shorter than a header") }
        guard bytes.prefix(4).elementsEqual(magic) else { throw .damaged("no RCHO magic") }
        let version = Reader.load(bytes, 4, as: UInt16.self)
        guard version >= 1 else { throw .damaged("version 0") }
        guard version <= currentVersion else { throw .unknownVersion(version) }
        let headerBytes = Int(Reader.load(bytes, 6, as: UInt16.self))
        guard headerBytes >= headerSize, bytes.count >= headerBytes else {
            throw .damaged("header of \(headerBytes) bytes in a \(bytes.count)-byte state")
        }
        let payloadBytes = Reader.load(bytes, 8, as: UInt64.self)
        guard payloadBytes == UInt64(bytes.count - headerBytes) else {
            throw .damaged("payload of \(bytes.count - headerBytes) bytes, header says \(payloadBytes) (truncated?)")
        }
        let body = UnsafeRawBufferPointer(rebasing: bytes[headerBytes...])
        let crc = Reader.load(bytes, 16, as: UInt32.self)
        guard CRC32.checksum(body) == crc else { throw .damaged("checksum mismatch") }
        // Version 1 is the only version so far; a version 2 that changes a
        // field's meaning adds its own tables and a branch here, and keeps these.
        return try payload.read(body).state
    }
}
