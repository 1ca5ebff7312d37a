"""gnsq 1.0.2's own test suite against the gateway: the nsqd and nsqlookupd stand-ins."""
