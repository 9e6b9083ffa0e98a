"""FIFO message groups with the official client: a Producer sends to the FIFO topic --topic
--groups message groups ("g0" .. "g<N-1>") x --per-group messages each, interleaved (round-robin
over the groups: g0-0, g1-0, ..., g0-1, g1-1, ...), each with its `message_group` set and the body
"<group>-<seq>" (e.g. "g3-7"). Then --consumers SimpleConsumers of the FIFO consumer group --group,
each in its own thread, receive (--batch messages at most, --invisible-seconds) and ack in a loop.
One delivery fails: the first time any consumer receives "g0-<--fail-seq>" it does NOT ack it, so
it must come again after its invisible time (delivery attempt 2). The consumers stop once every
sent message was acked once (or at --max-seconds), after receiving (and acking) --quiet-seconds
more to catch duplicates. Every receive event is recorded in the order the consumers saw them.

Output: {"sent": [{id, group, seq, body, at_ms}],
         "received": [{consumer, group, body, seq, id, attempt, message_type, at_ms, ack_ms,
                       acked, failed_on_purpose}],
         "failed": {id, consumer, at_ms}|null, "all_acked": bool, "errors": [...]}.
`group` of a received message is the message group the client read from it (null if the broker
sent none); `seq` is parsed from the body; `attempt` is the client's `delivery_attempt` (null if
the broker sent none); `at_ms` is when the receive returned it, `ack_ms` when its ack was sent
(absent when not acked); `acked` tells whether the ack succeeded.
"""

import threading
import time

import common
from rocketmq import Producer, SimpleConsumer

ERRORS_KEPT = 50


def parse_body(body):
    """ "g3-7" -> ("g3", 7); (text, None) for a body of another shape."""
    text = bytes(body or b"").decode("utf-8", errors="replace")
    head, sep, tail = text.rpartition("-")
    if sep and tail.isdigit():
        return text, head, int(tail)
    return text, None, None


class State:
    """What the consumer threads share; every access holds the lock."""

    def __init__(self, expect_ids, fail_body):
        self.lock = threading.Lock()
        self.expect = set(expect_ids)
        self.acked_ids = set()
        self.fail_body = fail_body
        self.failed = None
        self.received = []
        self.errors = []
        self.errors_dropped = 0
        self.quiet_until = None

    def error(self, e, where):
        with self.lock:
            if len(self.errors) < ERRORS_KEPT:
                self.errors.append(common.error_json(e, where))
            else:
                self.errors_dropped += 1

    def take_failure(self, body_text, consumer, message_id):
        """True once: for the first delivery of the designated message."""
        with self.lock:
            if self.failed is not None or body_text != self.fail_body:
                return False
            self.failed = {"id": message_id, "consumer": consumer, "at_ms": common.now_ms()}
            return True

    def record(self, event, message_id):
        with self.lock:
            self.received.append(event)
            if event["acked"]:
                self.acked_ids.add(message_id)

    def all_acked(self):
        with self.lock:
            return self.expect <= self.acked_ids

    def stop(self, deadline):
        with self.lock:
            quiet_until = self.quiet_until
        if deadline.passed():
            return True
        return quiet_until is not None and time.monotonic() >= quiet_until


def consume(index, consumer, state, deadline, args):
    name = f"c{index}"
    while not state.stop(deadline):
        try:
            messages = consumer.receive(args.batch, args.invisible_seconds)
        except Exception as e:  # noqa: BLE001
            state.error(e, f"receive {name}")
            time.sleep(0.2)
            continue
        for m in messages or []:
            at = common.now_ms()
            text, _, seq = parse_body(m.body)
            event = {
                "consumer": name,
                "group": m.message_group,
                "body": text,
                "seq": seq,
                "id": m.message_id,
                "attempt": m.delivery_attempt,
                "message_type": m.message_type,
                "at_ms": at,
                "acked": False,
                "failed_on_purpose": False,
            }
            if state.take_failure(text, name, m.message_id):
                event["failed_on_purpose"] = True  # not acked: it must come again
            else:
                try:
                    event["ack_ms"] = common.now_ms()
                    consumer.ack(m)
                    event["acked"] = True
                except Exception as e:  # noqa: BLE001
                    state.error(e, f"ack {name} {m.message_id}")
            state.record(event, m.message_id)


def main():
    p = common.parser(__doc__)
    p.add_argument("--groups", type=int, default=4, help="message groups g0..g<N-1>")
    p.add_argument("--per-group", type=int, default=5, help="messages per message group")
    p.add_argument("--consumers", type=int, default=2, help="SimpleConsumers, one thread each")
    p.add_argument("--fail-seq", type=int, default=2,
                   help="the first delivery of g0-<fail-seq> is not acked")
    p.add_argument("--invisible-seconds", type=int, default=3)
    p.add_argument("--await-seconds", type=int, default=2, help="long polling of one receive")
    p.add_argument("--batch", type=int, default=16, help="max messages of one receive")
    p.add_argument("--quiet-seconds", type=float, default=3.0)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    sent, errors = [], []
    producer = Producer(common.config(args), (args.topic,))
    producer.startup()
    try:
        for seq in range(args.per_group):
            for g in range(args.groups):
                if deadline.passed():
                    break
                group = f"g{g}"
                body = f"{group}-{seq}"
                m = common.build_message(args.topic, body.encode())
                m.message_group = group
                try:
                    r = producer.send(m)
                except Exception as e:  # noqa: BLE001
                    errors.append(common.error_json(e, f"send {body}"))
                    continue
                sent.append({"id": r.message_id, "group": group, "seq": seq, "body": body,
                             "at_ms": common.now_ms()})
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")

    state = State([s["id"] for s in sent], f"g0-{args.fail_seq}")
    consumers, threads = [], []
    try:
        for _ in range(max(1, args.consumers)):
            c = SimpleConsumer(common.config(args), args.group,
                               {args.topic: common.filter_expression("*")},
                               await_duration=args.await_seconds)
            c.startup()
            consumers.append(c)
        for i, c in enumerate(consumers):
            t = threading.Thread(target=consume, args=(i, c, state, deadline, args),
                                 name=f"fifo-consumer-{i}", daemon=True)
            t.start()
            threads.append(t)
        while not deadline.passed() and not state.all_acked():
            time.sleep(0.05)
        with state.lock:
            state.quiet_until = min(time.monotonic() + args.quiet_seconds, deadline.end)
        # A receive in flight ends within its long polling plus the request timeout.
        join_by = state.quiet_until + args.await_seconds + args.request_timeout + 2
        for t in threads:
            t.join(max(0.0, join_by - time.monotonic()))
            if t.is_alive():
                errors.append({"where": t.name, "type": "Timeout", "code": None,
                               "text": "consumer thread still running at the end"})
    finally:
        for i, c in enumerate(consumers):
            common.shutdown_quietly(c, errors, f"consumer c{i} shutdown")
    with state.lock:
        received = list(state.received)
        errors.extend(state.errors)
        return {
            "sent": sent,
            "received": received,
            "failed": state.failed,
            "all_acked": state.expect <= state.acked_ids,
            "errors": errors,
            "errors_dropped": state.errors_dropped,
        }


if __name__ == "__main__":
    common.run(main)
