"""PushConsumer: a MessageListener consumes --topic as group --group. It answers SUCCESS, except
for messages whose user property `idx` is in --fail-idx: their first delivery (attempt 1) gets
FAILURE, and later ones SUCCESS. Runs until --expect distinct message ids were consumed with
SUCCESS, then --quiet-seconds more (to catch duplicates). Bounded by --max-seconds.

Output: {"calls": [message + "result"], "expect_reached": bool, "startup_error": error|null,
         "errors": [...]}.
"""

import threading
import time

import common
from rocketmq import ConsumeResult, MessageListener, PushConsumer


class Recorder(MessageListener):
    def __init__(self, fail_idx):
        self.lock = threading.Lock()
        self.calls = []
        self.succeeded = set()
        self.fail_idx = fail_idx

    def consume(self, message):
        idx = (message.properties or {}).get("idx")
        attempt = message.delivery_attempt or 0
        fail = idx in self.fail_idx and attempt <= 1
        result = ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS
        entry = common.received_json(message)
        entry["result"] = result.name
        with self.lock:
            self.calls.append(entry)
            if not fail:
                self.succeeded.add(message.message_id)
        return result

    def succeeded_count(self):
        with self.lock:
            return len(self.succeeded)


def main():
    p = common.parser(__doc__)
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--fail-idx", default="", help="comma-separated idx values to fail once")
    p.add_argument("--quiet-seconds", type=float, default=3.0)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)
    listener = Recorder({i for i in args.fail_idx.split(",") if i})

    errors = []
    startup_error = None
    consumer = PushConsumer(common.config(args), args.group, listener,
                            {args.topic: common.filter_expression("*")})
    try:
        consumer.startup()
    except Exception as e:  # noqa: BLE001
        startup_error = common.error_json(e, "push consumer startup")
        consumer = None
    expect_reached = False
    try:
        if consumer is not None:
            while not deadline.passed() and listener.succeeded_count() < args.expect:
                time.sleep(0.1)
            expect_reached = listener.succeeded_count() >= args.expect
            if expect_reached:
                time.sleep(min(args.quiet_seconds, deadline.left()))
    finally:
        common.shutdown_quietly(consumer, errors, "push consumer shutdown")
    with listener.lock:
        calls = list(listener.calls)
    return {"calls": calls, "expect_reached": expect_reached,
            "startup_error": startup_error, "errors": errors}


if __name__ == "__main__":
    common.run(main)
