/// The version of roomcastd and roomcast (`--version`), semantic versioning.
public let roomcastVersion = "0.1.0"
