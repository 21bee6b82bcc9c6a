// TEMPORARY stubs matching the agreed APIs; replaced by helper branches.
public struct UserInfo: Equatable, Sendable {
    public var level: Int32; public var name: String; public var iconURL: String; public var room: String?
    public init(level: Int32, name: String, iconURL: String, room: String? = nil) { self.level = level; self.name = name; self.iconURL = iconURL; self.room = room }
    public init(protobuf body: UnsafeRawBufferPointer) throws(ProtoError) { self.init(level: 0, name: "x", iconURL: "") }
    public func serialized() -> [UInt8] { [] }
}
public enum ProtoError: Error, Equatable, Sendable, CustomStringConvertible { case bad; public var description: String { "bad" } }
public enum BodyKind: Sendable { case userInfo, chatMessage, giftMessage }
public func validateBody(_ kind: BodyKind, _ body: UnsafeRawBufferPointer) throws(ProtoError) {}
