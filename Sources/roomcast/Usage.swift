// Usage.swift holds the help texts of `roomcast` and its subcommands
// (`--help`, and what a usage error prints after its message);
// Options.swift parses the command line they describe.

let mainUsage = """
    Usage: roomcast chat   --name NAME [--room R] [--level N] [--icon URL] [OPTIONS]
           roomcast send   --name NAME [--room R] [OPTIONS] text MESSAGE
           roomcast send   --name NAME [--room R] [OPTIONS] gift NAME URL COUNT
           roomcast listen [--room R] [--json] [--count N] [OPTIONS]
           roomcast token  --key-file F --kid K --sub S [--room R] [--ttl 1h]
           roomcast admin  VERB [--api URL] [--key-file F] ...  (roomcast admin --help)

    The command-line client of roomcastd, the chat-room relay.
      chat     interactive: each line typed is sent as text
      send     join, send one message, wait for the daemon's echo, leave
      listen   print every event of a room, as text or as JSON lines
      token    mint a signed-join token for development (HS256)
      admin    the backend API: publish, kick, ban, unban, mute, rooms, room, slow

    Run 'roomcast SUBCOMMAND --help' for the options of each.
    Exit status: 0 ok, 1 failure (refused, timeout, rejected), 64 bad usage,
    130/143 send interrupted by SIGINT/SIGTERM.
    """

private let commonHelp = """
      -s, --server HOST:PORT   the daemon (default 127.0.0.1:9898; IPv6: [::1]:9898)
          --byte-order ORDER   frame header byte order, little (default) or big
          --heartbeat DURATION heartbeat interval (default 10s; 0: none)
          --max-frame-bytes SIZE
                               largest frame body sent or accepted, as the daemon's
                               max_frame_bytes: 512, 64K, 4M, ... up to 1G (default 64K)
          --tls                TLS to a listen_tls listener, the certificate checked
                               against the system's CAs and the server's host name
          --ca-file FILE       the CAs (PEM) that sign the daemon's certificate (implies --tls)
          --insecure           TLS without checking the certificate: for tests only (implies --tls)
      -h, --help               print this help and exit
      -V, --version            print the version and exit
    """

private let identityHelp = """
      -n, --name NAME          your name in the room
      -r, --room ROOM          room to join (default: the daemon's default room)
      -l, --level N            your level (default 0)
      -i, --icon URL           your icon URL (default empty)
          --token TOKEN        signed-join token sent in every join (default:
                               $ROOMCAST_TOKEN; docs/protocol/tokens.md §13)
    """

func usage(_ command: Subcommand?) -> String {
    switch command {
    case nil:
        return mainUsage
    case .chat?:
        return """
            Usage: roomcast chat --name NAME [--room R] [--level N] [--icon URL] [OPTIONS]

            Interactive chat. Each line typed is sent as text. Commands:
              /gift NAME URL COUNT   send a gift
              /join ROOM             move to ROOM
              /leave                 leave the room (stay connected)
              /quit                  leave and exit (also Ctrl-D, Ctrl-C)
              /help                  list these commands
              //TEXT                 send TEXT starting with '/'
            Events print as '12:03:04 alice: hi' on stdout; status goes to stderr.
            After a drop it reconnects with backoff and rejoins the room.

            Options:
            \(identityHelp)
            \(commonHelp)
            """
    case .send?:
        return """
            Usage: roomcast send --name NAME [--room R] [OPTIONS] text MESSAGE
                   roomcast send --name NAME [--room R] [OPTIONS] gift NAME URL COUNT

            Joins, sends one message, waits until the daemon relays it back (proof it
            was relayed; needs the daemon's default 'echo = yes'), leaves, exits 0.
            On failure prints one line and exits 1 (refused, timeout, rejected).

            Options:
            \(identityHelp)
              -t, --timeout DURATION   give up after this long (default 5s)
            \(commonHelp)
            """
    case .token?:
        return """
            Usage: roomcast token --key-file F --kid K --sub S [--room R] [--name N] [--ttl 1h]

            Mints a signed-join token for development and prints it: a JWT (RFC 7519)
            signed with HS256 by the secret on the line of key file F whose kid is K
            (the format of roomcastd's [auth] key_file). Claims: sub S, exp now + TTL,
            rooms [R] (default ["*"]), name N if given. EdDSA lines hold only the public
            key and cannot sign: mint EdDSA tokens in the app's backend.

              --key-file F   the key file
              --kid K        the key to sign with (an HS256 line)
              --sub S        the account id
              -r, --room R   the room the token allows (default: any)
              -n, --name N   the name UserInfo must carry (default: S)
              --ttl DURATION lifetime (default 1h)
            """
    case .listen?:
        return """
            Usage: roomcast listen [--room R] [--json] [--count N] [OPTIONS]

            Joins as an observer (name 'listener' unless --name) and prints every event
            of the room until interrupted or N events: readable lines, or one JSON object
            per line with --json (type, room, user, text/gift fields, opaque bodies as
            base64). Reconnects after a drop.

            Options:
            \(identityHelp)
              -j, --json               one JSON object per line
              -c, --count N            exit 0 after N events
            \(commonHelp)
            """
    }
}
