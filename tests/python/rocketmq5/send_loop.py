"""Producer send loop for the leader-kill test: sends up to --count messages (body
`common.body_of(prefix, i)`, tag TagA), one at a time, --pace-ms apart. After each successful send
it writes the number of successes so far to --progress-file, so the test knows when to kill the
leader; the test creates --kill-marker when it has. The loop ends after --count sends, or once
--after-kill-ok sends succeeded after the marker appeared, or at --max-seconds.

Output: {"sent": [{index, id, body_hex, after_kill, at}],
         "failed": [{index, body_hex, after_kill, error}], "errors": [...]}.
"""

import os
import time

import common
from rocketmq import Producer


def write_progress(path, n):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(n))
    os.replace(tmp, path)


def main():
    p = common.parser(__doc__)
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--prefix", default="loop")
    p.add_argument("--pace-ms", type=int, default=20)
    p.add_argument("--progress-file", required=True)
    p.add_argument("--kill-marker", required=True)
    p.add_argument("--after-kill-ok", type=int, default=30)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    sent, failed, errors = [], [], []
    ok_after_kill = 0
    start = time.monotonic()
    producer = Producer(common.config(args), (args.topic,))
    producer.startup()
    try:
        for i in range(args.count):
            if deadline.passed() or ok_after_kill >= args.after_kill_ok:
                break
            after_kill = os.path.exists(args.kill_marker)
            body = common.body_of(args.prefix, i)
            msg = common.build_message(args.topic, body, "TagA", [f"{args.prefix}-key-{i}"],
                                       {"idx": str(i)})
            try:
                receipt = producer.send(msg)
                sent.append({"index": i, "id": receipt.message_id, "body_hex": body.hex(),
                             "after_kill": after_kill,
                             "at": round(time.monotonic() - start, 3)})
                if after_kill:
                    ok_after_kill += 1
                write_progress(args.progress_file, len(sent))
            except Exception as e:  # noqa: BLE001
                failed.append({"index": i, "body_hex": body.hex(), "after_kill": after_kill,
                               "at": round(time.monotonic() - start, 3),
                               "error": common.error_json(e, f"send {i}")})
            time.sleep(args.pace_ms / 1000.0)
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")
    return {"sent": sent, "failed": failed, "errors": errors}


if __name__ == "__main__":
    common.run(main)
