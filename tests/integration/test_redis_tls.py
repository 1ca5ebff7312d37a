"""`--store rediss://...`: gateways sharing a real redis-server over TLS.

The redis-server listens with TLS only for the gateways (its plain port is the fixture's,
for `redis-cli`); the certificates come from trustme. The gateways trust the test CA
through `ssl_ca_certs`, and present a client certificate where the server asks for one
(`tls-auth-clients yes`). A CA that did not sign the server's certificate is a clear
start-up error, not a traceback. Every wait is on a reply, bounded by a timeout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trustme

from gateway.stores.redis_cluster_wire import key_slot
from tests.helpers import RawBeanstalk
from tests.integration.test_durability import REPO, start_gateway, supervised
from tests.redis_server import RedisCluster, RedisServer, free_port


class TLSRedis:
    def __init__(self, root: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        server = self.ca.issue_cert("127.0.0.1")
        cert, key = root / "redis.pem", root / "redis.key"
        server.cert_chain_pems[0].write_to_path(str(cert))
        server.private_key_pem.write_to_path(str(key))
        client = self.ca.issue_cert("gateway")
        self.client_cert, self.client_key = root / "gateway.pem", root / "gateway.key"
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))
        self.tls_port = free_port()
        tls = ("--tls-port", str(self.tls_port), "--tls-cert-file", str(cert))
        tls += ("--tls-key-file", str(key), "--tls-ca-cert-file", str(self.ca_file))
        self.server = RedisServer(root / "data", extra=(*tls, "--tls-auth-clients", "yes"))

    def url(self, **options: Path | str) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"rediss://127.0.0.1:{self.tls_port}/0" + (f"?{query}" if query else "")

    @property
    def trusted(self) -> str:
        return self.url(
            ssl_ca_certs=self.ca_file, ssl_certfile=self.client_cert, ssl_keyfile=self.client_key
        )


@pytest.fixture(scope="module")
def redis_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSRedis]:
    tls = TLSRedis(Path(tmp_path_factory.mktemp("redis-tls")))
    tls.server.start()
    yield tls
    tls.server.stop()


async def test_two_gateways_share_a_tube_over_tls(redis_tls: TLSRedis, tmp_path: Path) -> None:
    redis_tls.server.cli("FLUSHALL")
    async with supervised() as sup:
        a = await start_gateway(sup, tmp_path / "a", "--store", redis_tls.trusted)
        b = await start_gateway(sup, tmp_path / "b", "--store", redis_tls.trusted)
        producer = await RawBeanstalk.connect(a)  # type: ignore[arg-type]
        worker = await RawBeanstalk.connect(b)  # type: ignore[arg-type]
        try:
            assert await producer.call(b"use tls-jobs\r\n") == b"USING tls-jobs\r\n"
            reply = await producer.call(b"put 5 0 60 13\r\nover TLS, too\r\n")
            assert reply.startswith(b"INSERTED ")
            job_id = int(reply.split()[1])
            assert await worker.call(b"watch tls-jobs\r\n") == b"WATCHING 2\r\n"
            reply = await worker.call(b"reserve-with-timeout 10\r\n", timeout=15)
            assert reply == b"RESERVED %d 13\r\nover TLS, too\r\n" % job_id
            assert await worker.call(b"delete %d\r\n" % job_id) == b"DELETED\r\n"
        finally:
            await producer.aclose()
            await worker.aclose()
    # the data went through the TLS port into the same server
    assert "tls-jobs" in redis_tls.server.cli("KEYS", "*tls-jobs*")


async def serve_once(store: str, tmp: Path) -> tuple[int, str]:
    argv = [sys.executable, "-m", "gateway", "serve", "--store", store, "--store-wait", "0"]
    argv += ["--data-dir", str(tmp), "--nsq", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    argv += ["--beanstalk", "off", "--nats", "off", "--nats-route", "off", "--rocketmq", "off"]
    with trio.fail_after(30):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False, cwd=REPO
        )
    return done.returncode, done.stderr.decode()


async def test_a_server_certificate_the_ca_did_not_sign_is_one_error_line(
    redis_tls: TLSRedis, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    code, err = await serve_once(redis_tls.url(ssl_ca_certs=other), tmp_path)
    assert code != 0
    assert f"Redis at 127.0.0.1:{redis_tls.tls_port}" in err, err
    assert "certificate" in err.lower(), err
    assert "Traceback" not in err, err


async def test_a_missing_ca_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    code, err = await serve_once("rediss://127.0.0.1:1/0?ssl_ca_certs=/no/such/ca.pem", tmp_path)
    assert code != 0
    assert "ssl_ca_certs file '/no/such/ca.pem'" in err, err
    assert "Traceback" not in err, err


async def test_two_gateways_share_a_tube_on_a_redis_cluster_over_tls(tmp_path: Path) -> None:
    """`rediss+cluster://`: three masters with TLS on their client ports and their bus
    (`tls-cluster yes`, so CLUSTER SLOTS names their TLS ports to a TLS client); the
    gateways write to each master over TLS, checking its certificate."""
    (tmp_path / "tls").mkdir()
    tls = TLSRedis(tmp_path / "tls")  # the CA and the server's certificate, for every node
    ports = [free_port() for _ in range(3)]
    certs = ("--tls-cert-file", str(tmp_path / "tls" / "redis.pem"))
    certs += ("--tls-key-file", str(tmp_path / "tls" / "redis.key"))
    certs += ("--tls-ca-cert-file", str(tls.ca_file), "--tls-auth-clients", "no")
    cluster = RedisCluster(
        tmp_path / "cluster",
        extra=lambda i: ("--tls-port", str(ports[i]), "--tls-cluster", "yes", *certs),
    ).start()
    url = f"rediss+cluster://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}?ssl_ca_certs={tls.ca_file}"
    try:
        async with supervised() as sup:
            a = await start_gateway(sup, tmp_path / "a", "--store", url)
            b = await start_gateway(sup, tmp_path / "b", "--store", url)
            producer = await RawBeanstalk.connect(a)  # type: ignore[arg-type]
            worker = await RawBeanstalk.connect(b)  # type: ignore[arg-type]
            try:
                assert await worker.call(b"watch tls-jobs\r\n") == b"WATCHING 2\r\n"
                assert await producer.call(b"use tls-jobs\r\n") == b"USING tls-jobs\r\n"
                ids = []
                for i in range(50):
                    reply = await producer.call(b"put 5 0 60 7\r\njob-%03d\r\n" % i)
                    assert reply.startswith(b"INSERTED ")
                    ids.append(int(reply.split()[1]))
                got = []
                for _ in ids:
                    reply = await worker.call(b"reserve-with-timeout 10\r\n", timeout=15)
                    assert reply.startswith(b"RESERVED ")
                    job_id = int(reply.split()[1])
                    got.append(reply.split(b"\r\n")[1])
                    assert await worker.call(b"delete %d\r\n" % job_id) == b"DELETED\r\n"
            finally:
                await producer.aclose()
                await worker.aclose()
        assert got == [b"job-%03d" % i for i in range(50)]
        # the tube's keys are on the master of its slot alone, written there over TLS
        owner = cluster.owner(key_slot("tls-jobs"))
        for node in cluster.nodes:
            keys = node.cli("KEYS", "gw:{tls-jobs}:*").split()
            assert bool(keys) == (node is owner), (node.port, keys)
    finally:
        cluster.stop()
