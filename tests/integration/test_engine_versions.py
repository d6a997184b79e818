"""Versions of a message and the undo of a delete: the chains on plain rows, then on the real embedded model
(an undone delete leaves the KV what a clean rebuild of the same history would give)."""

from __future__ import annotations

import pytest

from evoke_engine import EditError, Engine, Settings
from evoke_engine.conversations.versions import version_chains
from evoke_engine.store.history import DELETED, LIVE, SUPERSEDED, MessageRow
from integration.test_engine_editing import chat, probe_matches_clean_rebuild


def row(id_: int, status: str = LIVE, previous: int | None = None, role: str = "assistant") -> MessageRow:
    return MessageRow(id=id_, conversation_id="c", role=role, text=f"text {id_}", attachments=[], created_at=0.0,
                      status=status, previous_id=previous)


def test_a_chain_lists_the_versions_oldest_first_and_only_for_live_rows_that_replaced_others():
    rows = [row(1, role="user"), row(2, SUPERSEDED), row(3, SUPERSEDED, previous=2), row(4, previous=3),
            row(5, DELETED, previous=4), row(6, role="user")]
    chains = version_chains(rows)
    assert list(chains) == [4]
    assert [r.id for r in chains[4]] == [2, 3, 4]


def test_a_chain_survives_a_compacted_or_looping_history():
    assert [r.id for r in version_chains([row(3, SUPERSEDED, previous=99), row(4, previous=3)])[4]] == [3, 4]
    assert [r.id for r in version_chains([row(3, SUPERSEDED, previous=4), row(4, previous=3)])[4]] == [3, 4]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    settings = Settings(home=str(tmp_path_factory.mktemp("versions")), budget_tokens=2048, n_ctx=8192, slots=4,
                        embedder="off")
    with Engine(settings, scheduler=False) as eng:
        yield eng


def test_regenerated_replies_and_edited_messages_have_their_versions(engine):
    conv = chat(engine, ["Please read notes.txt.", "Name a color of the sky."])
    first = conv.messages()[-1]
    conv.regenerate(temperature=1.0, seed=1, max_tokens=8).result()
    conv.regenerate(temperature=1.0, seed=2, max_tokens=8).result()
    live = conv.messages()
    versions = conv.versions()
    assert list(versions) == [live[-1]["id"]]
    assert [v["text"] for v in versions[live[-1]["id"]]][0] == first["text"]
    assert [v["id"] for v in versions[live[-1]["id"]]][-1] == live[-1]["id"]
    assert len(versions[live[-1]["id"]]) == 3
    conv.edit(2, "Name a color of grass.", max_tokens=6, temperature=0).result()
    edited = conv.messages()[2]
    assert [v["text"] for v in conv.versions()[edited["id"]]] == ["Name a color of the sky.", "Name a color of grass."]
    conv.check()


def test_an_undone_delete_brings_the_message_back_and_the_kv_equals_a_clean_rebuild(engine):
    conv = chat(engine)
    before = conv.messages()
    conv.delete_message(2)
    assert [m["id"] for m in conv.messages()] == [m["id"] for m in before if m["id"] != before[2]["id"]]
    assert conv.undelete([before[2]["id"]]) == [before[2]["id"]]
    assert [(m["id"], m["text"]) for m in conv.messages()] == [(m["id"], m["text"]) for m in before]
    assert [m["role"] for m in conv.template_history()] == [m["role"] for m in before]
    probe_matches_clean_rebuild(engine, conv)
    with pytest.raises(EditError):
        conv.undelete([before[2]["id"]])                # live already: nothing to restore


def test_a_reply_refreshes_its_stats_snapshot_at_a_bounded_rate():
    from evoke_engine.conversations.live_stats import StatsTicker

    class Lifecycle:
        def __init__(self) -> None:
            self.refreshed = 0

        def refresh(self, _state) -> None:
            self.refreshed += 1

    now = [0.0]
    pieces: list[str] = []
    lifecycle = Lifecycle()
    ticker = StatsTicker(lifecycle, object(), pieces.append, interval_s=5, clock=lambda: now[0])
    for step in range(20):                          # 20 tokens, one a tick: every one forwarded, a snapshot per 5
        now[0] = step + 1
        ticker(f"t{step}")
    assert pieces == [f"t{i}" for i in range(20)]
    assert lifecycle.refreshed == ticker.refreshes == 4


def test_an_unload_says_idle_only_for_an_idle_unload(engine):
    events = []
    engine.subscribe(lambda e: events.append(e))
    engine.reload(engine.settings.replace()).result(timeout=120)
    engine.unload_model()
    said = [(e.message, (e.detail or {}).get("reason")) for e in events if e.kind == "model_unloaded"]
    assert said == [("model unloaded for the model change", "reload"),
                    ("model unloaded after idle; it comes back on the next message", "idle")]
    conv = engine.new_conversation()
    assert conv.send("Hi.", max_tokens=4, temperature=0)         # it comes back
