"""`bench reuse`: a second conversation attaching the same ~2K-token file, its blocks spliced from the first
conversation's K/V (chunk index, exact: same system prompt) against decoding them, side by side in one run.

Invariants: one engine; the first conversation holds the file in its slot for the whole run; each trial opens a
fresh conversation with the same system prompt and the same attachment, with `chunk_reuse` on and off in turn
(the setting applies now), and releases it after; `ttft_s` is the turn's time to first token (`Reply.ttft_s`);
the greedy continuation (temperature 0) of the probe question is compared token by token between on and off.
The approximate rows: per seed a conversation whose first message differs (so only content hashes match) attaches
the file, decoded (reference) and spliced with and without repair; the share of greedy tokens equal to the
reference's over `max_tokens` is reported per arm. The endpoint rows: the same file re-sent through the OpenAI
endpoint in a new session each trial (client-side TTFT), after a first session sent it.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import tempfile
import time

from evoke_engine import Engine, Settings

from .paste import paste_text

log = logging.getLogger(__name__)

PROBE = "In one sentence, what does the first function in the file do?"


def file_of_tokens(engine: Engine, tokens: int, seed: int = 0) -> str:
    """A generated source file (code kind) of about `tokens` tokens."""
    size = tokens * 3
    while True:
        text = paste_text(seed * 4, size)
        n = len(engine.tokenize(text, special=False))
        if n >= tokens:
            return text
        size = int(size * tokens / max(n, 1)) + 64


def _share_equal(a: list[int], b: list[int], n: int) -> float:
    """The share of the first `n` greedy tokens equal position by position; past a reply's end its token is "ended",
    so two replies ending alike are equal there."""
    def padded(tokens: list[int]) -> list[int]:
        return (list(tokens) + [-1] * n)[:n]
    return sum(x == y for x, y in zip(padded(a), padded(b), strict=True)) / n


WORK = ("parser", "scheduler", "billing", "cache", "auth", "router", "exporter", "ledger", "metrics", "upload")


ENDPOINT_SYSTEM = "You are a coding assistant. Answer briefly."


def _stream(client, messages: list[dict], session: str, max_tokens: int) -> dict:
    """One streamed greedy request: client-side TTFT, the reply and its `evoke` figures."""
    started = time.perf_counter()
    ttft, reply, extra = None, "", {}
    stream = client.chat.completions.create(model="evoke", messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_headers={"X-Evoke-Session": session})
    for chunk in stream:
        if chunk.usage is not None:
            extra = (chunk.model_extra or {}).get("evoke") or {}
        for choice in chunk.choices:
            if choice.delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - started
                reply += choice.delta.content
    return {"ttft_s": round(ttft if ttft is not None else time.perf_counter() - started, 4), "reply": reply,
            "reused_tokens": extra.get("reused"), "decoded_tokens": extra.get("decoded"),
            "conversation_id": extra.get("conversation_id")}


def _endpoint(engine: Engine, name: str, text: str, trials: int, max_tokens: int) -> dict:
    """Through the OpenAI endpoint: a first session sends the file; each trial a new session (its own
    X-Evoke-Session) re-sends it with the probe, `chunk_reuse` on and off in turn; client-side TTFT."""
    import openai

    from evoke_engine.server import EndpointServer, ServerConfig

    def user(question: str) -> dict:
        return {"role": "user", "content": f"[file {name}]\n{text.rstrip()}\n[end of file {name}]\n\n{question}"}

    system = {"role": "system", "content": ENDPOINT_SYSTEM}
    rows: dict[bool, list[dict]] = {True: [], False: []}
    with EndpointServer(engine, ServerConfig(port=0), lifetime_s=3600) as server:
        client = openai.OpenAI(base_url=server.address, api_key="bench", max_retries=0, timeout=600)
        _stream(client, [system, user("Here is the file I work on today.")], f"first-{time.time_ns()}", 8)
        for trial in range(trials):
            for reuse in ((True, False) if trial % 2 == 0 else (False, True)):
                engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=reuse))
                rows[reuse].append(_stream(client, [system, user(PROBE)], f"trial-{trial}-{reuse}-{time.time_ns()}",
                                           max_tokens))
                engine.release_conversation(rows[reuse][-1]["conversation_id"], persist=False)   # its slot is free
                log.info("endpoint trial %d reuse %s: ttft %.3f s, reused %s", trial, reuse,
                         rows[reuse][-1]["ttft_s"], rows[reuse][-1]["reused_tokens"])
    med = {r: {k: statistics.median(row[k] for row in rows[r]) for k in ("ttft_s", "reused_tokens", "decoded_tokens")}
           for r in (True, False)}
    replies = [row["reply"] for r in (True, False) for row in rows[r]]
    return {"reuse_on": med[True], "reuse_off": med[False],
            "ttft_speedup": round(med[False]["ttft_s"] / med[True]["ttft_s"], 1),
            "greedy_identical": all(reply == replies[0] for reply in replies), "reply": replies[0],
            "raw": {"reuse_on": [dict(row, reply=None) for row in rows[True]],
                    "reuse_off": [dict(row, reply=None) for row in rows[False]]}}


def _approximate(engine: Engine, attachment: list, seeds: int, max_tokens: int, repairs: tuple[int, ...]) -> dict:
    """Per seed: a first message of its own, then the file and the probe, decoded and spliced (per repair)."""
    arms = {"decoded": None, **{f"repair_{r}": r for r in repairs}}
    per_arm: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in range(seeds):
        opening = f"Note {seed}: today I am working on the {WORK[seed % len(WORK)]} module, part {seed * 7 % 13}."
        tokens: dict[str, list[int]] = {}
        for arm, repair in arms.items():
            engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=repair is not None,
                                                      chunk_reuse_approximate=repair is not None,
                                                      chunk_reuse_repair_tokens=repair or 0))
            conv = engine.new_conversation()
            conv.submit(opening, max_tokens=8).result()
            reply = conv.submit(PROBE, attachment, max_tokens=max_tokens).result()
            engine.release_conversation(conv.id, persist=False)
            tokens[arm] = engine.tokenize(reply.text, special=False)
            per_arm[arm].append({"seed": seed, "ttft_s": round(reply.ttft_s, 4), "reused_tokens": reply.reused_tokens,
                                 "decoded_tokens": reply.prefill_tokens,
                                 "equal_share": _share_equal(tokens[arm], tokens["decoded"], max_tokens)})
        log.info("seed %d: %s", seed, {arm: rows[-1]["equal_share"] for arm, rows in per_arm.items()})
    engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=True, chunk_reuse_approximate=False,
                                              chunk_reuse_repair_tokens=16))
    return {arm: {"equal_share_mean": round(statistics.mean(r["equal_share"] for r in rows), 3),
                  "identical_replies": sum(r["equal_share"] == 1.0 for r in rows),
                  "ttft_s_median": statistics.median(r["ttft_s"] for r in rows),
                  "reused_tokens_median": statistics.median(r["reused_tokens"] for r in rows), "seeds": rows}
            for arm, rows in per_arm.items()}


def run(*, file_tokens: int = 2000, trials: int = 5, max_tokens: int = 32, threads: int = 0, seeds: int = 10,
        repairs: tuple[int, ...] = (0, 16), endpoint: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="evoke-reuse-") as home:
        settings = Settings(home=home, temperature=0.0, n_threads=threads, n_ctx=32768, slots=4,
                            budget_tokens=6144, embedder="off")
        with Engine(settings, scheduler=False) as engine:
            attachment = [("service.py", file_of_tokens(engine, file_tokens))]
            first = engine.new_conversation()
            first.submit("Here is the file I work on today.", attachment, max_tokens=8).result()
            decoded = first.stats().prefill_tokens
            rows: dict[bool, list[dict]] = {True: [], False: []}
            texts: dict[bool, list[str]] = {True: [], False: []}
            for trial in range(trials):
                for reuse in ((True, False) if trial % 2 == 0 else (False, True)):
                    engine.apply_settings(dataclasses.replace(engine.settings, chunk_reuse=reuse))
                    second = engine.new_conversation()
                    reply = second.submit(PROBE, attachment, max_tokens=max_tokens).result()
                    stats = second.stats()
                    rows[reuse].append({"ttft_s": round(reply.ttft_s, 4), "reused_tokens": reply.reused_tokens,
                                        "decoded_tokens": stats.prefill_tokens})
                    texts[reuse].append(reply.text)
                    engine.release_conversation(second.id, persist=False)
                    log.info("trial %d reuse %s: ttft %.3f s, reused %d", trial, reuse, reply.ttft_s,
                             reply.reused_tokens)
            on, off = (engine.tokenize(texts[r][0], special=False) for r in (True, False))
            approximate = _approximate(engine, attachment, seeds, max_tokens, repairs) if seeds else {}
            through_endpoint = _endpoint(engine, *attachment[0], trials, max_tokens) if endpoint else {}
    med = {r: {k: statistics.median(row[k] for row in rows[r]) for k in rows[r][0]} for r in (True, False)}
    return {"bench": "reuse", "file_tokens": file_tokens, "first_conversation_decoded": decoded,
            "trials": trials, "max_tokens": max_tokens,
            "exact": {"reuse_on": med[True], "reuse_off": med[False],
                      "ttft_speedup": round(med[False]["ttft_s"] / med[True]["ttft_s"], 1),
                      "greedy_identical": all(t == texts[False][0] for t in (*texts[True], *texts[False])),
                      "greedy_token_share": _share_equal(on, off, max_tokens),
                      "reply_on": texts[True][0], "reply_off": texts[False][0]},
            "approximate": approximate, "endpoint": through_endpoint,
            "raw": {"reuse_on": rows[True], "reuse_off": rows[False]}}
