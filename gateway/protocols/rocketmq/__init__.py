"""RocketMQ: the 4.x remoting protocol (codec; nameserver and broker emulation to come).

codec.py frames, header.py the JSON and binary headers, message.py the records, batches
and properties inside bodies, events.py what the codec hands a session. All sans-IO.
"""
