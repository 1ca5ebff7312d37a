"""A group's finishes are merged while recorded and sent to Redis as runs of ids."""

from __future__ import annotations

from gateway.stores.redis import _on_wire, _runs


def test_consecutive_ids_are_one_run_and_a_lone_id_stays_itself() -> None:
    assert _runs([1, 2, 3, 7, 9, 10]) == [
        f"{1:016x}:{3:016x}",
        f"{7:016x}",
        f"{9:016x}:{10:016x}",
    ]


def test_a_merged_remove_goes_sorted_and_once_per_id() -> None:
    # finishes come in the order consumers send them, and may name an id twice
    op = ("gw_remove", "gw:{t}:", ["c", "", 5, 3, 4, 4, 0xFF])
    assert _on_wire(op) == ("gw_remove", "gw:{t}:", ["c", "", f"{3:016x}:{5:016x}", f"{255:016x}"])


def test_other_calls_go_as_recorded() -> None:
    op = ("gw_touch", "gw:{t}:", ["c", "gw1", "00000000000000ff", 1000])
    assert _on_wire(op) is op
