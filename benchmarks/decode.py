"""`bench decode`: tokens/s of a greedy reply at a given context, Evoke's turn loop against llama-cpp-python's
`Llama.generate` (and llama-server where a binary is given), same model, threads and sampler, in one run.

Invariants: every system holds the same document (about `context` tokens) before the timed reply; every reply is
greedy with no repetition penalty and exactly `tokens` tokens (end-of-generation never stops it); the figure is
the reply's tokens after the first over the seconds after the first (the per-token loop, not the prompt); the
systems alternate round by round so machine load hits them alike; Evoke's rounds regenerate the same reply, so its
context stays the same length across rounds.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time

from evoke_engine.engine import Engine
from evoke_engine.settings import Settings

from .conversations import comparator_llama, document
from .llama_server import LlamaServer, check_binary

log = logging.getLogger(__name__)
SYSTEM = "You are a helpful assistant."
ASK = "Summarise the file above, section by section."
TOKENS_PER_HINT = 0.55          # `conversations.document`'s size hint over the tokens it gives (the embedded model)


class _EvokeArm:
    """An engine holding the document, whose reply is regenerated each round (the same context every time)."""

    def __init__(self, context: int, tokens: int, threads: int) -> None:
        budget = context + tokens + 512
        settings = Settings(home=tempfile.mkdtemp(prefix="evoke-decode-"), budget_tokens=budget,
                            n_ctx=budget + 1024, slots=1, n_threads=_threads(threads), system_prompt=SYSTEM,
                            tools_enabled=False)
        self.engine = Engine(settings, scheduler=False)
        self.engine.wait_idle()
        self.conv = self.engine.new_conversation(system_prompt=SYSTEM, tools=[])
        self.tokens = tokens
        self.doc = document("svc", int(context * TOKENS_PER_HINT))
        self.reply = self.conv.submit(ASK, [("svc.txt", self.doc)], **self._sampling()).result()
        self.context_tokens = self.conv.stats().active_tokens

    def _sampling(self) -> dict:
        return {"max_tokens": self.tokens, "temperature": 0, "repeat_penalty": 1.0, "ignore_eos": True}

    def round(self) -> float:
        reply = self.conv.regenerate(**self._sampling()).result()
        if reply.n_tokens != self.tokens:
            raise RuntimeError(f"Evoke's reply stopped at {reply.n_tokens} tokens ({reply.stopped})")
        return (reply.n_tokens - 1) / reply.decode_s

    def close(self) -> None:
        self.engine.close()


class _LlamaArm:
    """llama-cpp-python's `Llama` with the same document's tokens; `generate` greedy (llama.cpp's greedy sampler)."""

    def __init__(self, doc: str, context_tokens: int, tokens: int, threads: int, flash_attention: bool) -> None:
        self.llm = comparator_llama(n_ctx=context_tokens + tokens + 64, n_threads=_threads(threads),
                                    n_threads_batch=_threads(threads), n_batch=512, flash_attn=flash_attention)
        doc_tokens = self.llm.tokenize(f"{SYSTEM}\n{ASK}\n\nsvc.txt:\n{doc}".encode(), add_bos=True)
        while len(doc_tokens) < context_tokens:             # as long as Evoke's context (its template adds some)
            doc_tokens += doc_tokens[1:context_tokens - len(doc_tokens) + 1]
        self.prompt, self.tokens = doc_tokens[:context_tokens], tokens
        self.context_tokens = len(self.prompt)
        self.llm.eval(self.prompt)

    def round(self) -> float:
        """`generate` finds the prompt cached (its own prefix match) and re-decodes only its last token."""
        first, n = None, 0
        for _token in self.llm.generate(self.prompt, temp=0.0, repeat_penalty=1.0, top_k=1):
            n += 1
            if first is None:
                first = time.perf_counter()
            if n == self.tokens:
                break
        return (n - 1) / (time.perf_counter() - first)

    def close(self) -> None:
        self.llm.close()


class _ServerArm:
    """llama-server with the same conversation, its own `timings.predicted_per_second` (the server's clock)."""

    def __init__(self, binary: str, doc: str, context: int, tokens: int, threads: int, flash_attention: bool) -> None:
        self.server = LlamaServer(binary, n_ctx=context + tokens + 1024, threads=_threads(threads),
                                  args=["-fa", "on" if flash_attention else "off"])
        self.server.__enter__()
        self.body = {"messages": [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": f"{ASK}\n\nsvc.txt:\n{doc}"}],
                     "max_tokens": tokens, "temperature": 0, "repeat_penalty": 1.0, "ignore_eos": True,
                     "stream": True, "cache_prompt": True}
        self.tokens = tokens
        self.context_tokens = self.server.stream(self.body)["usage"].get("prompt_tokens")

    def round(self) -> float:
        timings = self.server.stream(self.body)["timings"]
        return float(timings["predicted_per_second"])

    def close(self) -> None:
        self.server.__exit__(None, None, None)


def _threads(threads: int) -> int:
    """Every system gets the same thread count: all cores unless told (the engine's automatic count follows the
    load average, which would give it fewer threads than its comparators on a busy machine)."""
    return threads or os.cpu_count() or 1


def _one_context(context: int, tokens: int, rounds: int, threads: int, server: str | None) -> dict:
    evoke = _EvokeArm(context, tokens, threads)
    arms: dict = {"evoke": evoke}
    flash = evoke.engine.model_info().flash_attention == "on"     # the comparators run the engine's attention kernel
    try:
        arms["llama_cpp_python"] = _LlamaArm(evoke.doc, evoke.context_tokens, tokens, threads, flash)
        if server:
            arms["llama_server"] = _ServerArm(server, evoke.doc, context, tokens, threads, flash)
        samples: dict[str, list[float]] = {name: [] for name in arms}
        for arm in arms.values():
            arm.round()                                                 # warm every system once
        for i in range(rounds):
            order = list(arms.items())
            for name, arm in (order if i % 2 == 0 else order[::-1]):
                samples[name].append(arm.round())
                log.info("decode context %d %s round %d: %.1f tok/s", context, name, i, samples[name][-1])
    finally:
        for arm in arms.values():
            arm.close()
    rows: dict = {name: {"context_tokens": arms[name].context_tokens, "tok_s_median": round(statistics.median(v), 2),
                   "tok_s_all": [round(x, 2) for x in v]} for name, v in samples.items()}
    base = rows["llama_cpp_python"]["tok_s_median"]
    for row in rows.values():
        row["vs_llama_cpp_python"] = round(row["tok_s_median"] / base, 3) if base else None
    rows["flash_attention"] = "on" if flash else "off"
    return rows


def run(*, contexts: tuple[int, ...] = (2048, 8192), tokens: int = 256, rounds: int = 5, threads: int = 0,
        server: str | None = None) -> dict:
    server = check_binary(server)
    started = time.time()
    result = {"tokens": tokens, "rounds": rounds, "threads": threads or "all cores", "sampler": "greedy, "
              "repeat_penalty 1.0, end-of-generation ignored", "llama_server": server or "not given",
              "contexts": {str(c): _one_context(c, tokens, rounds, threads, server) for c in contexts}}
    result["seconds"] = round(time.time() - started, 1)
    return result
