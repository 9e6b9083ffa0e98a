"""Delay messages with the official client: a Producer sends --count messages to the DELAY topic
--topic, message i due at (now + --delay-seconds + i % 3) (the client takes whole seconds), and
recalls the last --recall of them by the recall handle each send returned (then one of those
again, which must fail). It also tries the bad input: a delivery time on the NORMAL topic
--normal-topic, and one beyond the 40-day horizon. A SimpleConsumer then receives (and acks)
until every message not recalled has come, and keeps receiving --quiet-seconds more.

Output: {"sent": [{id, deliver_at_ms, recall_handle, sent_at_ms}], "recalled": [id...],
         "recall_again": {raised, error}, "normal_topic": {raised, error},
         "beyond_horizon": {raised, error},
         "received": [{id, at_ms, delivery_timestamp_ms, message_type}], "errors": [...]}.
"""

import time

import common
from rocketmq import Producer, SimpleConsumer


def main():
    p = common.parser(__doc__)
    p.add_argument("--normal-topic", required=True)
    p.add_argument("--count", type=int, default=6)
    p.add_argument("--recall", type=int, default=2)
    p.add_argument("--delay-seconds", type=int, default=4)
    p.add_argument("--quiet-seconds", type=float, default=3.0)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    sent, recalled, errors, received = [], [], [], []
    result = {}
    producer = Producer(common.config(args), (args.topic, args.normal_topic))
    producer.startup()
    try:
        base = int(time.time()) + args.delay_seconds
        for i in range(args.count):
            m = common.build_message(args.topic, f"delay-{i}".encode(), "TagD", [f"d-{i}"])
            m.delivery_timestamp = base + i % 3
            r = producer.send(m)
            sent.append({
                "id": r.message_id,
                "deliver_at_ms": (base + i % 3) * 1000,
                "recall_handle": r.recall_handle,
                "sent_at_ms": common.now_ms(),
            })
        for s in sent[len(sent) - args.recall:]:
            try:
                producer.recall_message(args.topic, s["recall_handle"])
                recalled.append(s["id"])
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, f"recall {s['id']}"))
        if recalled:
            handle = sent[-1]["recall_handle"]
            result["recall_again"] = common.attempt(lambda: producer.recall_message(args.topic, handle))

        def normal():
            m = common.build_message(args.normal_topic, b"x", "TagD")
            m.delivery_timestamp = int(time.time()) + 5
            producer.send(m)

        def far():
            m = common.build_message(args.topic, b"x", "TagD")
            m.delivery_timestamp = int(time.time()) + 41 * 24 * 3600
            producer.send(m)

        result["normal_topic"] = common.attempt(normal)
        result["beyond_horizon"] = common.attempt(far)
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")

    expect = {s["id"] for s in sent} - set(recalled)
    seen = set()
    consumer = SimpleConsumer(
        common.config(args), args.group,
        {args.topic: common.filter_expression("*")}, await_duration=2)
    consumer.startup()
    quiet_until = None
    try:
        while not deadline.passed():
            if quiet_until is None and expect <= seen:
                quiet_until = time.monotonic() + args.quiet_seconds
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            try:
                messages = consumer.receive(16, 20)
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, "receive"))
                time.sleep(0.2)
                continue
            for m in messages or []:
                received.append({
                    "id": m.message_id,
                    "at_ms": common.now_ms(),
                    "delivery_timestamp_ms": m.delivery_timestamp,
                    "message_type": m.message_type,
                })
                seen.add(m.message_id)
                try:
                    consumer.ack(m)
                except Exception as e:  # noqa: BLE001
                    errors.append(common.error_json(e, f"ack {m.message_id}"))
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")
    result.update({"sent": sent, "recalled": recalled, "received": received, "errors": errors})
    return result


if __name__ == "__main__":
    common.run(main)
