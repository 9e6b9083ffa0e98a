"""Compares raftmq's apache.rocketmq.v2 protos with the descriptors shipped in the official Python
client, so a wrong field number, type, name, enum value or streaming flag shows up before a client
does. Ours may add what is newer than that client (e.g. Settings.client_properties).

Run in a virtual environment holding `rocketmq-python-client==5.1.2` and `grpcio-tools`:
    python proto/apache/rocketmq/v2/check_wire.py
Prints one line per difference and exits 1 if there is any.
"""

import os
import sys
import tempfile

from google.protobuf import descriptor_pb2
from grpc_tools import protoc
import grpc_tools
from rocketmq.grpc_protocol import definition_pb2, service_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
FILES = ["apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto"]


def ours():
    """Our files compiled to a FileDescriptorSet, by file name."""
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--descriptor_set_out={out}"]
        if protoc.main(args + FILES) != 0:
            sys.exit("protoc could not compile our files")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    return {f.name: f for f in fds.file}


def theirs(module):
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def field_key(m, f):
    oneof = ""
    if f.HasField("oneof_index"):
        oneof = m.oneof_decl[f.oneof_index].name
        if f.proto3_optional:
            oneof = "optional"
    return (f.name, f.type, f.label, f.type_name, oneof)


def compare_enum(path, want, have, out):
    have_values = {v.name: v.number for v in have.value}
    for v in want.value:
        if have_values.get(v.name) != v.number:
            out.append(f"{path}.{v.name}: want {v.number}, have {have_values.get(v.name)}")


def compare_message(path, want, have, out):
    have_fields = {f.number: f for f in have.field}
    for f in want.field:
        h = have_fields.get(f.number)
        if h is None:
            out.append(f"{path}: field {f.number} ({f.name}) missing")
        elif field_key(want, f) != field_key(have, h):
            out.append(f"{path}: field {f.number}: want {field_key(want, f)}, have {field_key(have, h)}")
    compare_types(f"{path}.", want.nested_type, have.nested_type, want.enum_type, have.enum_type, out)


def compare_types(prefix, want_msgs, have_msgs, want_enums, have_enums, out):
    """Messages and enums declared in one scope (a file, or a message's nested types)."""
    msgs = {m.name: m for m in have_msgs}
    for m in want_msgs:
        if m.name not in msgs:
            out.append(f"{prefix}{m.name}: missing")
        else:
            compare_message(prefix + m.name, m, msgs[m.name], out)
    enums = {e.name: e for e in have_enums}
    for e in want_enums:
        if e.name not in enums:
            out.append(f"enum {prefix}{e.name}: missing")
        else:
            compare_enum(prefix + e.name, e, enums[e.name], out)


def compare_file(want, have, out):
    if want.package != have.package:
        out.append(f"{have.name}: package {have.package}, want {want.package}")
    compare_types("", want.message_type, have.message_type, want.enum_type, have.enum_type, out)
    services = {s.name: s for s in have.service}
    key = lambda m: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
    for s in want.service:
        methods = {x.name: x for x in services[s.name].method} if s.name in services else {}
        for x in s.method:
            if x.name not in methods:
                out.append(f"rpc {s.name}.{x.name}: missing")
            elif key(x) != key(methods[x.name]):
                out.append(f"rpc {s.name}.{x.name}: want {key(x)}, have {key(methods[x.name])}")


def main():
    have = ours()
    out = []
    checked = 0
    for module, name in [(definition_pb2, FILES[0]), (service_pb2, FILES[1])]:
        want = theirs(module)
        compare_file(want, have[name], out)
        checked += len(want.message_type) + len(want.enum_type)
    for line in out:
        print(line)
    print(f"{checked} top-level messages and enums compared, {len(out)} differences")
    sys.exit(1 if out else 0)


if __name__ == "__main__":
    main()
