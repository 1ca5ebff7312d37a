"""A protocol-translating message gateway.

NSQ, beanstalkd and NATS clients publish to and consume from one set of queues kept by
the gateway itself (see README.md and docs/).
"""

__version__ = "0.1.0"
