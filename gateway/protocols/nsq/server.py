"""What every NSQ connection of one gateway shares: broker, limits, TLS, auth, metrics."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.broker import Broker
from gateway.metrics import Metrics
from gateway.protocols.nsq.auth import AuthClient
from gateway.protocols.nsq.codec import Limits
from gateway.protocols.nsq.negotiation import ServerFeatures

if TYPE_CHECKING:
    from gateway.protocols.nsq.session import NSQSession

log = logging.getLogger("gateway.nsq")


@dataclass
class NSQServer:
    broker: Broker
    metrics: Metrics
    limits: Limits = field(default_factory=Limits)
    features: ServerFeatures = field(default_factory=ServerFeatures)
    ssl_context: ssl.SSLContext | None = None
    turn_budget: float = 0.00002  # seconds of commands per connection between yields
    tls_required: bool = False  # nsqd --tls-required: every command but IDENTIFY needs TLS
    auth: AuthClient | None = None
    max_req_timeout: int = 3600000  # ms; REQ is clamped to it
    max_msg_timeout: int = 900000  # ms; TOUCH never extends past delivery + this
    max_output_bytes: int = 4 * 1024 * 1024  # stop reading while this much waits to be sent
    hostname: str = "localhost"
    sessions: set[NSQSession] = field(default_factory=set)

    def report_bytes(self) -> None:
        """Sessions count their bytes in batches; a scrape wants them now."""
        for session in self.sessions:
            session.report_bytes()
