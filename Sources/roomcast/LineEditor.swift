@preconcurrency import Glibc

/// The terminal state to put back at exit (set once, read by the atexit hook).
nonisolated(unsafe) private var savedTerminal: termios?

/// A minimal line editor for `roomcast chat`, so incoming lines never garble
/// what the user is typing: the terminal is put in non-canonical, no-echo
/// mode, the editor keeps the line being typed and echoes it itself, and
/// every incoming line is printed *above* it (clear the line, print, redraw
/// prompt and input).
///
/// Keys: Enter submits, Backspace deletes a character (UTF-8 aware), Ctrl-U
/// clears, Ctrl-W deletes a word, Ctrl-L redraws, Ctrl-D on an empty line is
/// end of input; cursor keys and other escape sequences are ignored. Ctrl-C
/// stays a signal (ISIG is kept). A line longer than the terminal is redrawn
/// from its wrapped start only approximately.
///
/// When stdin or stdout is not a terminal the editor only splits lines:
/// no prompt, no echo, output written as is.
final class LineEditor {
    let isInteractive: Bool
    var prompt: String {
        didSet { if isInteractive { redraw() } }
    }
    private var line: [UInt8] = []
    private var pendingInput: [UInt8] = []
    private var escape = 0  // 0: none, 1: after ESC, 2: inside CSI/SS3

    init(prompt: String) {
        self.prompt = prompt
        isInteractive = isatty(0) == 1 && isatty(1) == 1
    }

    /// Non-canonical, no-echo mode; restored by `restore()` and at exit.
    func start() {
        guard isInteractive else { return }
        var mode = termios()
        guard tcgetattr(0, &mode) == 0 else { return }
        savedTerminal = mode
        atexit { if var mode = savedTerminal { tcsetattr(0, TCSANOW, &mode) } }
        mode.c_lflag &= ~tcflag_t(ICANON | ECHO)
        withUnsafeMutableBytes(of: &mode.c_cc) { cc in
            cc[Int(VMIN)] = 1
            cc[Int(VTIME)] = 0
        }
        tcsetattr(0, TCSANOW, &mode)
        redraw()
    }

    /// Puts the terminal back and moves below the prompt.
    func restore() {
        guard isInteractive, var mode = savedTerminal else { return }
        writeAll(1, "\r\u{1B}[K")
        tcsetattr(0, TCSANOW, &mode)
        savedTerminal = nil
    }

    /// Prints `text` (one line, no newline) on `fd` above the input line.
    func printAbove(_ text: String, fd: Int32) {
        guard isInteractive else {
            writeAll(fd, text + "\n")
            return
        }
        writeAll(1, "\r\u{1B}[K")
        writeAll(fd, text + "\n")
        redraw()
    }

    func redraw() {
        writeAll(1, "\r\u{1B}[K" + prompt + String(decoding: line, as: UTF8.self))
    }

    /// Consumes typed bytes. Returns the completed lines, and true at end of
    /// input (Ctrl-D on an empty line in a terminal).
    func feed(_ bytes: some Sequence<UInt8>) -> (lines: [String], endOfInput: Bool) {
        guard isInteractive else {
            pendingInput.append(contentsOf: bytes)
            var lines: [String] = []
            while let newline = pendingInput.firstIndex(of: UInt8(ascii: "\n")) {
                var raw = pendingInput[..<newline]
                if raw.last == UInt8(ascii: "\r") { raw = raw.dropLast() }
                lines.append(String(decoding: raw, as: UTF8.self))
                pendingInput.removeSubrange(...newline)
            }
            return (lines, false)
        }
        var lines: [String] = []
        for byte in bytes {
            if escape == 1 { escape = byte == UInt8(ascii: "[") || byte == UInt8(ascii: "O") ? 2 : 0; continue }
            if escape == 2 { if (0x40...0x7E).contains(byte) { escape = 0 }; continue }
            switch byte {
            case 0x1B:
                escape = 1
            case 0x0D, 0x0A:
                lines.append(String(decoding: line, as: UTF8.self))
                line.removeAll()
                redraw()
            case 0x7F, 0x08:
                while let last = line.last, last & 0xC0 == 0x80 { line.removeLast() }
                if !line.isEmpty { line.removeLast() }
                redraw()
            case 0x15:
                line.removeAll()
                redraw()
            case 0x17:
                while line.last == UInt8(ascii: " ") { line.removeLast() }
                while let last = line.last, last != UInt8(ascii: " ") { line.removeLast() }
                redraw()
            case 0x0C:
                redraw()
            case 0x04:
                if line.isEmpty { return (lines, true) }
            case 0x00...0x1F:
                break
            default:
                line.append(byte)
                if byte < 0x80 {
                    writeAll(1, String(Character(Unicode.Scalar(byte))))
                } else if String(validating: line, as: UTF8.self) != nil {
                    redraw()  // a multi-byte character is complete
                }
            }
        }
        return (lines, false)
    }

    /// The unterminated last line of piped input, at end of input.
    func flushPending() -> String? {
        guard !pendingInput.isEmpty else { return nil }
        defer { pendingInput.removeAll() }
        return String(decoding: pendingInput, as: UTF8.self)
    }
}
