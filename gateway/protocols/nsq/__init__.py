"""NSQ: the nsqd TCP protocol V2 (codec, session, listener)."""
