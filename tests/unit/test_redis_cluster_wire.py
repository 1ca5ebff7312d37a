"""Routing the Redis store's writes on a Cluster: the slot of a key, and the slot map
read from CLUSTER SLOTS."""

from __future__ import annotations

from gateway.stores.redis_cluster_wire import SLOTS, ClusterWire, key_slot
from gateway.stores.redis_codec import topic_key


def test_key_slot_is_the_cluster_specification_s() -> None:
    # the examples of the Redis Cluster specification
    assert key_slot("123456789") == 12739  # CRC16-XMODEM 0x31C3
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers")
    assert key_slot("{user1000}.following") == key_slot("user1000")
    assert key_slot("foo{}{bar}") == key_slot(b"foo{}{bar}")  # an empty tag: the whole key
    assert key_slot("foo{}{bar}") != key_slot("bar")
    assert key_slot("foo{{bar}}zap") == key_slot("{bar")  # the tag ends at the first }
    assert key_slot("foo{bar}{zap}") == key_slot("bar")  # the first tag only
    assert all(0 <= key_slot(f"k{i}") < SLOTS for i in range(1000))


def test_every_key_of_a_topic_has_the_topic_s_slot() -> None:
    for topic in ("orders", "a.b#ephemeral", "{odd}", "ünï"):
        prefix = topic_key(topic)
        slots = {key_slot(prefix + suffix) for suffix in ("m", "n", "x", "r:work", "c:g")}
        assert slots == {key_slot(prefix)}


def test_the_slot_map_names_the_asked_node_where_a_master_s_host_is_empty() -> None:
    reply = [
        [0, 5460, [b"", 7000, b"id0"]],
        [5461, 10922, [b"127.0.0.2", 7001, b"id1"], [b"127.0.0.9", 7009, b"replica"]],
        [10923, 16383, [b"127.0.0.3", 7002, b"id2"]],
    ]
    slots = ClusterWire._map(reply, ("10.0.0.1", 7000))
    assert slots is not None
    assert slots[0] == slots[5460] == ("10.0.0.1", 7000)
    assert slots[5461] == slots[10922] == ("127.0.0.2", 7001)  # the master, not its replica
    assert slots[16383] == ("127.0.0.3", 7002)


def test_a_slot_map_with_a_slot_nobody_serves_is_no_map() -> None:
    reply = [[0, 5460, [b"127.0.0.1", 7000, b"id0"]], [5462, 16383, [b"127.0.0.1", 7001, b"i"]]]
    assert ClusterWire._map(reply, ("127.0.0.1", 7000)) is None
