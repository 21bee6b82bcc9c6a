import COpenSSL

/// Everything in OpenSSL's error queue of this thread, oldest first, joined
/// by `; ` (each entry as ERR_error_string_n(3) prints it), and the queue
/// emptied (ERR_get_error(3)); "unknown OpenSSL error" when it was empty.
/// The entries name the library, function and reason, never key material.
public func openSSLErrorReason() -> String {
    var parts: [String] = []
    var buffer = [CChar](repeating: 0, count: 256)
    while case let e = ERR_get_error(), e != 0 {
        ERR_error_string_n(e, &buffer, buffer.count)
        parts.append(buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) })
    }
    return parts.isEmpty ? "unknown OpenSSL error" : parts.joined(separator: "; ")
}
