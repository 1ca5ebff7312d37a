"""TLS on the NATS client listener (as nats-server with a `tls` block, with and without
`tls_verify`) and on the HTTP listener (HTTPS, HTTP/2 by ALPN, mutual TLS), driven by
nats-py, nats.js and httpx; and a certificate reloaded on SIGHUP while a connection
made with the old one stays up."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
import trustme
from pydantic import ValidationError

from tests.clients import corpus
from tests.clients.nats import servers
from tests.helpers import read_until, running_gateway

pytestmark = pytest.mark.clients


def issue(ca: trustme.CA, directory: Path, name: str) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and localhost signed by `ca`: (cert file, key file)."""
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A CA, the server's certificate, and a client certificate from a second CA (the one
    the gateway is told to trust for clients)."""
    ca, client_ca = trustme.CA(), trustme.CA()
    cert, key = issue(ca, tmp_path, "server")
    client_cert, client_key = issue(client_ca, tmp_path, "client")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.pem"))
    return {
        "cert": cert, "key": key, "ca": str(tmp_path / "ca.pem"),
        "client_cert": client_cert, "client_key": client_key,
        "client_ca": str(tmp_path / "client-ca.pem"),
    }  # fmt: skip


async def raw_nats_over_tls(
    address: tuple[str, int], ca: str, cert: tuple[str, str] | None = None
) -> tuple[dict[str, object], trio.SSLStream[trio.SocketStream]]:
    """INFO in the clear, then the handshake, then CONNECT + PING over TLS."""
    tcp = await trio.open_tcp_stream(*address)
    info_line = await read_until(tcp, b"\r\n")
    info = json.loads(info_line[5:])
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    tls = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
    await tls.do_handshake()
    await tls.send_all(b'CONNECT {"verbose":false}\r\nPING\r\n')
    assert await read_until(tls, b"PONG\r\n") == b"PONG\r\n"
    return info, tls


@pytest.mark.parametrize(("publisher", "subscriber"), [("natspy", "natsjs"), ("natsjs", "natspy")])
async def test_nats_clients_over_tls(
    pki: dict[str, str], publisher: str, subscriber: str, tmp_path: Path
) -> None:
    bodies = corpus.make_bodies(200, seed=3, max_size=4000)
    path = tmp_path / "bodies.bin"
    corpus.write_bodies(path, bodies)
    tls_option = {"natspy": "--tls-ca", "natsjs": "--tlsca"}
    async with running_gateway(nats="127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"]) as gw:
        address = gw.addresses["nats"]
        info, _ = await raw_nats_over_tls(address, pki["ca"])
        assert info["tls_required"] is True and "tls_verify" not in info
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                sub = await servers.spawn(
                    nursery,
                    servers.command(subscriber, "sub", address, "--subject", "tls.data",
                                    "--count", len(bodies), tls_option[subscriber], pki["ca"]),
                )  # fmt: skip
                await sub.wait_ready()
                pub = await servers.run(
                    servers.command(publisher, "pub", address, "--subject", "tls.data",
                                    "--bodies", path, tls_option[publisher], pki["ca"]),
                )  # fmt: skip
                got = await sub.result()
        assert pub["async_errors"] == [] and got["async_errors"] == []
        assert [m[2] for m in got["messages"]] == [hashlib.sha256(b).hexdigest() for b in bodies]
        # a client that does not start TLS after INFO is closed, and counted
        plain = await trio.open_tcp_stream(*address)
        await read_until(plain, b"\r\n")
        await plain.send_all(b'CONNECT {"verbose":false}\r\nPING\r\n')
        with trio.fail_after(10):
            rest = b""
            while chunk := await plain.receive_some(4096):
                rest += chunk
        assert b"PONG" not in rest


async def test_nats_tls_verify_requires_a_client_certificate(pki: dict[str, str]) -> None:
    async with running_gateway(
        nats="127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"],
        tls_settings__client_ca=pki["client_ca"], tls_settings__verify=True,
    ) as gw:  # fmt: skip
        address = gw.addresses["nats"]
        info, _ = await raw_nats_over_tls(
            address, pki["ca"], (pki["client_cert"], pki["client_key"])
        )
        assert info["tls_required"] is True and info["tls_verify"] is True
        with pytest.raises(trio.BrokenResourceError):
            await raw_nats_over_tls(address, pki["ca"])  # no client certificate
        # nats-py with and without its certificate
        ok = await servers.run(
            servers.command("natspy", "pub", address, "--subject", "v", "--bodies",
                            _one_body(pki), "--tls-ca", pki["ca"], "--tls-cert",
                            pki["client_cert"], "--tls-key", pki["client_key"]),
        )  # fmt: skip
        assert ok["async_errors"] == [] and ok["published"] == 1
        js = await servers.run(
            servers.command("natsjs", "pub", address, "--subject", "v", "--bodies",
                            _one_body(pki), "--tlsca", pki["ca"], "--tlscert",
                            pki["client_cert"], "--tlskey", pki["client_key"]),
        )  # fmt: skip
        assert js["async_errors"] == [] and js["published"] == 1


def _one_body(pki: dict[str, str]) -> str:
    path = Path(pki["cert"]).parent / "one.bin"
    corpus.write_bodies(path, [b"one"])
    return str(path)


async def test_http_stays_plain_and_https_has_its_own_port(pki: dict[str, str]) -> None:
    """nsqd's split: a certificate does not change --http-address, which stays plain HTTP
    (every nsqd HTTP client, lookupd discovery and Prometheus keep working); HTTPS is
    served on --https-address. gnsq's own suite starts nsqd this way."""
    async with running_gateway(
        http="127.0.0.1:0", https="127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"]
    ) as gw:
        host, port = gw.addresses["http"]
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://{host}:{port}/ping")
            assert r.status_code == 200 and r.text == "OK"
        host, port = gw.addresses["https"]
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki["ca"])) as client:
            r = await client.get(f"https://{host}:{port}/ping")
            assert r.status_code == 200 and r.text == "OK"
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPError):  # no plain HTTP on the HTTPS port
                await client.get(f"http://{host}:{port}/ping")
    # no certificate: nothing listens for HTTPS, as nsqd without --tls-cert
    async with running_gateway(http="127.0.0.1:0", https="127.0.0.1:0") as gw:
        assert "https" not in gw.addresses and "http" in gw.addresses


async def test_https_with_http2_by_alpn_and_mutual_tls(pki: dict[str, str]) -> None:
    async with running_gateway(https="127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"]) as gw:
        host, port = gw.addresses["https"]
        async with httpx.AsyncClient(
            http2=True, verify=ssl.create_default_context(cafile=pki["ca"])
        ) as client:
            r = await client.get(f"https://{host}:{port}/ping")
            assert r.status_code == 200 and r.text == "OK"
            assert r.http_version == "HTTP/2"
        async with httpx.AsyncClient(
            http2=False, verify=ssl.create_default_context(cafile=pki["ca"])
        ) as client:
            r = await client.post(f"https://{host}:{port}/pub?topic=t", content=b"x")
            assert r.status_code == 200 and r.http_version == "HTTP/1.1"
    async with running_gateway(
        https="127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"],
        tls_settings__client_ca=pki["client_ca"], tls_settings__verify=True,
    ) as gw:  # fmt: skip
        host, port = gw.addresses["https"]
        with pytest.raises(httpx.HTTPError):
            async with httpx.AsyncClient(
                verify=ssl.create_default_context(cafile=pki["ca"])
            ) as client:
                await client.get(f"https://{host}:{port}/ping")
        ctx = ssl.create_default_context(cafile=pki["ca"])
        ctx.load_cert_chain(pki["client_cert"], pki["client_key"])
        async with httpx.AsyncClient(http2=True, verify=ctx) as client:
            r = await client.get(f"https://{host}:{port}/ping")
            assert r.status_code == 200 and r.http_version == "HTTP/2"


async def test_sighup_reloads_the_certificate(tmp_path: Path) -> None:
    """The files are replaced by a certificate from another CA and the process gets
    SIGHUP: a connection made before keeps working, a new one gets the new certificate
    (it verifies against the new CA only)."""
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert, key = issue(old_ca, tmp_path, "live")
    old_ca.cert_pem.write_to_path(str(tmp_path / "old-ca.pem"))
    new_ca.cert_pem.write_to_path(str(tmp_path / "new-ca.pem"))
    argv = [sys.executable, "-m", "gateway", "serve", "--store", "memory://",
            "--nsq", "off", "--beanstalk", "off", "--http", "off", "--nats-route", "off",
            "--rocketmq", "off",
            "--nats", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stderr is not None
        lines: list[str] = []

        def wait_for(pattern: str) -> re.Match[str]:
            while True:
                line = proc.stderr.readline()  # type: ignore[union-attr]
                assert line, f"the gateway exited: {''.join(lines)}"
                lines.append(line)
                if m := re.search(pattern, line):
                    return m

        with trio.fail_after(30):
            m = await trio.to_thread.run_sync(wait_for, r"protocol=nats address=127\.0\.0\.1:(\d+)")
        address = ("127.0.0.1", int(m.group(1)))
        _, before = await raw_nats_over_tls(address, str(tmp_path / "old-ca.pem"))
        new_cert, new_key = issue(new_ca, tmp_path, "next")
        Path(cert).write_bytes(Path(new_cert).read_bytes())
        Path(key).write_bytes(Path(new_key).read_bytes())
        proc.send_signal(signal.SIGHUP)
        with trio.fail_after(30):
            await trio.to_thread.run_sync(wait_for, "TLS certificate reloaded")
        _, after = await raw_nats_over_tls(address, str(tmp_path / "new-ca.pem"))
        with pytest.raises(trio.BrokenResourceError):
            await raw_nats_over_tls(address, str(tmp_path / "old-ca.pem"))
        # the connection made before the reload still works
        await before.send_all(b"PING\r\n")
        assert await read_until(before, b"PONG\r\n") == b"PONG\r\n"
        await after.send_all(b"PING\r\n")
        assert await read_until(after, b"PONG\r\n") == b"PONG\r\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        await trio.to_thread.run_sync(proc.wait)


async def test_beanstalkd_on_its_tls_port(pki: dict[str, str]) -> None:
    """beanstalkd inside TLS from the first byte, on a port of its own, sharing its tubes
    with the plain listener; a plain client on the TLS port is closed and counted."""
    async with running_gateway(
        beanstalk="127.0.0.1:0", beanstalk_tls="127.0.0.1:0",
        tls_cert=pki["cert"], tls_key=pki["key"],
    ) as gw:  # fmt: skip
        tcp = await trio.open_tcp_stream(*gw.addresses["beanstalk-tls"])
        tls = trio.SSLStream(
            tcp, ssl.create_default_context(cafile=pki["ca"]), server_hostname="127.0.0.1"
        )
        await tls.send_all(b"use secure\r\nput 0 0 60 6\r\nsecret\r\n")
        assert await read_until(tls, b"INSERTED 1\r\n") == b"USING secure\r\nINSERTED 1\r\n"
        plain = await trio.open_tcp_stream(*gw.addresses["beanstalk"])
        await plain.send_all(b"watch secure\r\nreserve-with-timeout 0\r\n")
        got = await read_until(plain, b"secret\r\n")
        assert got == b"WATCHING 2\r\nRESERVED 1 6\r\nsecret\r\n"
        wrong = await trio.open_tcp_stream(*gw.addresses["beanstalk-tls"])
        await wrong.send_all(b"stats\r\n")
        answer = b""
        with trio.fail_after(10):
            while chunk := await wrong.receive_some(4096):
                answer += chunk
        assert b"OK" not in answer  # no beanstalkd reply in the clear, then the close
    with pytest.raises(ValidationError, match="needs a certificate") as refused:
        async with running_gateway(beanstalk_tls="127.0.0.1:0"):
            pass
    # the setting it is about, for the line that names its source
    assert refused.value.errors()[0]["ctx"] == {"setting": "beanstalk_tls"}


async def test_a_listener_with_its_own_certificate(pki: dict[str, str], tmp_path: Path) -> None:
    """[tls.https] gives HTTPS a certificate of its own (another CA); NATS keeps the shared
    one; `verify` can differ per listener too. ([tls.http], its name from before HTTPS
    had its own port, is read as [tls.https].)"""
    other_ca = trustme.CA()
    http_cert, http_key = issue(other_ca, tmp_path, "http")
    other_ca.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    async with running_gateway(
        https="127.0.0.1:0", nats="127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"],
        tls_settings__http={"cert": http_cert, "key": http_key},
        tls_settings__client_ca=pki["client_ca"],
        tls_settings__nats={"verify": True},
    ) as gw:  # fmt: skip
        host, port = gw.addresses["https"]
        ctx = ssl.create_default_context(cafile=str(tmp_path / "other-ca.pem"))
        async with httpx.AsyncClient(http2=True, verify=ctx) as client:
            r = await client.get(f"https://{host}:{port}/ping")
            assert r.status_code == 200  # HTTPS shows the other CA's certificate, no client cert
        with pytest.raises(httpx.HTTPError):
            shared = ssl.create_default_context(cafile=pki["ca"])
            async with httpx.AsyncClient(verify=shared) as client:
                await client.get(f"https://{host}:{port}/ping")
        info, _ = await raw_nats_over_tls(
            gw.addresses["nats"], pki["ca"], (pki["client_cert"], pki["client_key"])
        )
        assert info["tls_verify"] is True  # NATS alone requires client certificates
