@preconcurrency import Glibc
@preconcurrency import COpenSSL
import RoomcastCore
import RoomcastCrypto
import RoomcastServer

// `roomcast-bench verify-tokens [N]`: what one signed join costs the daemon
// (docs/protocol/tokens.md §13), HS256 and EdDSA: the whole `VerifyingKeys.verify`
// (split, base64url, header, signature with OpenSSL, claims' JSON, clock)
// on a token of the size an app backend issues, N times each (default
// 20,000). Prints µs per verification, median of 5 rounds.

private func signEd25519(seed: [UInt8], _ data: [UInt8]) -> [UInt8] {
    let key = seed.withUnsafeBufferPointer { EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nil, $0.baseAddress, $0.count) }!
    defer { EVP_PKEY_free(key) }
    let ctx = EVP_MD_CTX_new()!
    defer { EVP_MD_CTX_free(ctx) }
    precondition(EVP_DigestSignInit(ctx, nil, nil, nil, key) == 1)
    var signature = [UInt8](repeating: 0, count: 64)
    var length = 64
    precondition(data.withUnsafeBufferPointer { EVP_DigestSign(ctx, &signature, &length, $0.baseAddress, $0.count) } == 1)
    return signature
}

private func publicKey(seed: [UInt8]) -> [UInt8] {
    let key = seed.withUnsafeBufferPointer { EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nil, $0.baseAddress, $0.count) }!
    defer { EVP_PKEY_free(key) }
    var out = [UInt8](repeating: 0, count: 32)
    var length = 32
    precondition(EVP_PKEY_get_raw_public_key(key, &out, &length) == 1)
    return out
}

func runVerifyBench(_ arguments: [String]) -> Int32 {
    let n = arguments.first.flatMap { Int($0) } ?? 20_000
    let secret = (0..<32).map { UInt8($0) &* 13 }
    let seed = (0..<32).map { UInt8($0) &* 7 }
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    let now = Int64(ts.tv_sec)
    let claims = TokenClaims(sub: "acct-4711029", exp: now + 3600, name: "streamer_fan_42", level: 12,
                             icon: "https://cdn.example/avatars/4711029.png", rooms: ["live-8812"], may: [2, 3])
    func token(_ alg: String, kid: String, sign: ([UInt8]) -> [UInt8]) -> [UInt8] {
        let input = Base64URL.encode(Array(#"{"alg":"\#(alg)","kid":"\#(kid)","typ":"JWT"}"#.utf8)) + "." + Base64URL.encode(claims.json)
        return Array((input + "." + Base64URL.encode(sign(Array(input.utf8)))).utf8)
    }
    let tokens = [("HS256", token("HS256", kid: "hs") { hmacSHA256(key: secret, data: $0)! }), ("EdDSA", token("EdDSA", kid: "ed") { signEd25519(seed: seed, $0) })]
    let keys: VerifyingKeys
    do {
        keys = try VerifyingKeys(TokenKeySet(keys: [TokenKey(id: "hs", algorithm: .hs256, key: secret),
                                                    TokenKey(id: "ed", algorithm: .edDSA, key: publicKey(seed: seed))]))
    } catch {
        fputs("verify-tokens: \(error)\n", stderr)
        return 1
    }
    print("verify-tokens: \(n) verifications per round, 5 rounds, median; token \(tokens[0].1.count) bytes (HS256), \(tokens[1].1.count) bytes (EdDSA)")
    for (name, t) in tokens {
        var rounds: [Double] = []
        for _ in 0..<5 {
            let start = monotonicNs()
            for _ in 0..<n {
                guard (try? keys.verify(t, nowSeconds: now)) != nil else {
                    fputs("verify-tokens: the \(name) token does not verify\n", stderr)
                    return 1
                }
            }
            rounds.append(Double(monotonicNs() - start) / 1000 / Double(n))
        }
        rounds.sort()
        func f(_ x: Double) -> String { String(Double(Int(x * 100 + 0.5)) / 100) }
        print("\(name): \(f(rounds[2])) µs per join (min \(f(rounds[0])), max \(f(rounds[4])))")
    }
    return 0
}
