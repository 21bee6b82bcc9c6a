// runProcess, the harness's way to run a tool: it must not hang a test on a
// tool's pipes (a full stderr while stdout is read) nor wait past its
// timeout (a tool that never ends).
import Foundation
import Testing

@Suite("runProcess: a tool's pipes never hang a test")
struct ToolsTests {
    @Test("200 KB on stderr before anything on stdout: both read, no deadlock")
    func bothPipesAtOnce() throws {
        let r = try runProcess("/bin/sh", ["-c", "head -c 200000 /dev/zero | tr '\\\\0' e >&2; echo out"], timeout: .seconds(30))
        #expect(r.status == 0)
        #expect(r.err.utf8.count == 200_000)
        #expect(r.out == "out\n")
    }

    @Test("past its timeout the tool is killed and the test told")
    func timeoutKills() {
        #expect(throws: HarnessError.self) { try runProcess("/bin/sleep", ["30"], timeout: .milliseconds(300)) }
    }
}
