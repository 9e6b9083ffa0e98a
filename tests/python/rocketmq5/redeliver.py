"""SimpleConsumer without ack: receives the first message with --invisible seconds and does NOT
ack it; receives on until the same message id has been delivered --take times (default 2), acks
that last delivery (unless --no-ack-last: then nothing is ever acked, as for the dead-letter
case), then receives for --quiet-seconds more (nothing may come). Bounded by --max-seconds.

Output: {"deliveries": [message + "since_first" seconds], "first": message|null,
         "second": message|null, "ack_error": error|null, "errors": [...]}.
"""

import time

import common
from rocketmq import SimpleConsumer


def main():
    p = common.parser(__doc__)
    p.add_argument("--invisible", type=int, default=3, help="seconds")
    p.add_argument("--await-seconds", type=int, default=2)
    p.add_argument("--quiet-seconds", type=float, default=4.0)
    p.add_argument("--take", type=int, default=2)
    p.add_argument("--no-ack-last", action="store_true")
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    deliveries, errors = [], []
    first = second = ack_error = None
    taken = 0
    first_at = None
    quiet_until = None
    consumer = SimpleConsumer(common.config(args), args.group,
                              {args.topic: common.filter_expression("*")},
                              await_duration=args.await_seconds)
    consumer.startup()
    try:
        while not deadline.passed():
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            try:
                messages = consumer.receive(1, args.invisible)
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, "receive"))
                time.sleep(0.2)
                continue
            for m in messages or []:
                at = time.monotonic()
                d = common.received_json(m, at)
                if first_at is None:
                    first_at = at
                d["since_first"] = round(at - first_at, 3)
                deliveries.append(d)
                if first is None:
                    first = d  # not acked: it must come back after its invisible time
                if m.message_id != first["id"] or quiet_until is not None:
                    continue
                taken += 1
                if taken == 2:
                    second = d
                if taken == args.take:
                    if not args.no_ack_last:
                        try:
                            consumer.ack(m)
                        except Exception as e:  # noqa: BLE001
                            ack_error = common.error_json(e, f"ack of delivery {taken}")
                    quiet_until = time.monotonic() + args.quiet_seconds
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")
    return {"deliveries": deliveries, "first": first, "second": second,
            "ack_error": ack_error, "errors": errors}


if __name__ == "__main__":
    common.run(main)
