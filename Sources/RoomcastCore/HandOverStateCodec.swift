// The one codec of the hand-over state (the format: HandOverState.swift):
// a record kind is a table of fields (HandOverStateTables.swift), and one
// walk writes and one walk reads every kind. Standard library only.
extension HandOverState {
    /// How one value is written as the bytes of a record and read back:
    /// an integer, a text, a byte string, or a nested record.
    struct Coder<Value>: Sendable {
        /// Appends the value's bytes (the record's header is the writer's).
        let write: @Sendable (Value, inout Writer) -> Void
        /// The value from exactly the bytes of one record.
        /// - Throws: `DecodeError.damaged`, naming the field.
        let read: @Sendable (UnsafeRawBufferPointer) throws(DecodeError) -> Value
    }

    /// One field of a record kind: its tag and how it is written from and
    /// read into a `Record`. Built with `field`, `optional`, `repeated` or
    /// `group`; a field may write no record (a default left out), one, or
    /// one per element. Where the field lives is a `get` and a `set`
    /// closure, not a key path: applying a key path costs a runtime lookup
    /// (20,000 connections encode in 37 ms through key paths, 17.5 through
    /// closures, 9.5 with every field written by hand).
    struct Field<Record>: Sendable {
        let tag: UInt16
        let write: @Sendable (Record, inout Writer) -> Void
        /// Reads one record of `tag` into the record being read.
        let read: @Sendable (inout Record, UnsafeRawBufferPointer) throws(DecodeError) -> Void

        /// A field written always, or unless it equals `omit` (its default,
        /// which a reader gives it when absent), or only `if` a condition on
        /// the record holds. `get` and `set` may differ from a stored
        /// property (a count computed on writing, noted on reading).
        static func field<V: Equatable & Sendable>(_ tag: UInt16, _ coder: Coder<V>, _ get: @escaping @Sendable (Record) -> V,
                                                   _ set: @escaping @Sendable (inout Record, V) -> Void,
                                                   omit: V? = nil, if condition: (@Sendable (Record) -> Bool)? = nil) -> Field {
            Field(tag: tag,
                  write: { r, w in
                      let value = get(r)
                      if value != omit, condition?(r) != false { w.record(tag) { w in coder.write(value, &w) } }
                  },
                  read: { r, v throws(DecodeError) in set(&r, try coder.read(v)) })
        }

        /// A field written when it is not nil; absent: nil.
        static func optional<V>(_ tag: UInt16, _ coder: Coder<V>, _ get: @escaping @Sendable (Record) -> V?,
                                _ set: @escaping @Sendable (inout Record, V) -> Void) -> Field {
            Field(tag: tag,
                  write: { r, w in if let value = get(r) { w.record(tag) { w in coder.write(value, &w) } } },
                  read: { r, v throws(DecodeError) in set(&r, try coder.read(v)) })
        }

        /// A list: one record per element, in order; `add` takes each
        /// record read (appends it, or drops one outside today's bounds).
        static func repeated<V>(_ tag: UInt16, _ coder: Coder<V>, _ get: @escaping @Sendable (Record) -> [V],
                                _ add: @escaping @Sendable (inout Record, V) -> Void) -> Field {
            Field(tag: tag,
                  write: { r, w in for value in get(r) { w.record(tag) { w in coder.write(value, &w) } } },
                  read: { r, v throws(DecodeError) in add(&r, try coder.read(v)) })
        }

        /// The fields of `kind`, fields of this same record, written as one
        /// nested record and read into this record (a repeated group adds
        /// to what an earlier one set).
        static func group(_ tag: UInt16, _ kind: RecordKind<Record>) -> Field where Record: Sendable {
            Field(tag: tag,
                  write: { r, w in w.record(tag) { w in kind.writeFields(r, &w) } },
                  read: { r, v throws(DecodeError) in try kind.readFields(into: &r, v) })
        }
    }

    /// A kind of record: a table of fields, with what a record starts from
    /// and what a whole one must satisfy. Writing walks the table in order
    /// (the order of the bytes); reading walks the records and gives each
    /// to the field of its tag, skipping tags the table does not have: a
    /// field a newer writer added is ignored, one an older writer left out
    /// keeps its value in `blank`.
    struct RecordKind<Record>: Sendable where Record: Sendable {
        /// The value a record is read into, every field at its default.
        let blank: Record
        let fields: [Field<Record>]
        /// Tags that must be present, and the error's text when one is not.
        let required: [UInt16]
        let missing: String
        /// Checks a record once all its fields are read.
        let check: @Sendable (Record) throws(DecodeError) -> Void
        private let index: [UInt16: Int]

        /// - Precondition: no two fields share a tag.
        init(blank: Record, required: [UInt16] = [], missing: String = "", fields: [Field<Record>],
             check: @escaping @Sendable (Record) throws(DecodeError) -> Void = { _ in }) {
            (self.blank, self.fields, self.required, self.missing, self.check) = (blank, fields, required, missing, check)
            var index: [UInt16: Int] = [:]
            for (i, f) in fields.enumerated() { precondition(index.updateValue(i, forKey: f.tag) == nil, "tag \(f.tag) twice") }
            self.index = index
        }

        func writeFields(_ record: Record, _ w: inout Writer) {
            for i in fields.indices { fields[i].write(record, &w) }  // not `for f in`: a copy of each field retains its closures
        }

        /// Reads the records of `bytes` into `record`; the last of a
        /// repeated tag wins (a list appends). Unknown tags are skipped.
        /// - Throws: `DecodeError.damaged`: a record cut off, a field's
        ///   bytes that do not read, a required tag missing.
        func readFields(into record: inout Record, _ bytes: UnsafeRawBufferPointer) throws(DecodeError) {
            var reader = Reader(bytes)
            var seen = 0
            while let (tag, value) = try reader.next() {
                guard let i = index[tag] else { continue }
                try fields[i].read(&record, value)
                if let r = required.firstIndex(of: tag) { seen |= 1 << r }
            }
            guard seen == (1 << required.count) - 1 else { throw .damaged(missing) }
        }

        /// A record of this kind read from `bytes`, from `blank`, checked.
        func read(_ bytes: UnsafeRawBufferPointer) throws(DecodeError) -> Record {
            var record = blank
            try readFields(into: &record, bytes)
            try check(record)
            return record
        }

        /// This kind as the value of a record of another kind.
        var coder: Coder<Record> {
            Coder(write: { r, w in writeFields(r, &w) }, read: { v throws(DecodeError) in try read(v) })
        }
    }
}

// MARK: - Value coders

extension HandOverState.Coder {
    typealias DecodeError = HandOverState.DecodeError

    /// A fixed-width little-endian integer; `what` names it in errors.
    static func integer<T: FixedWidthInteger & SendableMetatype>(_ what: String) -> HandOverState.Coder<T> {
        .init(write: { v, w in w.append(v) }, read: { v throws(DecodeError) in
            guard v.count == MemoryLayout<T>.size else { throw .damaged("\(what): \(v.count) bytes, expected \(MemoryLayout<T>.size)") }
            return HandOverState.Reader.load(v, 0, as: T.self)
        })
    }

    static func u8(_ what: String) -> HandOverState.Coder<UInt8> { integer(what) }
    static func u32(_ what: String) -> HandOverState.Coder<UInt32> { integer(what) }
    static func u64(_ what: String) -> HandOverState.Coder<UInt64> { integer(what) }

    /// An `Int64` as the bit pattern of a u64.
    static func i64(_ what: String) -> HandOverState.Coder<Int64> { u64(what).map({ Int64(bitPattern: $0) }, { UInt64(bitPattern: $0) }) }

    /// A `Bool` as a u8: 1 written, any non-zero byte read as true.
    static func bool(_ what: String) -> HandOverState.Coder<Bool> { u8(what).map({ $0 != 0 }, { $0 ? 1 : 0 }) }

    /// An `Int` count as a u64 (clamped on reading).
    static func count(_ what: String) -> HandOverState.Coder<Int> { u64(what).map({ Int(clamping: $0) }, { UInt64($0) }) }

    /// UTF-8 text.
    static func text(_ what: String) -> HandOverState.Coder<String> {
        .init(write: { s, w in w.bytes += s.utf8 }, read: { v throws(DecodeError) in
            guard let s = String(validating: v, as: UTF8.self) else { throw .damaged("\(what) is not UTF-8") }
            return s
        })
    }

    /// Bytes as they are.
    static var bytes: HandOverState.Coder<[UInt8]> { .init(write: { b, w in w.bytes += b }, read: { Array($0) }) }

    /// A room name: a byte string, not necessarily UTF-8.
    static var room: HandOverState.Coder<RoomName> { bytes.map({ RoomName(bytes: $0) }, { $0.bytes }) }

    /// This coder's value seen as another type: `to` after reading, `from` before writing.
    func map<T>(_ to: @escaping @Sendable (Value) -> T, _ from: @escaping @Sendable (T) -> Value) -> HandOverState.Coder<T> {
        .init(write: { t, w in write(from(t), &w) }, read: { v throws(DecodeError) in to(try read(v)) })
    }

    /// As `map`, with a `to` that refuses some values.
    func validated<T>(_ to: @escaping @Sendable (Value) throws(DecodeError) -> T, _ from: @escaping @Sendable (T) -> Value) -> HandOverState.Coder<T> {
        .init(write: { t, w in write(from(t), &w) }, read: { v throws(DecodeError) in try to(try read(v)) })
    }
}

// MARK: - Bytes

extension HandOverState {
    /// Appends tag-length-value records to one buffer.
    struct Writer {
        var bytes: [UInt8] = []

        mutating func append<T: FixedWidthInteger>(_ value: T) {
            withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
        }

        /// A record whose value is what `body` writes, in place: its
        /// length is patched once it is written.
        mutating func record(_ tag: UInt16, _ body: (inout Writer) -> Void) {
            append(tag)
            let lengthAt = bytes.count
            append(UInt32(0))
            body(&self)
            patch(at: lengthAt, UInt32(bytes.count - lengthAt - 4))
        }

        mutating func patch<T: FixedWidthInteger>(at offset: Int, _ value: T) {
            withUnsafeBytes(of: value.littleEndian) { v in
                for i in 0..<v.count { bytes[offset + i] = v[i] }
            }
        }
    }

    /// Walks tag-length-value records; every length is checked against what is left.
    struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset = 0

        init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        /// The next record; nil at the end.
        /// - Throws: `DecodeError.damaged`: a header cut off, a length past the end.
        mutating func next() throws(DecodeError) -> (UInt16, UnsafeRawBufferPointer)? {
            guard offset < bytes.count else { return nil }
            guard bytes.count - offset >= 6 else { throw .damaged("a record header cut off at byte \(offset)") }
            let tag = Self.load(bytes, offset, as: UInt16.self)
            let length = Int(Self.load(bytes, offset + 2, as: UInt32.self))
            offset += 6
            guard length <= bytes.count - offset else {
                throw .damaged("record \(tag) claims \(length) bytes, \(bytes.count - offset) are left")
            }
            defer { offset += length }
            return (tag, UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + length)]))
        }

        /// The little-endian integer at `offset` (the caller checked the bounds).
        static func load<T: FixedWidthInteger>(_ bytes: UnsafeRawBufferPointer, _ offset: Int, as: T.Type) -> T {
            T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
        }
    }
}
