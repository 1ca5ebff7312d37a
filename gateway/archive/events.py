"""The archive's event names (the `event` column), importable without pyarrow."""

PUBLISHED = "published"
DELIVERED = "delivered"
ACKNOWLEDGED = "acknowledged"  # NSQ FIN, beanstalkd delete of a reserved job
REQUEUED = "requeued"  # NSQ REQ, beanstalkd release
TIMED_OUT = "timed_out"
BURIED = "buried"
KICKED = "kicked"
DELETED = "deleted"  # a ready, delayed or buried message deleted (beanstalkd delete)
EVENTS = (PUBLISHED, DELIVERED, ACKNOWLEDGED, REQUEUED, TIMED_OUT, BURIED, KICKED, DELETED)
