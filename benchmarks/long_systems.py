"""`bench long`'s systems: Evoke, llama-server and llama-cpp-python, each driving one conversation turn by turn and
returning one row per turn (first token, decode speed, context, memory), measured where the system runs.

Invariants: every system gets the same messages (files rendered as the engine renders them) and writes exactly
`reply_tokens` greedy tokens per turn, end-of-generation tokens banned; a reply's own text goes back into that
system's history; first-token and decode times are taken the same way everywhere (from the request to the first
streamed piece, then first to last piece); a llama-server that cannot take the whole history gets the longest
tail of whole exchanges that fits, dropped half a context at a time as its context shift drops (this server
refuses a prompt over its context), and a planted fact counts as in context only while its message is in that
tail. Memory figures come from /proc (no psutil here).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from evoke_engine.conversations.turn import render_user_content
from evoke_engine.engine import Engine
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.settings import Settings

from .llama_server import LlamaServer

SYSTEM = "You are a careful coding assistant. Answer briefly."
MESSAGE_FRAME_TOKENS = 5        # <|im_start|>role\n ... <|im_end|>\n around a message's content (ChatML)


def rss(pid: int | str = "self") -> dict[str, int]:
    """Resident set of a process in bytes: all, anonymous (heap, KV buffers, pool) and file-backed (the model)."""
    fields = {"VmRSS": "rss_bytes", "RssAnon": "rss_anon_bytes", "RssFile": "rss_file_bytes"}
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in fields:
                out[fields[key]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _decode_rate(n_tokens: int, piece_times: list[float]) -> float | None:
    """Tokens per second after the first streamed piece (None with fewer than two tokens or no time between)."""
    if n_tokens < 2 or not piece_times or piece_times[-1] <= piece_times[0]:
        return None
    return (n_tokens - 1) / (piece_times[-1] - piece_times[0])


class EvokeLong:
    """One Evoke engine, one conversation, at a token budget and a RAM budget for saved blocks."""

    def __init__(self, budget: int, threads: int, ram_budget_bytes: int | None = None, kv_cache_type: str = "f16",
                 pool_bits: int = 16) -> None:
        options = {} if ram_budget_bytes is None else {"ram_budget_bytes": ram_budget_bytes}
        self.settings = Settings(home=tempfile.mkdtemp(prefix="evoke-long-"), budget_tokens=budget, n_ctx=4 * budget,
                                 slots=2, n_threads=threads, recovery="kv_restore", system_prompt=SYSTEM,
                                 tools_enabled=False, kv_cache_type=kv_cache_type, pool_bits=pool_bits, **options)
        self.engine = Engine(self.settings, scheduler=False)
        self.engine.wait_idle()
        self.engine.diagnostics().embedder.warm()
        self.conv = self.engine.new_conversation(system_prompt=SYSTEM, tools=[])
        self.recovered_from_disk = 0

    def describe(self) -> dict:
        info = self.engine.model_info()
        return {"kind": "evoke", "budget_tokens": self.settings.budget_tokens, "n_ctx": info.n_ctx,
                "contexts": info.contexts, "flash_attention": info.flash_attention,
                "kv_cache_type": info.kv_cache_type, "raw_kv_bytes_per_token": info.kv_bytes_per_token,
                "model_bytes": info.size_bytes, "ram_budget_bytes": self.engine.diagnostics().pool.ram_budget_bytes,
                "pool_bits": self.engine.diagnostics().pool.bits, "threads": self.settings.n_threads,
                "n_ctx_train": info.n_ctx_train, "architecture": info.architecture}

    def turn(self, turn: dict) -> dict:
        before = {b["name"]: b["state"] for b in self.conv.stats().blocks}
        times: list[float] = []
        start = time.perf_counter()
        reply = self.conv.submit(turn["text"], [tuple(a) for a in turn["attachments"]],
                                 on_token=lambda _: times.append(time.perf_counter()), max_tokens=turn["reply_tokens"],
                                 temperature=0, repeat_penalty=1.0, ignore_eos=True).result()
        stats = self.conv.stats()
        from_disk = sum(before.get(name) == "disk" for name in reply.recovered)
        self.recovered_from_disk += from_disk
        tokens_by_state: dict[str, int] = {}
        for block in stats.blocks:
            tokens_by_state[block["state"]] = tokens_by_state.get(block["state"], 0) + block["tokens"]
        saved = self.engine.diagnostics().pool
        pool = self.engine.thread.call(lambda: (saved.ram_bytes, saved.spill_bytes))
        row = {"ttft_s": (times[0] - start) if times else None, "engine_ttft_s": reply.ttft_s,
               "decode_tok_s": _decode_rate(reply.n_tokens, times),
               "reply_tokens": reply.n_tokens, "stopped": reply.stopped, "prefill_tokens": reply.prefill_tokens,
               "decoded_tokens": reply.prefill_tokens + reply.n_tokens, "active_tokens": stats.active_tokens,
               "conversation_tokens": sum(tokens_by_state.values()),
               "ram_tokens": tokens_by_state.get("ram", 0), "disk_tokens": tokens_by_state.get("disk", 0),
               "dropped_tokens": tokens_by_state.get("dropped", 0), "pool_ram_bytes": pool[0], "spill_bytes": pool[1],
               "evictions": stats.evictions, "recoveries": stats.recoveries, "recovered_blocks": len(reply.recovered),
               "recovered_from_disk": from_disk, **rss()}
        if turn.get("fact_value"):
            row.update(self._fact_at_probe(turn["fact_value"], reply.recovered))
        return row

    def _fact_at_probe(self, value: str, recovered: list[str]) -> dict:
        """Whether the blocks holding `value` were in context for the reply (resident after it, or brought back
        for it); a value split between two blocks needs both."""
        blocks = self.conv.blocks(with_text=True)
        own = [b["name"] for b in blocks if b["role"] in ("file", "user") and value in b["text"]]
        need_all = False
        if not own:
            own = next(([a["name"], b["name"]] for a, b in zip(blocks, blocks[1:], strict=False)
                        if a["role"] in ("file", "user") and value in a["text"] + b["text"]), [])
            need_all = True
        states = {b["name"]: b["state"] for b in blocks}
        present = [states.get(n) == "resident" or n in recovered for n in own]
        return {"fact_in_context": bool(present) and (all(present) if need_all else any(present)),
                "fact_blocks": own}

    def accounting(self) -> dict:
        """Bytes the pool holds per token it holds, in RAM and on disk, against the cache type's raw K/V bytes."""
        def read() -> dict:
            pool = self.engine.diagnostics().pool
            ram = [(b, pool.nbytes(b)) for b in pool_blocks(pool, BlockState.RAM)]
            disk = [(b, pool.nbytes(b)) for b in pool_blocks(pool, BlockState.DISK)]
            return {"ram_blocks": len(ram), "ram_tokens": sum(b.n_tokens for b, _ in ram),
                    "ram_bytes": pool.ram_bytes, "disk_blocks": len(disk),
                    "disk_tokens": sum(b.n_tokens for b, _ in disk), "spill_bytes": pool.spill_bytes,
                    "spill_files_bytes": pool.disk_bytes(), "spills": pool.spills, "drops": pool.drops}
        out = self.engine.thread.call(read)
        raw = self.engine.model_info().kv_bytes_per_token
        out["raw_kv_bytes_per_token"] = raw
        out["ram_bytes_per_token"] = round(out["ram_bytes"] / out["ram_tokens"], 1) if out["ram_tokens"] else None
        out["disk_bytes_per_token"] = (round(out["spill_bytes"] / out["disk_tokens"], 1)
                                       if out["disk_tokens"] else None)
        for where in ("ram", "disk"):
            per = out[f"{where}_bytes_per_token"]
            out[f"{where}_over_raw"] = round(per / raw, 4) if per else None
        out["recovered_from_disk"] = self.recovered_from_disk
        return out

    def close(self) -> None:
        self.engine.close()


def pool_blocks(pool: SavedPool, where: BlockState) -> list[Block]:
    """The blocks the pool holds in RAM or on disk (slot images excluded)."""
    return [block for block in pool.held(where) if block.role != "image"]


class ServerLong:
    """llama-server with one slot; `window` True: a client that drops the oldest exchanges when the context is full."""

    def __init__(self, binary: str, n_ctx: int, threads: int, args: list[str], window: bool) -> None:
        self.server = LlamaServer(binary, n_ctx=n_ctx, threads=threads, args=["-np", "1", *args]).__enter__()
        self.n_ctx, self.window = n_ctx, window
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM}]
        self.tokens: list[int] = [self._count(SYSTEM)]       # per message, frame included
        self.start = 1                                       # first message the window keeps
        self.planted_at: dict[str, int] = {}                 # fact value -> index of its message
        self.dropped_exchanges = 0

    def describe(self) -> dict:
        return {"kind": "llama-server", "n_ctx": self.n_ctx, "window": self.window, "args": self.server.args}

    def _count(self, text: str) -> int:
        status, body = self.server._request("POST", "/tokenize", {"content": text})    # noqa: SLF001
        if status != 200:
            raise RuntimeError(f"/tokenize answered {status}")
        return len(body["tokens"]) + MESSAGE_FRAME_TOKENS

    def _fit(self, user_tokens: int, reply_tokens: int) -> None:
        """Drop the oldest whole exchanges until the prompt and the reply fit; past the context, half the
        window goes at once (llama-server's context shift discards half of what is not kept)."""
        room = self.n_ctx - 16 - reply_tokens - MESSAGE_FRAME_TOKENS
        used = lambda: self.tokens[0] + sum(self.tokens[self.start:]) + user_tokens  # noqa: E731
        if used() <= room:
            return
        goal = min(room, self.tokens[0] + user_tokens + sum(self.tokens[self.start:]) // 2)
        while used() > goal and self.start + 1 < len(self.messages):
            self.start += 2
            self.dropped_exchanges += 1

    def turn(self, turn: dict) -> dict:
        content = render_user_content(turn["text"], [tuple(a) for a in turn["attachments"]])
        user_tokens = self._count(content)
        if self.window:
            self._fit(user_tokens, turn["reply_tokens"])
        for value in turn.get("planted", []):
            self.planted_at[value] = len(self.messages)
        body = {"messages": [self.messages[0], *self.messages[self.start:], {"role": "user", "content": content}],
                "max_tokens": turn["reply_tokens"], "temperature": 0, "stream": True, "cache_prompt": True,
                "ignore_eos": True, "id_slot": 0, "stream_options": {"include_usage": True}}
        result = self.server.stream(body)
        times = result["piece_times"]
        self.messages += [{"role": "user", "content": content}, {"role": "assistant", "content": result["text"]}]
        self.tokens += [user_tokens, self._count(result["text"])]
        timings, usage = result["timings"], result["usage"]
        n = usage.get("completion_tokens") or timings.get("predicted_n") or len(times)
        row = {"ttft_s": result["ttft_s"],
               "decode_tok_s": _decode_rate(n, times),
               "server_decode_tok_s": timings.get("predicted_per_second"),
               "reply_tokens": usage.get("completion_tokens", timings.get("predicted_n")),
               "prefill_tokens": timings.get("prompt_n"),
               "decoded_tokens": (timings.get("prompt_n") or 0) + (timings.get("predicted_n") or 0),
               "active_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0),
               "conversation_tokens": sum(self.tokens), "dropped_exchanges": self.dropped_exchanges,
               **rss(self.server.proc.pid)}
        if turn.get("fact_value"):
            row["fact_in_context"] = self.planted_at.get(turn["fact_value"], -1) >= self.start
        return row

    def close(self) -> None:
        self.server.__exit__(None, None, None)


class LlamaCppPythonLong:
    """llama-cpp-python's `Llama` with a context for the whole conversation (it reuses its last prompt's prefix)."""

    def __init__(self, n_ctx: int, threads: int, n_batch: int) -> None:
        import llama_cpp as ll

        from .conversations import comparator_llama

        self.llm = comparator_llama(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=n_batch)
        vocab = ll.llama_model_get_vocab(self.llm.model)
        self.banned = {t: float("-inf") for t in range(self.llm.n_vocab()) if ll.llama_vocab_is_eog(vocab, t)}
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM}]
        self.n_ctx = n_ctx

    def describe(self) -> dict:
        return {"kind": "llama-cpp-python", "n_ctx": self.n_ctx}

    def turn(self, turn: dict) -> dict:
        content = render_user_content(turn["text"], [tuple(a) for a in turn["attachments"]])
        self.messages.append({"role": "user", "content": content})
        before = list(self.llm._input_ids)                  # noqa: SLF001 - its prompt cache, read only
        times, pieces, finish = [], [], None
        start = time.perf_counter()
        for chunk in self.llm.create_chat_completion(messages=self.messages, max_tokens=turn["reply_tokens"],
                                                     temperature=0, repeat_penalty=1.0, stream=True,
                                                     logit_bias=self.banned):
            choice = chunk["choices"][0]
            finish = choice.get("finish_reason") or finish
            if choice["delta"].get("content"):
                times.append(time.perf_counter())
                pieces.append(choice["delta"]["content"])
        after = list(self.llm._input_ids)                   # noqa: SLF001
        common = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
                      min(len(before), len(after)))
        self.messages.append({"role": "assistant", "content": "".join(pieces)})
        n_reply = turn["reply_tokens"] if finish == "length" else len(pieces)     # a piece is a token but at a stop
        row = {"ttft_s": times[0] - start if times else None,
               "decode_tok_s": _decode_rate(n_reply, times),
               "reply_tokens": n_reply, "stopped": finish, "decoded_tokens": len(after) - common,
               "active_tokens": len(after), "conversation_tokens": len(after), **rss()}
        if turn.get("fact_value"):
            row["fact_in_context"] = True
        return row

    def close(self) -> None:
        self.llm.close()
