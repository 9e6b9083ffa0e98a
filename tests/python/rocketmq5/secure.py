"""Credentials and TLS: the official client with `Credentials(ak, sk)` and `tls_enable=True`
against a broker group with TLS and auth on. The CA the test made is trusted through gRPC's
`GRPC_DEFAULT_SSL_ROOTS_FILE_PATH` (the client uses `grpc.ssl_channel_credentials()`).

1. A producer signed as --access-key sends --count messages; a simple consumer signed the same way
   receives and acks them.
2. A producer with the right access key and a wrong secret tries one send.
3. A producer signed as --reader-key (a user that may Sub but not Pub) tries one send.
4. A simple consumer signed as --reader-key with a wrong --reader-group (not allowed) receives.

Output: {"sent": [ids], "received": [ids], "acked": n, "wrong_secret": error|null,
"no_pub": error|null, "no_group": error|null, "errors": [...]}. A refused call is an error
object (its text holds the status the server answered); null means the call succeeded.
"""

import os

import common
from rocketmq import ClientConfiguration, Credentials, Producer, SimpleConsumer


def cfg(args, ak, sk):
    return ClientConfiguration(args.endpoints, Credentials(ak, sk),
                               request_timeout=args.request_timeout)


def try_send(args, ak, sk, where, errors):
    """One send as (ak, sk): None when it succeeded, else the error."""
    producer = Producer(cfg(args, ak, sk), (args.topic,), tls_enable=True)
    try:
        producer.startup()
        msg = common.build_message(args.topic, common.body_of(where, 0), "TagA")
        producer.send(msg)
        return None
    except Exception as e:  # noqa: BLE001
        err = common.error_json(e, where)
        # A refused QueryRoute surfaces as "failed to fetch ... route"; the status the server
        # answered is in the client's log.
        err["log"] = status_lines()
        return err
    finally:
        common.shutdown_quietly(producer, errors, f"{where} shutdown")


def status_lines():
    """The client log's lines that carry a refusal status (40100 / 40300), last 5."""
    path = os.path.expanduser("~/logs/rocketmq_python/rocketmq_client.log")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f if "40100" in ln or "40300" in ln]
    except OSError:
        return []
    return lines[-5:]


def main():
    p = common.parser(__doc__)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--reader-key", required=True)
    p.add_argument("--reader-secret", required=True)
    p.add_argument("--reader-group", required=True)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)
    errors = []

    sent = []
    producer = Producer(cfg(args, args.access_key, args.secret_key), (args.topic,),
                        tls_enable=True)
    producer.startup()
    try:
        for i in range(args.count):
            if deadline.passed():
                errors.append({"where": "send loop", "text": f"deadline passed after {i}"})
                break
            msg = common.build_message(args.topic, common.body_of("s", i), "TagA")
            try:
                sent.append(producer.send(msg).message_id)
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, f"send {i}"))
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")

    received, acked = [], 0
    consumer = SimpleConsumer(cfg(args, args.access_key, args.secret_key), args.group,
                              {args.topic: common.filter_expression("*")}, await_duration=3,
                              tls_enable=True)
    consumer.startup()
    try:
        while len(received) < len(sent) and not deadline.passed():
            try:
                msgs = consumer.receive(32, 15)
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, "receive"))
                continue
            for m in msgs or []:
                received.append(m.message_id)
                consumer.ack(m)
                acked += 1
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")

    wrong_secret = try_send(args, args.access_key, args.secret_key + "-wrong", "wrong secret",
                            errors)
    no_pub = try_send(args, args.reader_key, args.reader_secret, "no pub", errors)

    no_group = None
    reader = SimpleConsumer(cfg(args, args.reader_key, args.reader_secret), args.reader_group,
                            {args.topic: common.filter_expression("*")}, await_duration=2,
                            tls_enable=True)
    try:
        reader.startup()
        reader.receive(1, 15)
    except Exception as e:  # noqa: BLE001
        no_group = common.error_json(e, "no group")
    finally:
        common.shutdown_quietly(reader, errors, "reader shutdown")

    return {"sent": sent, "received": received, "acked": acked, "wrong_secret": wrong_secret,
            "no_pub": no_pub, "no_group": no_group, "errors": errors}


if __name__ == "__main__":
    common.run(main)
