"""The listeners' TLS contexts, made once from `tls_cert`/`tls_key` and `[tls]`, and
reloaded in place on SIGHUP.

Every context that shows the gateway's certificate is kept here, so a reload reaches all
of them: `load_cert_chain` on a live `SSLContext` changes what the next handshake sends,
while connections already up keep the session they negotiated. A reload that fails (a
file half-written by the tool that renews it) leaves the old certificate in place and
says why.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config_guard import TLSSettings

log = logging.getLogger("gateway")


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """A server-side context; an error names the file it is about."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(ctx, cert, key)
    return ctx


def _load(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    for setting, path in (("tls_cert", cert), ("tls_key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise OSError(f"{setting} {path}: {exc.strerror or exc}") from exc
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise OSError(
            f"tls_cert {cert} / tls_key {key}: not a usable certificate and key: {exc}"
        ) from exc


def require_client_certificates(ctx: ssl.SSLContext, client_ca: str) -> None:
    try:
        ctx.load_verify_locations(client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"tls client_ca {client_ca}: not a usable CA file: {exc}") from exc
    ctx.verify_mode = ssl.CERT_REQUIRED


@dataclass
class Certificates:
    """The certificate and key files, and every context that shows them."""

    cert: str
    key: str
    contexts: list[ssl.SSLContext] = field(default_factory=list)

    def server_context(self, client_ca: str | None = None) -> ssl.SSLContext:
        ctx = server_ssl_context(self.cert, self.key)
        if client_ca is not None:
            require_client_certificates(ctx, client_ca)
        self.contexts.append(ctx)
        return ctx

    def adopt(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        """A context made elsewhere (a route's client side) that shows the same pair."""
        self.contexts.append(ctx)
        return ctx

    def reload(self) -> bool:
        """Read the files again into every context; False (old ones kept) on error."""
        probe = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            _load(probe, self.cert, self.key)  # all or nothing: check before touching any
            for ctx in self.contexts:
                ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS reload failed, the previous certificate stays in use: %s", exc)
            return False
        log.info("TLS certificate reloaded from %s (%d contexts)", self.cert, len(self.contexts))
        return True


@dataclass
class ListenerContexts:
    """Every listener's server context, made from the shared `tls_cert`/`tls_key` pair or
    a `[tls.<listener>]` pair of its own, and every pair behind them: one SIGHUP reloads
    them all."""

    settings: TLSSettings
    shared: Certificates | None  # tls_cert and tls_key, when both are set
    own: list[Certificates] = field(default_factory=list)  # [tls.<listener>] pairs

    def context(
        self, name: str, *, verifies: bool = True, always_shared: bool = False
    ) -> ssl.SSLContext | None:
        """A listener's context: its own pair if it has one, else the shared one when
        `tls.listeners` names it, or when the listener is TLS and nothing else
        (`always_shared`). `verifies`: a client CA configured for it is required of
        clients (False where the protocol checks clients its own way)."""
        cert, key, ca = self.settings.for_listener(name)
        ca = ca if verifies else None
        if cert is not None and key is not None:
            own = Certificates(cert, key)
            self.own.append(own)
            return own.server_context(ca)
        if self.shared is not None and (name in self.settings.listeners or always_shared):
            return self.shared.server_context(ca)
        return None

    def reload(self) -> None:
        """SIGHUP: every pair read again into the contexts that show it."""
        for certs in [self.shared, *self.own]:
            if certs is not None:
                certs.reload()
