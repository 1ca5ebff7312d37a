"""NATS: the client protocol, server side (codec, events, subjects)."""
