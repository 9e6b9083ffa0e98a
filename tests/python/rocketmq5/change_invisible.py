"""SimpleConsumer: receives one message invisible for --invisible seconds, changes its invisible
duration to --extend seconds (the client takes the new receipt handle from the reply), receives
for --hold seconds (past the first deadline: nothing may come while the extension holds), acks
with the new handle, then receives until --extend + --margin seconds after the change (past
every deadline: nothing may come). Bounded by --max-seconds.

Output: {"message": message|null, "handle_changed": bool, "change_error": error|null,
         "ack_error": error|null, "before_ack": [message], "after_ack": [message],
         "watched_until_s": seconds after the change the last receive ended, "errors": [...]}.
"""

import time

import common
from rocketmq import SimpleConsumer


def receive_for(consumer, seconds, deadline, out, errors):
    """Receives (acking nothing) until `seconds` from now, appending every delivery to `out`."""
    end = min(time.monotonic() + seconds, deadline.end)
    while time.monotonic() < end:
        try:
            for m in consumer.receive(16, 30) or []:
                out.append(common.received_json(m))
        except Exception as e:  # noqa: BLE001
            errors.append(common.error_json(e, "receive"))
            time.sleep(0.2)


def main():
    p = common.parser(__doc__)
    p.add_argument("--invisible", type=int, default=2)
    p.add_argument("--extend", type=int, default=8)
    p.add_argument("--hold", type=float, default=5.0)
    p.add_argument("--margin", type=float, default=4.0)
    p.add_argument("--await-seconds", type=int, default=1)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    errors, before_ack, after_ack = [], [], []
    message = change_error = ack_error = None
    handle_changed = False
    changed_at = None
    consumer = SimpleConsumer(common.config(args), args.group,
                              {args.topic: common.filter_expression("*")},
                              await_duration=args.await_seconds)
    consumer.startup()
    try:
        msg = None
        while msg is None and not deadline.passed():
            try:
                got = consumer.receive(1, args.invisible)
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, "first receive"))
                time.sleep(0.2)
                continue
            if got:
                msg = got[0]
        if msg is not None:
            message = common.received_json(msg)
            old_handle = msg.receipt_handle
            try:
                consumer.change_invisible_duration(msg, args.extend)
                changed_at = time.monotonic()
            except Exception as e:  # noqa: BLE001
                change_error = common.error_json(e, "change_invisible_duration")
            handle_changed = bool(msg.receipt_handle) and msg.receipt_handle != old_handle
            if change_error is None:
                receive_for(consumer, args.hold, deadline, before_ack, errors)
                try:
                    consumer.ack(msg)
                except Exception as e:  # noqa: BLE001
                    ack_error = common.error_json(e, "ack with the new handle")
                left = changed_at + args.extend + args.margin - time.monotonic()
                receive_for(consumer, max(0.0, left), deadline, after_ack, errors)
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")
    return {
        "message": message,
        "handle_changed": handle_changed,
        "change_error": change_error,
        "ack_error": ack_error,
        "before_ack": before_ack,
        "after_ack": after_ack,
        "watched_until_s": round(time.monotonic() - changed_at, 3) if changed_at else None,
        "errors": errors,
    }


if __name__ == "__main__":
    common.run(main)
