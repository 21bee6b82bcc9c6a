// libFuzzer target: for each of the three proto2 bodies, validateBody (what
// the relay runs on every frame) and the decoding init must agree, with the
// same error; whatever decodes must survive decode -> serialize -> decode
// unchanged and serialize to the same bytes again.
// Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzProto2(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let body = UnsafeRawBufferPointer(start: data.map(UnsafeRawPointer.init), count: data == nil ? 0 : size)
    func validation(_ kind: BodyKind, _ bytes: UnsafeRawBufferPointer) -> ProtoError? {
        do { try validateBody(kind, bytes); return nil } catch { return error }
    }
    func check<M: Equatable>(_ kind: BodyKind, _ decode: (UnsafeRawBufferPointer) throws(ProtoError) -> M,
                             _ serialize: (M) -> [UInt8]) {
        let validated = validation(kind, body)
        let decoded = Result { () throws(ProtoError) -> M in try decode(body) }
        switch decoded {
        case .failure(let error):
            precondition(validated == error, "\(kind): validateBody says \(String(describing: validated)), init throws \(error)")
        case .success(let message):
            precondition(validated == nil, "\(kind): validateBody rejects what init accepts: \(validated!)")
            let bytes = serialize(message)
            let again = bytes.withUnsafeBytes { b in Result { () throws(ProtoError) -> M in try decode(b) } }
            guard case .success(let second) = again else { preconditionFailure("\(kind): serialized form does not decode: \(again)") }
            precondition(second == message, "\(kind): round trip changed the message")
            precondition(serialize(second) == bytes, "\(kind): serialization is not stable")
            precondition(bytes.withUnsafeBytes { validation(kind, $0) } == nil, "\(kind): validateBody rejects a serialized message")
        }
    }
    check(.userInfo, { (b) throws(ProtoError) in try UserInfo(protobuf: b) }, { $0.serialized() })
    check(.chatMessage, { (b) throws(ProtoError) in try ChatMessage(protobuf: b) }, { $0.serialized() })
    check(.giftMessage, { (b) throws(ProtoError) in try GiftMessage(protobuf: b) }, { $0.serialized() })
    return 0
}
