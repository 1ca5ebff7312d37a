"""NATS client libraries (nats-py, nats.js) as test peers; see test_nats_clients.py."""
