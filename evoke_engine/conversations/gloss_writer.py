"""The gloss writer (issue 61): on the engine's idle time the loaded model writes one short plain-language gloss of the
value lines of an open conversation's blocks (`memory.glosses`): evicted blocks first, then those next to go.

Invariants: runs on the engine thread as a BACKGROUND job (`TurnJobs.on_idle`, after a turn's vectors); it stops
before its next decode once `busy()` says other work waits or a reply streams, so a turn that arrives while a gloss
is written starts after at most one decode step (a prompt chunk of `prefill_step_tokens` or one token); a block
cut short gets no gloss yet: what it decoded is held in RAM (one block, for the model that decoded it) and goes on
first at the next idle time (`resume_after`), so idle time adds up on a CPU where a block takes longer than a pause;
each block's reply is capped at `GLOSS_TOKENS_PER_BLOCK`; the scratch sequence is empty again after each block
(`completion.complete`); glossed blocks' lines are embedded at once; `total` sums every run's cost (its share of
idle time: `wall_s` over the idle seconds, `bench gloss-idle`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ContextFullError
from ..kvcache.blocks import Block, BlockState
from ..memory.glosses import BOOK, GLOSS_TOKENS_PER_BLOCK, gloss_messages, gloss_targets, parse_glosses
from ..memory.recall_signals import fact_lines
from ..runtime.sampling import SamplingParams
from ..settings import Settings
from .completion import Completion, HeldCompletion, complete
from .loaded_model import LoadedModel

log = logging.getLogger(__name__)
EMBEDDED_MODEL_NAMES = ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct-Q4_1.gguf")
BLOCKS_PER_RUN = 8                # blocks one idle job glosses at most (the next turn end queues another)
GREEDY = SamplingParams(temperature=0.0, seed=0, max_tokens=GLOSS_TOKENS_PER_BLOCK)


def embedded_model(settings: Settings) -> bool:
    """Whether the loaded model is the embedded SmolLM2-135M (no model file chosen, or that file)."""
    return not settings.model_path or Path(settings.model_path).name in EMBEDDED_MODEL_NAMES


def writes_glosses(settings: Settings) -> bool:
    """`recall_glosses`: "on" writes them; "auto" does except with the embedded tiny model; "off" never."""
    return settings.recall_glosses == "on" or settings.recall_glosses == "auto" and not embedded_model(settings)


def gloss_lines_of(block: Block) -> list[str]:
    """The lines of `block` the model is asked to gloss (`glosses.gloss_targets` of its fact lines)."""
    return gloss_targets(fact_lines(block))


def blocks_to_gloss(blocks: list[Block], score: Callable[[Block], float] | None = None) -> list[Block]:
    """The blocks that still need glosses, in the order they are written: saved ones (in the pool, on disk) first,
    newest first; then resident ones, the lowest `score` (the next to be evicted) first, else the oldest."""
    todo = [b for b in blocks if not b.shared and b.state is not BlockState.DROPPED and not BOOK.written(b.hash)
            and gloss_lines_of(b)]
    saved = [b for b in reversed(todo) if b.state in (BlockState.RAM, BlockState.DISK)]
    resident = [b for b in todo if b.state is BlockState.RESIDENT]
    if score is not None:
        resident.sort(key=score)
    return [*saved, *resident]


@dataclass
class GlossCost:
    """What writing glosses took: idle jobs run and their seconds on the engine thread, blocks and lines asked and
    glossed, tokens decoded and sampled, seconds of the model (prompt and reply) and of embedding the glossed lines,
    runs stopped because other work arrived, and blocks that went on from what a cut run decoded."""
    runs: int = 0
    wall_s: float = 0.0
    blocks: int = 0
    lines: int = 0
    glossed_lines: int = 0
    prompt_tokens: int = 0
    reply_tokens: int = 0
    model_s: float = 0.0
    embed_s: float = 0.0
    interrupted: int = 0
    resumed: int = 0

    def add(self, other: GlossCost) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _WhileIdle:
    """The cancel flag `complete` reads before each decode: set once `busy()` is true."""

    def __init__(self, busy: Callable[[], bool]) -> None:
        self._busy = busy

    def is_set(self) -> bool:
        return self._busy()


class GlossWriter:
    """Writes glosses for open conversations on idle time. `busy()`: other work waits or a reply streams (the
    engine passes its thread's `pending() > 0 or streaming()`); `generate`: how a prompt is completed
    (`completion.complete`: the scratch sequence, llama.cpp's sampler)."""

    def __init__(self, busy: Callable[[], bool], *, blocks_per_run: int = BLOCKS_PER_RUN,
                 clock: Callable[[], float] = time.perf_counter,
                 generate: Callable[..., Completion] | None = None) -> None:
        self.busy, self.blocks_per_run, self.clock = busy, blocks_per_run, clock
        self.generate = generate or _in_scratch
        self.total = GlossCost()
        self._held: tuple[str, weakref.ref, HeldCompletion] | None = None   # a cut block: hash, model, its cells

    def write(self, model: LoadedModel | None, memory) -> GlossCost:
        """Gloss up to `blocks_per_run` of `memory`'s blocks (a `ConversationMemory`), stopping when other work
        arrives; what it cost (also added to `total`). Nothing without a model or where `writes_glosses` is off."""
        cost = GlossCost()
        if model is None or model.closed or not writes_glosses(model.settings):
            return cost
        began = self.clock()
        for block in self._cut_first(blocks_to_gloss(list(memory.table.blocks), memory.score))[:self.blocks_per_run]:
            if self.busy():
                cost.interrupted += 1
                break
            glosses = self.gloss_block(model, block, cost)
            if glosses is None:
                break
            BOOK.put(block.hash, glosses)
            started = self.clock()
            memory.embed_glossed([block])
            cost.embed_s += self.clock() - started
        cost.runs, cost.wall_s = 1, self.clock() - began
        self.total.add(cost)
        log.debug("glosses: %d blocks, %d of %d lines, %d+%d tokens, %.2f s%s", cost.blocks, cost.glossed_lines,
                  cost.lines, cost.prompt_tokens, cost.reply_tokens, cost.wall_s,
                  " (stopped: other work arrived)" if cost.interrupted else "")
        return cost

    def _cut_first(self, todo: list[Block]) -> list[Block]:
        """`todo` with the block cut short last (its cells held) first: what it decoded is not decoded again."""
        held = self._held[0] if self._held is not None else None
        return [b for b in todo if b.hash == held] + [b for b in todo if b.hash != held]

    def _resume_for(self, model: LoadedModel, block: Block) -> HeldCompletion | None:
        """The cells held for `block` by `model` (taken: a block's cells are put back once), else None."""
        held, self._held = self._held, None
        if held is None or held[0] != block.hash or held[1]() is not model:
            return None
        return held[2]

    def resume_after(self, cost: GlossCost) -> bool:
        """Whether another idle job should go on after a run that cost `cost`: it decoded something and stopped for
        work that arrived (which runs first) or at `blocks_per_run`. A run stopped before its first decode (a reply
        streams: its turn's end queues the next) or by a full context is not resumed, so resuming never spins."""
        return cost.prompt_tokens > 0 and (cost.interrupted > 0 or cost.blocks >= self.blocks_per_run)

    def gloss_block(self, model: LoadedModel, block: Block, cost: GlossCost) -> dict[str, str] | None:
        """One block's glosses (line -> gloss, maybe none), or None when other work arrived or the context had no
        room: nothing is kept of a reply cut short."""
        lines = gloss_lines_of(block)
        prompt = model.template.render(gloss_messages(lines, block.file_name or "", block.text),
                                       add_generation_prompt=True)
        tokens = model.rt.tokenize(prompt, add_special=False, parse_special=True)
        resume = self._resume_for(model, block)

        def hold(cut: HeldCompletion) -> None:
            self._held = (block.hash, weakref.ref(model), cut)

        started = self.clock()
        try:
            done = self.generate(model, tokens, GREEDY, None, _WhileIdle(self.busy), resume=resume, hold=hold)
        except ContextFullError as exc:
            log.debug("no room to gloss %s: %s", block.name, exc)
            return None
        finally:
            cost.model_s += self.clock() - started
        held_reply = max(0, len(resume.tokens) - len(tokens)) if resume is not None else 0
        cost.prompt_tokens += done.prompt_decoded
        cost.reply_tokens += max(0, done.n_tokens - held_reply)
        cost.resumed += int(resume is not None and done.prompt_decoded < len(tokens))
        if done.stopped == "cancelled":
            cost.interrupted += 1
            return None
        glosses = parse_glosses(done.text, lines)
        cost.blocks += 1
        cost.lines += len(lines)
        cost.glossed_lines += len(glosses)
        return glosses


def _in_scratch(model: LoadedModel, tokens: list[int], params, on_token, cancel, *,
                resume: HeldCompletion | None = None, hold=None) -> Completion:
    """`complete` in the scratch sequence: the writer runs as one plain job between other streams' steps, and a
    raw completion's stream may hold the completion's own sequence meanwhile. Its prompt (about 200 tokens) is
    decoded `prefill_step_tokens` at a time, the stop flag read before each: a turn that arrives waits for one such
    chunk (measured: `bench gloss-idle`), not the whole prompt's decode. A cut run's cells go to `hold` (the scratch
    serves other work meanwhile); `resume` puts them back."""
    return complete(model, tokens, params, on_token, cancel, seq=model.rt.scratch_seq,
                    prefill_chunk=model.settings.prefill_step_tokens, resume=resume, hold=hold)
