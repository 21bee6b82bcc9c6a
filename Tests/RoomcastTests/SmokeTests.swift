import Testing
@testable import RoomcastCore

@Test func byteOrderNames() {
    #expect(ByteOrder(rawValue: "little") == .little)
}
