"""Transactional messages with the official client. Bodies are "txn-<i>". --mode:

  commit-rollback  A Producer (with a TransactionChecker) sends --count half messages to the
                   TRANSACTION topic --topic, one transaction each, then commits the even i and
                   rolls back the odd i; then it commits transaction 0 again (a bad case:
                   "commit_again"). A SimpleConsumer of --group then receives (and acks) until
                   every committed message has come, and --quiet-seconds more.
  orphan           A Producer sends --count half messages and ends none of them: it shuts down
                   (or, with --crash, the process just ends without a shutdown), as a crashed
                   producer would.
  checker          A Producer declaring the topic --topic, whose TransactionChecker answers the
                   server's checks (see --answer), stays connected --stay-seconds while a
                   SimpleConsumer of --group receives (and acks). With --expect-checks N it ends
                   earlier: once N checks came and every message it answered COMMIT for was
                   received, plus --quiet-seconds.

--answer (what the checker answers, in every mode but orphan, which never answers):
  parity   COMMIT when the body ends with an even number, ROLLBACK when odd (default).
  unknown  TRANSACTION_RESOLUTION_UNSPECIFIED (the client still sends an EndTransaction with it).
  silent   nothing: the check raises inside the checker, so the client sends no EndTransaction.

Output (commit-rollback): {"mode", "sent": [{id, i, action, transaction_id, sent_at_ms}],
         "ended": [{id, i, action, at_ms}], "commit_again": {raised, error},
         "received": [{id, body, at_ms, attempt, message_type}], "checks": [...], "errors": [...]}.
Output (orphan): {"mode", "sent": [{id, i, transaction_id, sent_at_ms}], "checks": [...],
         "errors": [...]}.
Output (checker): {"mode", "checks": [{id, topic, body, at_ms, answer}], "received": [...],
         "errors": [...]}.
"""

import threading
import time

import common
from rocketmq import (Producer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)


def body_text(body):
    return bytes(body or b"").decode("utf-8", errors="replace")


class RecordingChecker(TransactionChecker):
    """Records every check the server sends (the client calls `check` from its one transaction
    check thread) and answers per `answer`. It never lets an exception out unless it means to
    (silent): the client would swallow it and answer nothing."""

    def __init__(self, answer):
        self.answer = answer
        self.lock = threading.Lock()
        self.checks = []

    def decide(self, text):
        if self.answer == "unknown":
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        _, sep, tail = text.rpartition("-")
        if not sep or not tail.isdigit():
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        return TransactionResolution.ROLLBACK if int(tail) % 2 else TransactionResolution.COMMIT

    def check(self, message):
        text = body_text(message.body)
        rec = {"id": message.message_id, "topic": message.topic, "body": text,
               "at_ms": common.now_ms(), "answer": None}
        try:
            if self.answer == "silent":
                rec["answer"] = "NONE"
                raise RuntimeError("silent checker: no answer")
            resolution = self.decide(text)
            rec["answer"] = TransactionResolution.Name(resolution)
            return resolution
        finally:
            with self.lock:
                self.checks.append(rec)

    def recorded(self):
        with self.lock:
            return list(self.checks)

    def committed_ids(self):
        with self.lock:
            return {c["id"] for c in self.checks if c["answer"] == "COMMIT"}


def new_producer(args, checker):
    producer = Producer(common.config(args), (args.topic,), checker=checker)
    producer.startup()
    return producer


def new_consumer(args):
    consumer = SimpleConsumer(common.config(args), args.group,
                              {args.topic: common.filter_expression("*")},
                              await_duration=args.await_seconds)
    consumer.startup()
    return consumer


def receive_once(consumer, args, received, errors):
    """One receive; every message is recorded and acked. Returns the ids received."""
    try:
        messages = consumer.receive(args.batch, args.invisible_seconds)
    except Exception as e:  # noqa: BLE001
        errors.append(common.error_json(e, "receive"))
        time.sleep(0.2)
        return []
    ids = []
    for m in messages or []:
        received.append({
            "id": m.message_id,
            "body": body_text(m.body),
            "at_ms": common.now_ms(),
            "attempt": m.delivery_attempt,
            "message_type": m.message_type,
        })
        ids.append(m.message_id)
        try:
            consumer.ack(m)
        except Exception as e:  # noqa: BLE001
            errors.append(common.error_json(e, f"ack {m.message_id}"))
    return ids


def send_half(producer, args, i, errors):
    """Sends half message i in a new transaction: (transaction, sent record) or (None, None)."""
    try:
        tx = producer.begin_transaction()
        m = common.build_message(args.topic, f"txn-{i}".encode())
        r = producer.send(m, tx)
    except Exception as e:  # noqa: BLE001
        errors.append(common.error_json(e, f"send txn-{i}"))
        return None, None
    return tx, {"id": r.message_id, "i": i, "transaction_id": r.transaction_id,
                "sent_at_ms": common.now_ms()}


def commit_rollback(args, deadline, checker):
    sent, ended, errors, received = [], [], [], []
    result = {"mode": args.mode}
    txs = []
    producer = new_producer(args, checker)
    try:
        for i in range(args.count):
            if deadline.passed():
                break
            tx, s = send_half(producer, args, i, errors)
            if tx is None:
                continue
            s["action"] = "commit" if i % 2 == 0 else "rollback"
            sent.append(s)
            txs.append((tx, s))
        for tx, s in txs:
            try:
                if s["action"] == "commit":
                    tx.commit()
                else:
                    tx.rollback()
                ended.append({"id": s["id"], "i": s["i"], "action": s["action"],
                              "at_ms": common.now_ms()})
            except Exception as e:  # noqa: BLE001
                errors.append(common.error_json(e, f"{s['action']} txn-{s['i']}"))
        first_commit = next((tx for tx, s in txs if s["action"] == "commit"), None)
        if first_commit is not None:
            result["commit_again"] = common.attempt(first_commit.commit)
        else:
            result["commit_again"] = None
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")

    expect = {e["id"] for e in ended if e["action"] == "commit"}
    seen = set()
    consumer = new_consumer(args)
    quiet_until = None
    try:
        while not deadline.passed():
            if quiet_until is None and expect <= seen:
                quiet_until = time.monotonic() + args.quiet_seconds
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            seen.update(receive_once(consumer, args, received, errors))
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")
    result.update({"sent": sent, "ended": ended, "received": received,
                   "checks": checker.recorded(), "errors": errors})
    return result


def orphan(args, deadline, checker):
    sent, errors = [], []
    producer = new_producer(args, checker)
    try:
        for i in range(args.count):
            if deadline.passed():
                break
            tx, s = send_half(producer, args, i, errors)
            if tx is not None:
                sent.append(s)  # never committed nor rolled back
    finally:
        if not args.crash:
            common.shutdown_quietly(producer, errors, "producer shutdown")
    # With --crash, common.run ends the process at once: no NotifyClientTermination is sent.
    return {"mode": args.mode, "sent": sent, "checks": checker.recorded(), "errors": errors}


def checker_mode(args, deadline, checker):
    errors, received = [], []
    stay = common.Deadline(min(args.stay_seconds, deadline.left()))
    producer = consumer = None
    seen = set()
    quiet_until = None
    try:
        producer = new_producer(args, checker)
        consumer = new_consumer(args)
        while not stay.passed():
            if (quiet_until is None and args.expect_checks > 0
                    and len(checker.recorded()) >= args.expect_checks
                    and checker.committed_ids() <= seen):
                quiet_until = time.monotonic() + args.quiet_seconds
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            seen.update(receive_once(consumer, args, received, errors))
    finally:
        common.shutdown_quietly(consumer, errors, "consumer shutdown")
        common.shutdown_quietly(producer, errors, "producer shutdown")
    return {"mode": args.mode, "checks": checker.recorded(), "received": received,
            "errors": errors}


def main():
    p = common.parser(__doc__)
    p.add_argument("--mode", required=True, choices=["commit-rollback", "orphan", "checker"])
    p.add_argument("--count", type=int, default=6)
    p.add_argument("--answer", default="parity", choices=["parity", "unknown", "silent"])
    p.add_argument("--crash", action="store_true", help="orphan: end without a shutdown")
    p.add_argument("--stay-seconds", type=float, default=30.0)
    p.add_argument("--expect-checks", type=int, default=0,
                   help="checker: end once this many checks came (0: stay --stay-seconds)")
    p.add_argument("--invisible-seconds", type=int, default=20)
    p.add_argument("--await-seconds", type=int, default=2, help="long polling of one receive")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--quiet-seconds", type=float, default=3.0)
    args = p.parse_args()
    deadline = common.Deadline(args.max_seconds)

    if args.mode == "orphan":
        return orphan(args, deadline, RecordingChecker("silent"))
    checker = RecordingChecker(args.answer)
    if args.mode == "commit-rollback":
        return commit_rollback(args, deadline, checker)
    return checker_mode(args, deadline, checker)


if __name__ == "__main__":
    common.run(main)
