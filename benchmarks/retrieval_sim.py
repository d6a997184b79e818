"""One conversation replayed without the model: the real ConversationMemory, blocks, embedder and recovery over
the simulated KV cache (`kv_sim`), the real tokenizer (the GGUF's vocabulary only) and canned replies.

Invariants: no forward pass and no sampling (replies are the workload's text, grown in small chunks with the
eviction `turn._generate` does); the message's blocks are cut by the engine's own `message_blocks`; what is
resident is read when the reply would start (after recovery and the message's decode). Proves nothing about
llama.cpp: it measures the memory manager's choices.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evoke_engine.conversations.turn import input_message, message_blocks, split_tokens
from evoke_engine.kvcache.blocks import Block, BlockState
from evoke_engine.kvcache.pool import SavedPool
from evoke_engine.memory.embedder import Embedder
from evoke_engine.memory.memory import ConversationMemory
from evoke_engine.runtime.runtime import Runtime, default_model_path
from evoke_engine.runtime.template import ChatTemplate
from evoke_engine.runtime.vocab import VocabCounter
from evoke_engine.settings import Settings

from .kv_sim import FakeCells, FakeKVCache, FakeRuntime

REPLY_CHUNK = 8          # reply tokens decoded per step (the engine decodes one; eviction checks alike)
_WHOLE = 1 << 20


class VocabRuntime(FakeRuntime):
    """`FakeRuntime` whose tokens are the model's own (vocabulary-only load: no weights, no context)."""

    def __init__(self, model_path: Path | None = None) -> None:
        super().__init__(slots=1)
        self._counter = VocabCounter(model_path or default_model_path())
        self.vocab = self._counter._vocab          # what Runtime's tokenizer methods read
        self._token_piece_cache: dict[int, bytes] = {}
        bos = Runtime.token_text(self, "bos")
        self._flush_token = (Runtime.tokenize(self, bos) if bos else [0])[0]

    @property
    def flush_token(self) -> int:
        return self._flush_token

    def fresh_cells(self) -> None:
        self.cells = FakeCells(_WHOLE)
        self.decoded = []

    tokenize = Runtime.tokenize
    tokenize_parts = Runtime.tokenize_parts
    token_bytes = Runtime.token_bytes
    detokenize = Runtime.detokenize

    @property
    def n_vocab(self) -> int:
        return 1 << 16

    def is_eog(self, token: int) -> bool:
        return False


@dataclass
class Probe:
    kind: str
    fact_blocks: list[str]
    in_context: bool
    recovered: list[tuple[str, int]]
    recovered_fact_tokens: int
    decide_ms: float


@dataclass
class SimConversation:
    settings: Settings
    rt: VocabRuntime
    embedder: Embedder
    system: str
    template: ChatTemplate = field(default_factory=lambda: ChatTemplate(None))
    history: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rt.fresh_cells()
        self.kv = FakeKVCache(self.rt)
        self._spill = tempfile.TemporaryDirectory(prefix="evoke-retrieval-")
        self.pool = SavedPool(self.settings.ram_budget_bytes, Path(self._spill.name))
        self.events: list = []
        self.memory = ConversationMemory("sim", settings=self.settings, runtime=self.rt, kv=self.kv, pool=self.pool,
                                         embedder=self.embedder, emit=self.events.append)
        self.system_message = {"role": "system", "content": self.system}
        segment = self.template.message_segment([], self.system_message)
        tokens = self.rt.tokenize_parts(segment.parts())
        prefix_seq = 1
        self.rt.decode(tokens, prefix_seq, 0, logits_last=False)
        self.kv.share(prefix_seq, 0, 0, len(tokens))
        self.memory.sequence.adopt_prefix([Block(name="system", role="system", turn=0, tokens=tokens,
                                                 text=segment.text, shared=True)])
        self.memory.unpark(0)
        self.decide_ms: list[float] = []
        self.turn_end_ms: list[float] = []
        self.recovered_per_turn: list[int] = []
        self.active_at_reply_start: list[int] = []   # a wide recovery may run over the budget within a turn
        self.active_at_turn_end: list[int] = []      # never over it here

    def close(self) -> None:
        self.pool.close()
        self._spill.cleanup()

    def input_blocks(self, turn: int) -> list[Block]:
        return [b for b in self.memory.table.blocks if b.message_key() == (turn, "input")]

    def fact_blocks(self, turn: int, line: str) -> list[str]:
        """Names of the turn's input blocks holding any part of `line` (every one must be resident), else of its
        reply's blocks (a value in a table the assistant wrote)."""
        return (self._holding(self.input_blocks(turn), line)
                or self._holding([b for b in self.memory.table.blocks if b.message_key() == (turn, "reply")], line))

    @staticmethod
    def _holding(blocks: list[Block], line: str) -> list[str]:
        text, spans = "", []
        for block in blocks:
            spans.append((len(text), len(text) + len(block.text), block.name))
            text += block.text
        at = text.find(line.strip())
        if at < 0:
            return []
        end = at + len(line.strip())
        return [name for start, stop, name in spans if start < end and stop > at]

    def send(self, text: str, attachments: list[tuple[str, str]], reply: str | Callable[[set[str]], str],
             max_tokens: int) -> dict:
        """One turn; `reply` is its text, or a reader: given the names of the blocks resident when the reply
        starts, the text it writes. Returns what was resident then and still after the reply's last token, what the
        turn recovered and kept, its cost."""
        memory, rt = self.memory, self.rt
        memory.turn += 1
        turn = memory.turn
        message = input_message(text, attachments, turn)
        head = [self.system_message]
        segment = self.template.message_segment([*head, *self.history], message)
        blocks = message_blocks(rt, segment, text, attachments, turn, self.settings.block_tokens)
        self.history.append(message)
        frame = self.template.assistant_frame([*head, *self.history])
        opening = rt.tokenize(frame.opening)
        closing = rt.tokenize(frame.closing)
        memory.set_query(text or message["content"][:2000])
        new_hashes = {b.hash for b in blocks if b.role == "file"}
        message_tokens = sum(b.n_tokens for b in blocks)
        reserve = min(max_tokens, memory.budget_tokens // 8) + len(opening) + len(closing)
        recovered = memory.recover(text, message_tokens=min(message_tokens, memory.budget_tokens // 2),
                                   reply_reserve=reserve, identity_hashes=new_hashes)
        self.decide_ms.append(memory.last_decide_s * 1000)
        reused = {b.hash for b in recovered if b.role == "file"}
        current = [*recovered, *memory.turn_protected]
        for block in blocks:
            if block.role == "file" and block.hash in reused:
                continue
            memory.append_decoded(block, current=current)
        question = [b for b in blocks if b.role == "user"][-1:]
        memory.make_room(len(opening) + 1, current=[*current, *question])
        memory.reply_starts()
        resident = set(memory.reply_context)
        self.active_at_reply_start.append(memory.active_tokens)
        reply = reply(resident) if callable(reply) else reply
        reply_block = Block(name=f"assistant#{turn}", role="assistant", turn=turn, tokens=list(opening), text="")
        memory.sequence.append([reply_block])
        self._grow_reply(reply_block, rt.tokenize(reply, parse_special=False)[:max_tokens], closing, turn,
                         current, question)
        through_reply = {b.name for b in memory.table.resident if not b.shared}    # the reply's room checks kept
        self.history.append({"role": "assistant", "content": reply, "evoke_turn": turn})
        memory.focus.update(memory.query)
        started = time.perf_counter()
        memory.end_turn(keep=[b for b in recovered if b.state is BlockState.RESIDENT], reply=reply)
        memory.embed_due()                   # the engine's idle time after the turn (off the reply and the decision)
        self.turn_end_ms.append((time.perf_counter() - started) * 1000)
        got = [(b.name, b.n_tokens) for b in recovered]
        kept = [(b.name, b.n_tokens) for b in recovered if b.state is BlockState.RESIDENT]
        self.recovered_per_turn.append(sum(n for _, n in got))
        self.active_at_turn_end.append(memory.active_tokens)
        return {"resident": resident, "through_reply": through_reply, "recovered": got, "kept": kept,
                "decide_ms": self.decide_ms[-1], "turn": turn}

    def _grow_reply(self, reply_block: Block, tokens: list[int], closing: list[int], turn: int,
                    current: list[Block], question: list[Block]) -> None:
        """The reply's tokens decoded a chunk at a time, with the engine's room check (`make_reply_room`: the same
        order of what may leave) before a chunk that would take the turn past its limit."""
        memory, budget = self.memory, self.memory.turn_limit_tokens      # the budget plus a wide recovery's overdraft
        part = 0
        for at in range(0, len(tokens), REPLY_CHUNK):
            chunk = tokens[at:at + REPLY_CHUNK]
            if memory.eviction_enabled and memory.active_tokens + len(chunk) > budget:
                reply_block, part = self._finish_older_part(reply_block, turn, part)
                if not memory.make_reply_room(current, question, reply_block, room=len(chunk)):
                    break                                            # the engine stops the reply there too
            memory.sequence.extend_tail(reply_block, chunk)
        if closing:
            memory.make_room(len(closing), current=[*current, *question, reply_block])
            memory.sequence.extend_tail(reply_block, closing, logits_last=False)
        pieces = [Block(name=f"assistant#{turn}" + (f".{part + k}" if part + k else ""), role="assistant",
                        turn=turn, tokens=chunk, text=self.rt.detokenize(chunk))
                  for k, chunk in enumerate(split_tokens(self.rt, reply_block.tokens, self.settings.block_tokens))]
        memory.sequence.split(reply_block, pieces)

    def _finish_older_part(self, reply_block: Block, turn: int, part: int) -> tuple[Block, int]:
        chunks = split_tokens(self.rt, reply_block.tokens, self.settings.block_tokens)
        if len(chunks) < 2:
            return reply_block, part
        pieces = [Block(name=f"assistant#{turn}" + (f".{part + k}" if part + k else ""), role="assistant",
                        turn=turn, tokens=chunk, text=self.rt.detokenize(chunk)) for k, chunk in enumerate(chunks[:-1])]
        part += len(pieces)
        growing = Block(name=f"assistant#{turn}.{part}", role="assistant", turn=turn, tokens=list(chunks[-1]),
                        text="")
        self.memory.sequence.split(reply_block, [*pieces, growing])
        return growing, part
