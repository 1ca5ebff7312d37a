"""`--store` URLs of the Redis store: what they name, and one clear error for each mistake."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from gateway.stores.redis_url import RedisURLError, parse_redis_url


def test_a_plain_url_names_host_port_database_and_credentials() -> None:
    target = parse_redis_url("redis://app:s%40cret@redis.internal:6380/3")
    assert target.nodes == (("redis.internal", 6380),)
    assert (target.db, target.username, target.password) == (3, "app", "s@cret")
    assert not target.tls and target.ssl_context() is None
    assert target.address == "redis.internal:6380"  # for log lines: no credentials


def test_cluster_urls_take_several_nodes() -> None:
    target = parse_redis_url("redis+cluster://10.0.0.1:7000,10.0.0.2")
    assert target.cluster and target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379))


def test_rediss_trusts_the_named_ca_and_checks_the_host(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    target = parse_redis_url(f"rediss://127.0.0.1:6380/0?ssl_ca_certs={ca_file}")
    context = target.ssl_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert len(context.get_ca_certs()) == 1  # the named CA, not the system's
    loose = parse_redis_url("rediss://127.0.0.1:6380/0?ssl_cert_reqs=none").ssl_context()
    assert loose is not None and loose.verify_mode == ssl.CERT_NONE and not loose.check_hostname


def test_a_client_certificate_is_loaded(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("gateway")
    chain, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    target = parse_redis_url(f"rediss://h:1/0?ssl_certfile={chain}&ssl_keyfile={key}")
    assert target.ssl_context() is not None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://h:1/0", "unsupported URL"),
        ("redis://h:99999/0", "bad host:port"),
        ("redis://a:1,b:2/0", "only redis+cluster:// takes a list"),
        ("redis://h:1/zero", "bad database"),
        ("redis://h:1/0?shared=maybe", "bad shared"),
        ("redis://h:1/0?pool=4", "unknown option 'pool'"),
        ("redis://h:1/0?ssl_cert_reqs=none", "TLS options need rediss://"),
        ("rediss://h:1/0?ssl_cert_reqs=sometimes", "bad ssl_cert_reqs='sometimes'"),
        ("rediss://h:1/0?ssl_ca_certs=/no/such/ca.pem", "ssl_ca_certs file '/no/such/ca.pem'"),
    ],
)
def test_a_mistake_is_one_error_naming_it(url: str, says: str) -> None:
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url(url)
    assert says in str(caught.value)


def test_a_file_that_is_no_certificate_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(RedisURLError, match="TLS settings of"):
        parse_redis_url(f"rediss://h:1/0?ssl_ca_certs={junk}")


def test_errors_do_not_repeat_the_password() -> None:
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url("redis://app:hunter2@h:1/zero")
    assert "hunter2" not in str(caught.value)
    assert "redis://app:***@h:1/zero" in str(caught.value)
