"""SimpleConsumer: receives from --topic as group --group with a filter until it has seen --expect
distinct message ids, then keeps receiving for --quiet-seconds more (to catch duplicates and
messages that should not come), acknowledging each delivery unless --no-ack. Every delivery is
recorded, duplicates included. Bounded by --max-seconds.

Output: {"received": [message...], "errors": [...], "ack_errors": [...], "acked": n,
         "expect_reached": bool}.
"""

import time

import common
from rocketmq import SimpleConsumer

ERRORS_KEPT = 20


def main():
    p = common.parser(__doc__)
    p.add_argument("--filter", default="*")
    p.add_argument("--filter-type", default="tag", choices=["tag", "sql"])
    p.add_argument("--expect", type=int, default=0)
    p.add_argument("--quiet-seconds", type=float, default=3.0)
    p.add_argument("--no-ack", action="store_true")
    p.add_argument("--invisible", type=int, default=20, help="seconds")
    p.add_argument("--await-seconds", type=int, default=2, help="long polling of one receive")
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    received, errors, ack_errors = [], [], []
    errors_dropped = 0
    acked = 0
    ids = set()
    consumer = SimpleConsumer(
        common.config(args),
        args.group,
        {args.topic: common.filter_expression(args.filter, args.filter_type)},
        await_duration=args.await_seconds,
    )
    consumer.startup()
    quiet_until = None
    try:
        while not deadline.passed():
            if quiet_until is None and len(ids) >= args.expect:
                quiet_until = time.monotonic() + args.quiet_seconds
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            try:
                messages = consumer.receive(args.batch, args.invisible)
            except Exception as e:  # noqa: BLE001
                if len(errors) < ERRORS_KEPT:
                    errors.append(common.error_json(e, "receive"))
                else:
                    errors_dropped += 1
                time.sleep(0.2)
                continue
            for m in messages or []:
                received.append(common.received_json(m))
                ids.add(m.message_id)
                if args.no_ack:
                    continue
                try:
                    consumer.ack(m)
                    acked += 1
                except Exception as e:  # noqa: BLE001
                    ack_errors.append(common.error_json(e, f"ack {m.message_id}"))
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")
    return {
        "received": received,
        "errors": errors,
        "errors_dropped": errors_dropped,
        "ack_errors": ack_errors,
        "acked": acked,
        "expect_reached": len(ids) >= args.expect,
    }


if __name__ == "__main__":
    common.run(main)
