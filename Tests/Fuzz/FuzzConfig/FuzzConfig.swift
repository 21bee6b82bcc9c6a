// libFuzzer target: the config parser never crashes on any text, and every
// error it reports with a line names a line that exists (1 ... line count).
// Build and run: `make fuzz`.
import RoomcastCore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConfig(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: data, count: data == nil ? 0 : size), as: UTF8.self)
    let lines = text.utf8.reduce(1) { $1 == 0x0A ? $0 + 1 : $0 }
    do {
        _ = try INIDocument.parse(text, file: "fuzz.conf")
    } catch {
        precondition(error.line.map { $0 >= 1 && $0 <= lines } ?? false, "INI error on line \(String(describing: error.line)) of \(lines): \(error)")
    }
    do {
        let config = try Config.parse(text, file: "fuzz.conf")
        precondition(config.limits.outputSoftBytes <= config.limits.outputHardBytes, "accepted soft > hard")
    } catch {
        if let line = error.line {
            precondition(line >= 1 && line <= lines, "error on line \(line) of \(lines): \(error)")
        }
        precondition(!error.description.isEmpty)
    }
    return 0
}
