"""Whether a structurally sound snapshot fits this engine, checked before any of it is applied: the same
conversation and prefix tokens, the history SQLite holds, token ids of this vocabulary, K/V bytes of this
model's layout (8- and 4-bit saved blocks checked whole, without dequantizing). Vectors of another embedder are
dropped (recomputed when a decision needs them) and the task focus recomputed from the user's messages.
Invariant: only the decoded Snapshot is ever changed.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..kvcache import kvquant
from ..kvcache.blocks import BlockState
from ..memory.embedder import Embedder
from ..memory.scorer import TaskFocus
from ..memory.snapshot import Snapshot
from ..memory.snapshot_check import SnapshotError, check_blob, need
from ..runtime import reanchor
from ..settings import Settings
from ..store.history import MessageRow
from .turn import render_user_content


def expected_history(messages: Sequence[MessageRow]) -> list[tuple[str, str]]:
    """(role, content) of the template history a rebuild from `messages` produces (every live message)."""
    return [(m.role, m.text if m.role == "assistant" else render_user_content(m.text, m.attachments))
            for m in messages]


def _focus_texts(messages: Sequence[MessageRow]) -> list[str]:
    """The texts a rebuild feeds the task focus: at each reply, the input message last replayed before it."""
    texts, last_input = [], ""
    for message in messages:
        if message.role != "assistant":
            last_input = message.text
        elif last_input.strip():
            texts.append(last_input)
    return texts


def focus_from_history(messages: Sequence[MessageRow], embedder: Embedder, settings: Settings) -> list[float] | None:
    """The task focus a rebuild computes: the EMA over the replayed input messages' vectors."""
    texts = _focus_texts(messages)
    vectors = embedder.embed(texts) if texts else None
    if vectors is None:
        return None
    focus = TaskFocus(ema=settings.focus_ema, snap_cosine=settings.focus_snap_cosine)
    for vector in vectors:
        focus.update(vector)
    return None if focus.vector is None else [float(x) for x in focus.vector]


def _check_bytes(snapshot: Snapshot, n_layer: int, geometry: reanchor.RopeGeometry | None) -> None:
    blobs = [("image", snapshot.image)] if snapshot.image is not None else []
    blobs += [(f"K/V of {snapshot.blocks[i].name}", saved) for i, saved in sorted(snapshot.saved.items())]
    signatures = set()
    for what, (data, origin, n_tokens) in blobs:
        if kvquant.is_packed(data):              # an 8- or 4-bit block: checked whole, values not computed
            need(what != "image", "the slot image is packed (only saved blocks may be)")
            try:
                data = kvquant.skeleton(data)
            except kvquant.UnfitPacked as exc:
                raise SnapshotError(f"{what}: {exc}") from exc
        signature = check_blob(what, data, origin, n_tokens)
        need(signature[3] == n_layer, f"{what}: {signature[3]} layers, this model has {n_layer}")
        need(geometry is None or reanchor.parse(data, geometry) is not None,
             f"{what}: K rows not of this model's layout")
        signatures.add(signature)
    need(len(signatures) <= 1, "K/V bytes of different layouts in one snapshot")


def _adapt_vectors(snapshot: Snapshot, embedder: Embedder, messages: Sequence[MessageRow],
                   settings: Settings) -> list[str]:
    current = embedder.identity
    with_vectors = [b for b in snapshot.blocks if b.embedding is not None]
    if not with_vectors and snapshot.focus is None:
        return []
    if current is None:                                  # similarity is off: vectors are never read
        for block in with_vectors:
            block.embedding = None
        snapshot.focus = None
        return []
    notes = []
    if snapshot.embedder != current:
        stale = with_vectors
        notes.append(f"vectors of {snapshot.embedder or 'an unrecorded embedder'} dropped, "
                     f"recomputed with {current} when needed")
        snapshot.focus = None
        snapshot.lines = {}                              # line vectors of another embedder: embedded again
    elif embedder.warming:                               # its own vectors, from the same model: checked when
        stale = []                                       # they are read (a decision embeds what it lacks)
    else:
        dim = embedder.dimension()
        stale = [b for b in with_vectors if b.embedding.shape[0] != dim]
        snapshot.lines = {key: kept for key, kept in snapshot.lines.items() if kept[1].shape[1] == dim}
        if stale:
            notes.append(f"{len(stale)} vectors not {dim}-d dropped")
        if snapshot.focus is not None and len(snapshot.focus) != dim:
            snapshot.focus = None
            notes.append(f"focus not {dim}-d recomputed")
    for block in stale:
        block.embedding = None
    if snapshot.focus is None:
        snapshot.focus = focus_from_history(messages, embedder, settings)
    snapshot.embedder = current
    return notes


def fit_snapshot(snapshot: Snapshot, *, conversation_id: str, prefix_key: str, prefix_tokens: Sequence[int],
                 messages: Sequence[MessageRow], n_layer: int, n_vocab: int,
                 geometry: reanchor.RopeGeometry | None, embedder: Embedder, settings: Settings) -> list[str]:
    """SnapshotError when `snapshot` does not fit; else notes on what was adapted (for the event text)."""
    need(snapshot.conversation_id == conversation_id, "written for another conversation")
    need(snapshot.prefix_key == prefix_key, "the system prompt or tools changed since it was saved")
    shared = sorted((b for b in snapshot.blocks if b.shared and b.state is BlockState.RESIDENT), key=lambda b: b.pos)
    need([t for b in shared for t in b.tokens] == list(prefix_tokens), "its shared prefix is not this prefix")
    need(all(t < n_vocab for b in snapshot.blocks for t in b.tokens), "token ids outside this model's vocabulary")
    history = [(m["role"], m["content"]) for m in snapshot.history]
    need(history == expected_history(messages), "its history differs from the saved chat")
    _check_bytes(snapshot, n_layer, geometry)
    return _adapt_vectors(snapshot, embedder, messages, settings)
