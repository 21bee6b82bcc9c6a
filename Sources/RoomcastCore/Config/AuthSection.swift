// `[auth]`: signed joins and roles (docs/protocol/tokens.md §13).

extension Config {
    /// What a tokenless client may do when `required = yes` (docs/protocol/tokens.md §13).
    public enum Anonymous: String, Equatable, Sendable, CaseIterable {
        /// It may not join, and is in no room: it hears nothing.
        case none
        /// It may join a room to read it; anything it sends is refused.
        case read
    }

    /// `[auth]` (docs/protocol/tokens.md §13, roomcastd.conf(5)).
    public struct Auth: Equatable, Sendable {
        /// `key_file`: the keys that verify tokens, one `KID ALG KEY` a line
        /// (TokenKeySet.parse); re-read on SIGHUP. Empty (default): tokens
        /// are not checked and field 5 is only removed.
        public var keyFile: String
        /// `required`: a client must join with a valid token. Default no
        /// (clients without one keep working; a token given is still checked).
        public var required: Bool
        /// `anonymous`: with `required = yes`, what a tokenless client may do.
        /// Default none.
        public var anonymous: Anonymous
        /// `viewer_may`: the frame types a viewer's token allows when it has
        /// no `may` claim: `text`, `gift`, numbers (opaque types), comma-
        /// separated. Default `text`. Moderators and owners may send every type.
        public var viewerMay: [UInt16]
    }
}

extension SectionSpec {
    /// `[auth]`: its keys, in the order of config/roomcastd.conf.
    static let auth = SectionSpec(section: "auth", keys: [
        KeySpec(name: "key_file") { c, v throws(ValueError) in
            guard v.isEmpty || v.hasPrefix("/") else {
                throw ValueError(reason: "\(quote(v)) is not an absolute path")
            }
            c.auth.keyFile = v
        },
        KeySpec(name: "required") { c, v throws(ValueError) in c.auth.required = try boolean(v) },
        KeySpec(name: "anonymous") { c, v throws(ValueError) in c.auth.anonymous = try choice(v) },
        KeySpec(name: "viewer_may") { c, v throws(ValueError) in
            var types: [UInt16] = []
            for item in v.split(separator: ",") {
                let name = String(item.drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
                guard let t = frameTypeName(name) else {
                    throw ValueError(reason: "\(quote(name)) is not text, gift or a frame type number 0..65535")
                }
                if !types.contains(t) { types.append(t) }
            }
            c.auth.viewerMay = types
        },
    ])
}

extension Config {
    /// `[auth]`'s rules: `required` and `anonymous = read` need a key file;
    /// `protocol.notice_type` is checked with the other control codes.
    func checkAuthRules(_ rule: RuleContext) throws(ConfigError) {
        if auth.required && auth.keyFile.isEmpty {
            throw rule.fail(["auth.required", "auth.key_file"], "auth.required = yes needs auth.key_file (the keys that verify tokens)")
        }
        if auth.anonymous == .read && !auth.required {
            throw rule.fail(["auth.anonymous", "auth.required"],
                            "auth.anonymous = read only applies with auth.required = yes (without it every tokenless client may send)")
        }
    }
}
