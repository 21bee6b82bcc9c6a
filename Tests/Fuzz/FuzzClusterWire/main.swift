// libFuzzer target: the cluster envelope (ClusterWire.swift, docs/cluster.md
// "What arrives from Redis") that a daemon reads from every room channel and
// the daemons channel, with what it carries: a relayed frame judged by
// `ClusterFrameCheck` and a `counts` payload. Whatever the bytes, decoding
// never traps; an accepted envelope re-encodes to the same bytes (so the
// decoder reads exactly what `encode` writes, nothing more); an accepted
// frame announces exactly the bytes after its header; accepted counts stay
// within their bounds (rooms 1 ... max_room_bytes of UTF-8, members
// 1 ... `ClusterCounts.maxMembers`, at most `maxRooms` rooms, none twice)
// and survive their own encoding. Input: the whole as an envelope, and the
// whole as a counts payload. Build and run: `make fuzz`.
import RoomcastCore

/// The bounds the fuzzed counts are held to (small, so that the fuzzer
/// reaches the room limit).
private let maxRoomBytes = 16, maxRooms = 64

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzClusterWire(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: data == nil ? 0 : size))
    bytes.withUnsafeBytes { p in
        if case .success(let view) = ClusterEnvelope.decode(p) { check(view, of: p) }
        checkCounts(p)
    }
    return 0
}

/// An accepted envelope: its parts tile the payload, and it re-encodes to it.
private func check(_ view: ClusterEnvelope.View, of p: UnsafeRawBufferPointer) {
    let parts = view.room.count + view.address.count + view.sub.count + view.frame.count
    let fixed = view.version == ClusterEnvelope.version ? ClusterEnvelope.fixedSize : ClusterEnvelope.fixedSizeWithSub
    precondition(fixed + parts == p.count, "the envelope's parts do not add up to its bytes")
    precondition(view.version == ClusterEnvelope.versionWithSub || view.sub.isEmpty, "a sub in a version 1 envelope")
    switch view.kind {
    case .littleEndianFrame, .bigEndianFrame:
        let order: ByteOrder = view.kind == .littleEndianFrame ? .little : .big
        guard case .frame(_, let length) = FrameCodec.parse(view.frame, byteOrder: order, maxFrameBytes: Int.max) else {
            preconditionFailure("an accepted frame envelope without a frame")
        }
        precondition(FrameCodec.headerSize + length == view.frame.count, "a frame whose header does not match its bytes")
        let room = RoomName(bytes: Array(view.room))
        for validate in [true, false] {
            _ = ClusterFrameCheck.refusal(view.frame, order: order, room: room, sub: view.sub, settings: RelaySettings(validate: validate))
        }
    case .counts:
        checkCounts(view.frame)
    case .heartbeat, .bye, .handingOver:
        break
    }
    // Re-encoding needs the address and sub as strings: only UTF-8 ones
    // (what a daemon writes) can round-trip.
    guard let address = String(validating: view.address, as: UTF8.self),
          let sub = String(validating: view.sub, as: UTF8.self) else { return }
    var again: [UInt8] = []
    ClusterEnvelope.encode(kind: view.kind, origin: view.origin, stream: view.stream, seq: view.seq, room: RoomName(bytes: Array(view.room)),
                           address: address, sub: view.version == ClusterEnvelope.versionWithSub ? sub : nil, frame: view.frame, into: &again)
    precondition(again.elementsEqual(p), "an envelope does not survive its own encoding")
}

/// Counts that decode are within bounds and decode again from their encoding.
private func checkCounts(_ p: UnsafeRawBufferPointer) {
    guard case .success(let counts) = ClusterCounts.decode(p, maxRoomBytes: maxRoomBytes, maxRooms: maxRooms) else { return }
    precondition(counts.count <= maxRooms, "\(counts.count) rooms, over \(maxRooms)")
    for (room, members) in counts {
        precondition((1...maxRoomBytes).contains(room.bytes.count) && String(validating: room.bytes, as: UTF8.self) != nil,
                     "a room of \(room.bytes.count) bytes accepted")
        precondition((1...ClusterCounts.maxMembers).contains(members), "\(members) members accepted")
    }
    var encoded: [UInt8] = []
    ClusterCounts.encode(counts.map { (room: $0.key, members: $0.value) }, into: &encoded)
    let again = encoded.withUnsafeBytes { ClusterCounts.decode($0, maxRoomBytes: maxRoomBytes, maxRooms: maxRooms) }
    precondition(again == .success(counts), "counts do not survive their own encoding")
}
