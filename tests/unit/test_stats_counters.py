"""A conversation's stats snapshot carries every counter its memory keeps, under the counter's own name, from the one
declaration (`stats.Counters`); the snapshot stays frozen and a conversation not measured yet reads as zeros."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.rig import Rig

from evoke_engine.stats import ConversationStats, Counters

pytestmark = pytest.mark.unit

COUNTERS = [f.name for f in dataclasses.fields(Counters)]


def test_the_stats_snapshot_reports_every_counter_the_memory_keeps_under_its_name(tmp_path):
    rig = Rig(tmp_path)
    try:
        memory = rig.memory()
        for value, name in enumerate(COUNTERS, 1):
            setattr(memory.counters, name, value)
        stats = memory.stats()
    finally:
        rig.close()
    reported = stats.as_dict()
    assert [getattr(stats, name) for name in COUNTERS] == [reported[name] for name in COUNTERS] == \
        list(range(1, len(COUNTERS) + 1))
    assert "breadcrumbs" in COUNTERS and "reused_blocks" in COUNTERS      # counted before, never reported


def test_the_names_the_app_and_the_server_read_are_the_snapshots_fields_and_it_stays_frozen():
    stats = ConversationStats("c", active_tokens=40, evictions=3, recoveries=2, reused_tokens=16)
    read = ("conversation_id", "active_tokens", "budget_tokens", "cached_tokens", "prefix_tokens", "evictions",
            "recoveries", "evicted_tokens", "recovered_tokens", "identity_hits", "max_active_at_turn_end",
            "prefill_tokens", "reused_tokens", "turn", "memory", "recovery", "blocks", "events",
            "recovery_decisions", "reply_context", "turn_breakdown")
    assert set(read) <= set(stats.as_dict())
    assert (stats.evictions, stats.recoveries, stats.reused_tokens, stats.active_tokens) == (3, 2, 16, 40)
    assert ConversationStats("c").as_dict()["evicted_tokens"] == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.evictions = 4                                                  # type: ignore[misc]
    assert dataclasses.replace(stats, memory="disk").evictions == 3
