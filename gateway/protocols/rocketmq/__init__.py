"""RocketMQ: the 4.x remoting protocol, the gateway as nameserver and broker on one port.

Sans-IO: codec.py frames, header.py the JSON and binary headers, message.py the records,
batches and properties inside bodies, events.py what the codec hands a session,
mapping.py RocketMQ messages to and from the gateway's model. On Trio: server.py what
connections share (routes, group membership), feed.py a consumer group's queues and
offsets over a broker group, session.py one connection (produce.py sends and retries,
consume.py heartbeats, offsets and pulls).
"""
