#!/usr/bin/env python3
"""Reference oracle for roomcast's proto2 codec: Google's protobuf (Python).

Builds the docs/protocol/ltb.md §3 messages at run time from a FileDescriptorProto (no
protoc), then answers one JSON request per stdin line with one JSON response
per stdout line. Strings and bodies travel as hex (strings as their UTF-8).

  {"op": "version"}
    -> {"protobuf": "7.36.2", "implementation": "upb"}
  {"op": "encode", "type": "ChatMessage", "msg": {"user": {"level": -1,
   "name": "<hex>", "iconURL": "<hex>", "room": "<hex>"}, "text": "<hex>"}}
    -> {"hex": "<SerializeToString()>"}
  {"op": "decode", "type": "UserInfo", "hex": "<body>"}
    -> {"ok": false, "error": "..."}                     ParseFromString raised
    -> {"ok": true, "initialized": bool,                 IsInitialized()
        "msg": {...},            fields present after parsing (last wins, `user` merged)
        "utf8": bool,            every string in "msg" is valid UTF-8
        "utf8_all": bool|null,   every string occurrence on the wire is valid UTF-8
                                 (null: could not tell)
        "known_unknown": bool}   a known field number sat in the unknown fields,
                                 i.e. it arrived with the wrong wire type

Exit status 2 with a message on stderr if the protobuf module is missing.
"""
import json
import sys

try:
    import google.protobuf
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
    from google.protobuf.internal import api_implementation
except ImportError as error:
    sys.stderr.write(f"proto_ref.py: Google protobuf is missing ({error}); run: pip install protobuf\n")
    sys.exit(2)

F = descriptor_pb2.FieldDescriptorProto
INT32, INT64, BOOL, STRING, BYTES, MESSAGE = F.TYPE_INT32, F.TYPE_INT64, F.TYPE_BOOL, F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE
REQUIRED, OPTIONAL, REPEATED = F.LABEL_REQUIRED, F.LABEL_OPTIONAL, F.LABEL_REPEATED

# (field name, number, type, label); MESSAGE fields are always UserInfo.
SCHEMA = {
    "UserInfo": [("level", 1, INT32, REQUIRED), ("name", 2, STRING, REQUIRED),
                 ("iconURL", 3, STRING, REQUIRED), ("room", 4, STRING, OPTIONAL),
                 ("token", 5, STRING, OPTIONAL), ("positions", 6, BOOL, OPTIONAL),
                 ("since_epoch", 7, STRING, OPTIONAL), ("since_seq", 8, INT64, OPTIONAL)],
    "ChatMessage": [("user", 1, MESSAGE, REQUIRED), ("text", 2, STRING, REQUIRED)],
    "GiftMessage": [("user", 1, MESSAGE, REQUIRED), ("giftname", 2, STRING, REQUIRED),
                    ("giftURL", 3, STRING, REQUIRED), ("giftcount", 4, INT32, REQUIRED)],
}


def build_classes(package, string_type, all_repeated):
    """The three classes in `package`, with strings as `string_type`; with
    `all_repeated`, every field is repeated so each occurrence is kept."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto2")
    for message_name, fields in SCHEMA.items():
        message = file.message_type.add(name=message_name)
        for name, number, kind, label in fields:
            field = message.field.add(name=name, number=number, label=REPEATED if all_repeated else label,
                                      type=string_type if kind == STRING else kind)
            if kind == MESSAGE:
                field.type_name = f".{package}.UserInfo"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in SCHEMA}


REAL = build_classes("roomcast", STRING, False)         # the schema of docs/protocol/ltb.md §3
RAW = build_classes("roomcast_raw", BYTES, False)       # same wire format, strings as bytes
ALL = build_classes("roomcast_all", BYTES, True)        # every occurrence kept


def valid_utf8(data):
    try:
        data.decode("utf-8")  # Python's codec is strict: no overlongs, surrogates, > U+10FFFF
        return True
    except UnicodeDecodeError:
        return False


def fill(message, type_name, values):
    for name, _, kind, _ in SCHEMA[type_name]:
        if name not in values:
            continue
        if kind == MESSAGE:
            fill(getattr(message, name), "UserInfo", values[name])
        elif kind == STRING:
            setattr(message, name, bytes.fromhex(values[name]).decode("utf-8"))
        else:
            setattr(message, name, values[name])


def dump(raw, type_name, strings):
    """Fields present in a RAW message as JSON values; appends each string to `strings`."""
    out = {}
    for name, _, kind, _ in SCHEMA[type_name]:
        if not raw.HasField(name):
            continue
        value = getattr(raw, name)
        if kind == MESSAGE:
            out[name] = dump(value, "UserInfo", strings)
        elif kind == STRING:
            strings.append(value)
            out[name] = value.hex()
        else:
            out[name] = value
    return out


def all_strings(message, type_name):
    """Every string occurrence in an ALL message."""
    for name, _, kind, _ in SCHEMA[type_name]:
        for value in getattr(message, name):
            if kind == MESSAGE:
                yield from all_strings(value, "UserInfo")
            elif kind == STRING:
                yield value


def known_unknown(message, type_name):
    numbers = {number for _, number, _, _ in SCHEMA[type_name]}
    if any(field.field_number in numbers for field in unknown_fields.UnknownFieldSet(message)):
        return True
    return any(kind == MESSAGE and message.HasField(name) and known_unknown(getattr(message, name), "UserInfo")
               for name, _, kind, _ in SCHEMA[type_name])


def decode(type_name, body):
    real = REAL[type_name]()
    try:
        real.ParseFromString(body)
    except Exception as error:  # DecodeError, or anything else the parser raises
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    raw = RAW[type_name]()
    raw.ParseFromString(body)  # same wire format as REAL, so it parses too
    strings = []
    response = {"ok": True, "initialized": real.IsInitialized(), "msg": dump(raw, type_name, strings),
                "utf8": all(valid_utf8(s) for s in strings), "known_unknown": known_unknown(raw, type_name)}
    every = ALL[type_name]()
    try:
        every.ParseFromString(body)
        response["utf8_all"] = all(valid_utf8(s) for s in all_strings(every, type_name))
    except Exception:
        response["utf8_all"] = None  # e.g. a wrong-wire-type field parsed as packed by ALL
    return response


def handle(request):
    op = request["op"]
    if op == "version":
        return {"protobuf": google.protobuf.__version__, "implementation": api_implementation.Type()}
    if op == "encode":
        message = REAL[request["type"]]()
        fill(message, request["type"], request["msg"])
        return {"hex": message.SerializeToString().hex()}
    if op == "decode":
        return decode(request["type"], bytes.fromhex(request["hex"]))
    raise ValueError(f"unknown op {op!r}")


def main():
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(handle(json.loads(line))) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
