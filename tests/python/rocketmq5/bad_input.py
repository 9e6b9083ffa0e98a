"""Bad input, one case after the other, each recorded with the error it met; then a normal send
and receive, to show the node serves on. Cases (the official client's API first; where the
client refuses before the server sees anything, the same request also goes to the server through
the client's own generated stub, `raw_*`, to show the server's answer):

- unknown_topic: Producer.send to a topic that does not exist (the client reports a failed route
  fetch; the route's status is in `raw_unknown_topic_route`);
- empty_body: a message with an empty body (the client refuses it; `raw_empty_body` sends one);
- body_too_large: a body of --body-limit + 1 bytes (`raw_body_too_large` sends one);
- fifo_on_normal_topic: a message with message_group set (a FIFO message) to a NORMAL topic
  (`raw_fifo_on_normal_topic` sends one);
- stale_receipt_handle: ack of a message, then ack again with the same handle;
- sql92_filter: a SimpleConsumer whose subscription is a SQL92 expression receives.

Output: {"cases": {name: {"raised": bool, "error": error|null, ...}}, "after_ok": {...},
         "errors": [...]}.
"""

import time

import common
import grpc
from rocketmq import Producer, SimpleConsumer
from rocketmq.grpc_protocol import (Encoding, MessageType, MessagingServiceStub,
                                    QueryRouteRequest, SendMessageRequest)
from rocketmq.v5.client.connection import RpcEndpoints
from rocketmq.v5.util import ClientId, MessageIdCodec, Misc, Signature

UNKNOWN_TOPIC = "no-such-topic-rmq5"


class Raw:
    """The client's generated MessagingService stub with the client's own signed headers."""

    def __init__(self, cfg, timeout):
        self.cfg = cfg
        self.timeout = timeout
        self.client_id = ClientId().client_id
        self.channels = []

    def stub(self, endpoints):
        ch = grpc.insecure_channel(endpoints.facade)
        self.channels.append(ch)
        return MessagingServiceStub(ch)

    def metadata(self):
        return Signature.metadata(self.cfg, self.client_id)

    def query_route(self, topic):
        req = QueryRouteRequest()
        req.topic.name = topic
        req.endpoints.CopyFrom(self.cfg.rpc_endpoints.endpoints)
        return self.stub(self.cfg.rpc_endpoints).QueryRoute(
            req, metadata=self.metadata(), timeout=self.timeout)

    def send(self, topic, body, message_group=None):
        """One SendMessage of `body` to the broker endpoints of the topic's first route queue; a
        FIFO message when `message_group` is given."""
        route = self.query_route(topic)
        if not route.message_queues:
            raise RuntimeError(f"route of {topic} has no queues: status {route.status}")
        broker = RpcEndpoints(route.message_queues[0].broker.endpoints)
        req = SendMessageRequest()
        m = req.messages.add()
        m.topic.name = topic
        m.body = body
        m.system_properties.message_id = MessageIdCodec().next_message_id()
        m.system_properties.message_type = MessageType.NORMAL
        if message_group:
            m.system_properties.message_type = MessageType.FIFO
            m.system_properties.message_group = message_group
        m.system_properties.born_timestamp.seconds = int(time.time())
        m.system_properties.born_host = Misc.get_local_ip()
        m.system_properties.body_encoding = Encoding.IDENTITY
        return self.stub(broker).SendMessage(req, metadata=self.metadata(), timeout=self.timeout)

    def close(self):
        for ch in self.channels:
            ch.close()


def status_json(status):
    return {"code": status.code, "message": status.message}


def raw_case(fn):
    """A raw call: its payload status (and per-entry statuses), or the gRPC error it ended in."""
    try:
        res = fn()
        out = {"grpc_error": None, "status": status_json(res.status)}
        if hasattr(res, "entries"):
            out["entries"] = [status_json(e.status) for e in res.entries]
        return out
    except grpc.RpcError as e:
        return {"grpc_error": {"code": str(e.code()), "details": e.details()}, "status": None}
    except Exception as e:  # noqa: BLE001
        return {"grpc_error": None, "status": None, "error": common.error_json(e, "raw")}


def main():
    p = common.parser(__doc__)
    p.add_argument("--body-limit", type=int, default=4 * 1024 * 1024)
    args = p.parse_args()
    cfg = common.config(args)
    cases, errors = {}, []
    raw = Raw(cfg, args.request_timeout + 2)

    producer = Producer(cfg, (args.topic,))
    producer.startup()
    try:
        # Unknown topic: the client asks for its route, which the server must refuse.
        cases["unknown_topic"] = common.attempt(lambda: producer.send(
            common.build_message(UNKNOWN_TOPIC, b"to nowhere", "TagA")).message_id)
        cases["raw_unknown_topic_route"] = raw_case(lambda: raw.query_route(UNKNOWN_TOPIC))

        # Empty body: the client's own check.
        def empty():
            m = common.build_message(args.topic, b"x", "TagA")
            m.body = b""
            return producer.send(m).message_id
        cases["empty_body"] = common.attempt(empty)
        cases["raw_empty_body"] = raw_case(lambda: raw.send(args.topic, b""))

        # A body one byte over the node's limit.
        big = b"\x5a" * (args.body_limit + 1)
        cases["body_too_large"] = common.attempt(lambda: producer.send(
            common.build_message(args.topic, big, "TagA")).message_id)
        cases["raw_body_too_large"] = raw_case(lambda: raw.send(args.topic, big))

        # A FIFO message (message_group set) to a NORMAL topic.
        def fifo():
            m = common.build_message(args.topic, b"fifo on a normal topic", "TagA")
            m.message_group = "group-1"
            return producer.send(m).message_id
        cases["fifo_on_normal_topic"] = common.attempt(fifo)
        cases["raw_fifo_on_normal_topic"] = raw_case(
            lambda: raw.send(args.topic, b"fifo on a normal topic", message_group="group-1"))

        # Stale receipt handle: a message acked twice.
        stale = {}
        consumer = SimpleConsumer(cfg, args.group, {args.topic: common.filter_expression("*")},
                                  await_duration=2)
        consumer.startup()
        try:
            stale["sent_id"] = producer.send(
                common.build_message(args.topic, b"ack me twice", "TagStale")).message_id
            deadline = common.Deadline(30)
            msg = None
            while msg is None and not deadline.passed():
                try:
                    for m in consumer.receive(16, 30) or []:
                        if m.message_id == stale["sent_id"]:
                            msg = m
                        else:
                            consumer.ack(m)
                except Exception as e:  # noqa: BLE001
                    errors.append(common.error_json(e, "stale case receive"))
                    time.sleep(0.2)
            stale["received"] = msg is not None
            if msg is not None:
                stale["first_ack"] = common.attempt(lambda: consumer.ack(msg))
                stale["second_ack"] = common.attempt(lambda: consumer.ack(msg))
        finally:
            common.shutdown_quietly(consumer, errors, "stale case consumer shutdown")
        cases["stale_receipt_handle"] = stale

        # SQL92 filter.
        sql_consumer = None

        def sql():
            nonlocal sql_consumer
            sql_consumer = SimpleConsumer(
                cfg, args.group + "-sql",
                {args.topic: common.filter_expression("idx > 1", "sql")}, await_duration=2)
            sql_consumer.startup()
            return len(sql_consumer.receive(16, 10) or [])
        cases["sql92_filter"] = common.attempt(sql)
        common.shutdown_quietly(sql_consumer, errors, "sql consumer shutdown")

        # The node serves on: a normal send, received and acked.
        after = {}
        after["send"] = common.attempt(lambda: producer.send(
            common.build_message(args.topic, b"still serving", "TagAfter")).message_id)
        if not after["send"]["raised"]:
            sent_id = after["send"]["value"]
            consumer = SimpleConsumer(cfg, args.group + "-after",
                                      {args.topic: common.filter_expression("TagAfter")},
                                      await_duration=2)
            consumer.startup()
            try:
                deadline = common.Deadline(30)
                got = None
                while got is None and not deadline.passed():
                    try:
                        for m in consumer.receive(16, 30) or []:
                            consumer.ack(m)
                            if m.message_id == sent_id:
                                got = common.received_json(m)
                    except Exception as e:  # noqa: BLE001
                        errors.append(common.error_json(e, "after receive"))
                        time.sleep(0.2)
                after["received"] = got
            finally:
                common.shutdown_quietly(consumer, errors, "after consumer shutdown")
    finally:
        common.shutdown_quietly(producer, errors, "producer shutdown")
        raw.close()
    return {"cases": cases, "after_ok": after, "errors": errors}


if __name__ == "__main__":
    common.run(main)
