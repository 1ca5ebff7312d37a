"""PyPI `rocketmq` 0.4.4, the RocketMQ C++ client (ctypes over its bundled
librocketmq.so), as a peer of the gateway. Prints one JSON object per line.

    rocketmq_cpp_client.py produce '{"nameSrv": "127.0.0.1:9876", "topic": "T",
        "messages": [{"body": "<hex>", "tag": "A", "keys": "k1 k2"}], "repeat": 0}'
    rocketmq_cpp_client.py consume '{"nameSrv": ..., "topic": "T", "group": "G",
        "expression": "*", "count": 2, "retryFirst": false, "timeout": 30, "orderly": false,
        "broadcasting": false}'

The consumer prints `ready` once started, `message` per delivery and `closed` with the
number handled successfully; it exits 3 if it did not reach `count`. The library logs to
~/logs/rocketmq-cpp (the test gives it a HOME of its own).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq.client import Message, Producer, PushConsumer, RecvMessage
from rocketmq.exceptions import ffi_check
from rocketmq.ffi import MessageModel, _CConsumeStatus, dll


def out(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def produce(opts: dict[str, Any]) -> int:
    producer = Producer(opts.get("producerGroup", "PID_cpp"))
    producer.set_namesrv_addr(opts["nameSrv"])
    producer.start()
    messages = opts["messages"]
    if opts.get("repeat"):
        messages = messages[:1] * opts["repeat"]
    started = time.perf_counter()
    try:
        for spec in messages:
            msg = Message(opts["topic"])
            if spec.get("tag"):
                msg.set_tags(spec["tag"])
            if spec.get("keys"):
                msg.set_keys(spec["keys"])
            for name, value in spec.get("props", {}).items():
                msg.set_property(name, value)
            msg.set_body(bytes.fromhex(spec["body"]))
            result = producer.send_sync(msg)
            if not opts.get("quiet"):
                out(
                    {
                        "event": "sent",
                        "status": int(result.status),
                        "msgId": result.msg_id,
                        "offset": result.offset,
                    }
                )
    finally:
        producer.shutdown()
    out({"event": "done", "count": len(messages), "seconds": time.perf_counter() - started})
    return 0


def consume(opts: dict[str, Any]) -> int:
    handled = 0
    tried: set[bytes] = set()
    done = threading.Event()
    lock = threading.Lock()

    def on_message(_consumer: Any, handle: Any) -> int:
        # Registered as the library's own callback: the wrapper's subscribe() reports a
        # failure by raising out of a ctypes callback, whose return value is then undefined.
        nonlocal handled
        msg = RecvMessage(handle)
        body = msg.body
        out(
            {
                "event": "message",
                "topic": msg.topic,
                "tags": msg.tags.decode(),
                "keys": msg.keys.decode(),
                "body": body.hex(),
                "msgId": msg.id,
                "reconsumeTimes": msg.reconsume_times,
                "queueOffset": msg.queue_offset,
                "queueId": msg.queue_id,
            }
        )
        with lock:
            if opts.get("retryFirst") and body not in tried:
                tried.add(body)
                return int(_CConsumeStatus.RECONSUME_LATER.value)
            handled += 1
            if handled >= opts["count"]:
                done.set()
        return int(_CConsumeStatus.CONSUME_SUCCESS.value)

    # orderly: the library's MessageListenerOrderly, which locks the queues it consumes;
    # broadcasting: every client of the group gets every message, offsets kept locally
    model = MessageModel.BROADCASTING if opts.get("broadcasting") else MessageModel.CLUSTERING
    consumer = PushConsumer(opts["group"], orderly=bool(opts.get("orderly")), message_model=model)
    consumer.set_namesrv_addr(opts["nameSrv"])
    topic, expression = opts["topic"], opts.get("expression", "*")
    ffi_check(dll.Subscribe(consumer._handle, topic.encode(), expression.encode()))
    consumer._register_callback(on_message)
    consumer.start()
    out({"event": "ready"})
    done.wait(opts.get("timeout", 30))
    consumer.shutdown()
    out({"event": "closed", "count": handled})
    return 0 if handled >= opts["count"] else 3


if __name__ == "__main__":
    mode, options = sys.argv[1], json.loads(sys.argv[2])
    sys.exit(produce(options) if mode == "produce" else consume(options))
