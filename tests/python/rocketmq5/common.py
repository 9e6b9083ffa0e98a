"""Shared parts of the RocketMQ 5 scenario scripts run by tests/tests/t80_rocketmq5_python.rs.

Every script drives the official `rocketmq-python-client` (unmodified) against a raftmq broker
group and prints ONE JSON object as the last line of its standard output. Everything else the
process writes (the client's own logging, which goes to ~/logs/rocketmq_python, and whatever grpc
prints) is kept off standard output: file descriptor 1 is pointed at standard error while the
scenario runs, and only the final JSON goes to the real standard output.

Message bodies travel as hex in the JSON (`body_hex`), so the test compares them byte for byte.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

_REAL_STDOUT_FD = None


def _hide_stdout():
    """Points fd 1 (and sys.stdout) at stderr; the real stdout is kept for `emit`."""
    global _REAL_STDOUT_FD
    if _REAL_STDOUT_FD is None:
        sys.stdout.flush()
        _REAL_STDOUT_FD = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr


_hide_stdout()

# Imported after stdout is hidden: the client configures its logging at import time.
from rocketmq import (ClientConfiguration, Credentials, FilterExpression,  # noqa: E402
                      Message)
from rocketmq.grpc_protocol import FilterType  # noqa: E402


def parser(description):
    """The arguments every scenario takes; a script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--endpoints", required=True, help="host:port;host:port;...")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="G1")
    p.add_argument("--request-timeout", type=int, default=3, help="seconds")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="bound of the whole scenario's loops")
    return p


def config(args):
    return ClientConfiguration(args.endpoints, Credentials(), request_timeout=args.request_timeout)


def filter_expression(expression, kind="tag"):
    if kind.lower() in ("sql", "sql92"):
        return FilterExpression(expression, FilterType.SQL)
    return FilterExpression(expression, FilterType.TAG)


class Deadline:
    """A point in time the scenario's loops never run past."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return max(0.0, self.end - time.monotonic())

    def passed(self):
        return time.monotonic() >= self.end


def body_of(prefix, i):
    """A body that is not valid UTF-8 and differs per message: `<prefix>-<i>|` then 32 hash bytes
    (which hold bytes such as 0x00 and 0xff) then a zero byte."""
    head = f"{prefix}-{i}|".encode()
    return head + hashlib.sha256(head).digest() + b"\x00"


def build_message(topic, body, tag=None, keys=(), props=None):
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for k in keys:
        # The client's setter adds one key per assignment (it keeps a set).
        m.keys = k
    for k, v in (props or {}).items():
        m.add_property(k, v)
    return m


def sent_json(receipt, body, tag, keys, props):
    return {
        "id": receipt.message_id,
        "body_hex": body.hex(),
        "tag": tag,
        "keys": sorted(keys),
        "props": dict(props or {}),
        "offset": receipt.offset,
    }


def received_json(m, at=None):
    """What a received message carried, as the test compares it."""
    body = m.body if m.body is not None else b""
    return {
        "id": m.message_id,
        "topic": m.topic,
        "body_hex": bytes(body).hex(),
        "tag": m.tag,
        "keys": sorted(m.keys or []),
        "props": dict(m.properties or {}),
        "attempt": m.delivery_attempt,
        "message_type": m.message_type,
        "corrupted": bool(m.corrupted),
        "has_receipt_handle": bool(m.receipt_handle),
        "at": round(at if at is not None else time.monotonic(), 3),
    }


def error_json(e, where):
    """An exception as data: its class, its text, its code (ClientException) if any."""
    code = getattr(e, "code", None)
    if callable(code):  # a grpc error: its status code
        try:
            code = str(code())
        except Exception:  # noqa: BLE001
            code = None
    return {
        "where": where,
        "type": type(e).__name__,
        "code": code,
        "text": str(e),
    }


def emit(obj):
    """Prints `obj` as one JSON line on the real standard output."""
    line = (json.dumps(obj, sort_keys=True, default=str) + "\n").encode()
    fd = _REAL_STDOUT_FD if _REAL_STDOUT_FD is not None else 1
    os.write(fd, line)


def run(main):
    """Runs `main()` (which returns the result dict), emits its result (or the fatal error) and
    ends the process at once: the client's scheduler threads must not keep it alive."""
    code = 0
    try:
        result = main()
    except BaseException as e:  # noqa: BLE001 - everything is reported, nothing swallowed
        result = {"fatal": error_json(e, "main"), "traceback": traceback.format_exc()}
        code = 1
    try:
        emit(result)
    finally:
        sys.stderr.flush()
        os._exit(code)


def shutdown_quietly(client, errors, where):
    """Shuts a client down; a failure is recorded, not raised."""
    if client is None:
        return
    try:
        client.shutdown()
    except Exception as e:  # noqa: BLE001
        errors.append(error_json(e, where))


def now():
    return time.monotonic()


def now_ms():
    """Milliseconds since the epoch, by this host's clock."""
    return int(time.time() * 1000)


def attempt(fn):
    """Runs `fn`; the case raised (with its error) or returned (with what it returned)."""
    try:
        value = fn()
        return {"raised": False, "error": None, "value": value}
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "error": error_json(e, "case")}
