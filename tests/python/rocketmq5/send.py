"""Producer: sends --count messages to --topic, each with a tag (cycled from --tags), two keys and
three user properties, and prints what it sent and what each send returned.

Message i: body `common.body_of(prefix, i)`; tag `tags[i % len(tags)]`; keys `<prefix>-key-<i>`
and `<prefix>-shared`; properties idx=<i>, prefix=<prefix>, note=<non-ASCII text>.

Output: {"sent": [{id, body_hex, tag, keys, props, offset, index}], "errors": [...]}.
"""

import common
from rocketmq import Producer


def main():
    p = common.parser(__doc__)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--prefix", default="m")
    p.add_argument("--tags", default="TagA", help="comma-separated; empty: no tag")
    args = p.parse_args()
    tags = [t for t in args.tags.split(",") if t]
    deadline = common.Deadline(args.max_seconds)

    sent, errors = [], []
    producer = Producer(common.config(args), (args.topic,))
    producer.startup()
    try:
        for i in range(args.count):
            if deadline.passed():
                errors.append({"where": "loop", "text": f"deadline passed after {i} sends"})
                break
            body = common.body_of(args.prefix, i)
            tag = tags[i % len(tags)] if tags else None
            keys = [f"{args.prefix}-key-{i}", f"{args.prefix}-shared"]
            props = {"idx": str(i), "prefix": args.prefix, "note": "zażółć gęślą jaźń ✓"}
            msg = common.build_message(args.topic, body, tag, keys, props)
            try:
                receipt = producer.send(msg)
                entry = common.sent_json(receipt, body, tag, keys, props)
                entry["index"] = i
                sent.append(entry)
            except Exception as e:  # noqa: BLE001
                err = common.error_json(e, f"send {i}")
                err["index"] = i
                errors.append(err)
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")
    return {"sent": sent, "errors": errors}


if __name__ == "__main__":
    common.run(main)
