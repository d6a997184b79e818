"""One user turn on the engine thread: message -> blocks -> recovery -> decode -> sample -> blocks.

Invariants: the message's blocks are named (`file:<name>#i`, `user#N`, `user#N.k`), decoded
in chunks with eviction between them (never truncated); the reply grows as the last resident
block and is split into `assistant#N` blocks at the end; a cancelled reply keeps its text; a continued reply
(`continue_reply`) decodes its text so far as a rebuild would and grows from there, with no closing between. Text a
user, a file, a tool or a reply wrote is tokenized with special-token parsing off (only the template's
markup is special), alike live and in a rebuild from history, so both give the same tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..kvcache.blocks import Block, BlockState
from ..memory.memory import ConversationMemory
from ..runtime.reply_text import ReplyText, tokens_before_stop
from ..runtime.runtime import Cancelled, Runtime
from ..runtime.sampling import SamplingParams
from ..runtime.template import ChatTemplate, Segment
from .breakdown import TurnBreakdown

Attachment = tuple[str, str]


@dataclass
class Reply:
    text: str
    n_tokens: int
    stopped: str              # eos | max_tokens | stop | cancelled | budget
    ttft_s: float
    decode_s: float
    prefill_tokens: int
    recovered: list[str]
    rebuild_s: float = 0.0    # a KV rebuild (from history) the turn waited for; counted in ttft_s
    rebuilt_tokens: int = 0   # tokens that rebuild decoded
    reused_tokens: int = 0    # message tokens spliced from other conversations' K/V (not in prefill_tokens)
    resumed_tokens: int = 0   # a continued reply: the tokens it had before (in n_tokens, not sampled this time)
    opening_tokens: int = 0   # the template's generation prompt decoded before the first token (not in prefill)
    breakdown: dict = field(default_factory=dict)   # where the turn's time went (`TurnBreakdown.as_dict`)

    @property
    def tokens_per_s(self) -> float:
        return (self.n_tokens - self.resumed_tokens) / self.decode_s if self.decode_s > 0 else 0.0


def render_user_content(text: str, attachments: Sequence[Attachment]) -> str:
    parts = [f"[file {name}]\n{body.rstrip()}\n[end of file {name}]\n\n" for name, body in attachments]
    return "".join(parts) + text


def split_tokens(rt: Runtime, tokens: list[int], block_tokens: int) -> list[list[int]]:
    """Chunks of <= block_tokens, cut at a line's end in a chunk's last 40% when one is there: after a token that
    ends a line, its newline possibly followed by the next line's indentation (the tokenizer merges `\n` with the
    spaces after it, so indented code has no bare newline token)."""
    chunks, start = [], 0
    while start < len(tokens):
        end = min(start + block_tokens, len(tokens))
        if end < len(tokens):
            floor = start + int(block_tokens * 0.6)
            for cut in range(end, floor, -1):
                if rt.token_bytes(tokens[cut - 1]).rstrip(b" \t").endswith(b"\n"):
                    end = cut
                    break
        chunks.append(tokens[start:end])
        start = end
    return chunks


def message_blocks(rt: Runtime, segment: Segment, text: str, attachments: Sequence[Attachment], turn: int,
                   block_tokens: int) -> list[Block]:
    """Blocks for one rendered user message: each attachment's chunks, then the user's own text. Only the
    template's markup may become special tokens: `<|im_start|>` in a message or a file stays text."""
    blocks: list[Block] = []
    cursor = 0
    for name, body in attachments:
        at = segment.text.find(body.rstrip(), cursor)
        if at < 0:
            continue
        end = at + len(body.rstrip())
        tokens = rt.tokenize_parts(segment.parts(cursor, end))
        for i, chunk in enumerate(split_tokens(rt, tokens, block_tokens)):
            blocks.append(Block(name=f"file:{name}#{i}", role="file", turn=turn, tokens=chunk,
                                text=rt.detokenize(chunk), file_name=name))
        cursor = end
    for k, chunk in enumerate(split_tokens(rt, rt.tokenize_parts(segment.parts(cursor)), block_tokens)):
        name = f"user#{turn}" if k == 0 else f"user#{turn}.{k}"
        blocks.append(Block(name=name, role="user", turn=turn, tokens=chunk, text=rt.detokenize(chunk)))
    return blocks


def input_message(text: str, attachments: Sequence[Attachment], turn: int, role: str = "user",
                  extra: dict | None = None) -> dict:
    """The template message of a turn's input (a user message, or a tool result with its call id)."""
    return {"role": role, "content": render_user_content(text, attachments), **(extra or {}), "evoke_turn": turn}


def next_user_opening(rt: Runtime, template: ChatTemplate, messages: list[dict]) -> list[int]:
    """Tokens the template puts before the content of a user message that follows `messages` and a
    reply (e.g. `<|im_start|>user\n`): what every next message starts with, unless it is a tool result
    or tokenizes across that boundary (`KVCache.claim_ahead` checks the tokens, so a miss costs a drop)."""
    text = template.user_opening([*messages, {"role": "assistant", "content": "OK"}])
    return rt.tokenize(text) if text else []


def number_turns(history: list[dict]) -> None:
    """Give every message its turn (`evoke_turn`) where it lacks one: an input starts a turn, a reply
    joins the turn of the input before it (histories written before turns were recorded)."""
    turn = 0
    last_role = "assistant"
    for message in history:
        if isinstance(message.get("evoke_turn"), int):
            turn = message["evoke_turn"]
        else:
            if message.get("role") != "assistant" or last_role == "assistant":
                turn += 1
            message["evoke_turn"] = turn
        last_role = message.get("role")


def message_key(message: dict) -> tuple[int, str]:
    """(turn, "input" | "reply"): the key its blocks carry (`Block.message_key`)."""
    return message["evoke_turn"], "reply" if message.get("role") == "assistant" else "input"


@dataclass
class PreparedInput:
    """A turn's input worked out before the turn (`prepare_input`: while the user typed it, or at the turn's start):
    its template message, its blocks and the reply's frame. Rendering the template and tokenizing are the turn's
    Python before any decision; done ahead, the turn only checks `fits`."""
    text: str
    attachments: tuple[Attachment, ...]
    role: str
    extra: dict | None
    system: dict | None
    history: list[dict]             # shallow copies of the history it was rendered after
    turn: int
    block_tokens: int
    user_message: dict
    blocks: list[Block]
    opening: list[int]
    closing: list[int]
    next_opening: list[int]

    @property
    def message_tokens(self) -> int:
        return sum(b.n_tokens for b in self.blocks)

    def fits(self, history: list[dict], text: str, attachments: Sequence[Attachment], turn: int, *,
             system: dict | None, role: str, extra: dict | None, block_tokens: int) -> bool:
        """True when a turn with these inputs, after this history, would prepare exactly this."""
        return (self.text == text and self.attachments == tuple(attachments) and self.role == role
                and self.extra == extra and self.turn == turn and self.block_tokens == block_tokens
                and self.system == system and self.history == history)


def prepare_input(rt: Runtime, template: ChatTemplate, history: list[dict], text: str,
                  attachments: Sequence[Attachment], turn: int, block_tokens: int, *, system: dict | None = None,
                  role: str = "user", extra: dict | None = None) -> PreparedInput:
    """Render and tokenize turn `turn`'s input after `history` (which it leaves as it is): nothing in the
    conversation changes, so it may run ahead of the turn and be thrown away."""
    user_message = input_message(text, attachments, turn, role, extra)
    head = [system] if system else []
    segment = template.message_segment([*head, *history], user_message)
    blocks = message_blocks(rt, segment, text, attachments, turn, block_tokens)
    after = [*head, *history, user_message]
    frame = template.assistant_frame(after)
    return PreparedInput(text=text, attachments=tuple(attachments), role=role, extra=extra, system=system,
                         history=[dict(m) for m in history], turn=turn, block_tokens=block_tokens,
                         user_message=user_message, blocks=blocks, opening=rt.tokenize(frame.opening),
                         closing=rt.tokenize(frame.closing), next_opening=next_user_opening(rt, template, after))


def reply_reserve(memory: ConversationMemory, prepared: PreparedInput, max_tokens: int) -> int:
    """Tokens a turn keeps free for its reply: its first `max_tokens` (at most an eighth of the budget) and the
    template's frame around it."""
    return min(max_tokens, memory.budget_tokens // 8) + len(prepared.opening) + len(prepared.closing)


def recovery_inputs(memory: ConversationMemory, prepared: PreparedInput, max_tokens: int) -> dict:
    """The arguments of the turn's recovery decision (`ConversationMemory.recover` / `recover_ahead`)."""
    return {"message_tokens": min(prepared.message_tokens, memory.budget_tokens // 2),
            "reply_reserve": reply_reserve(memory, prepared, max_tokens),
            "identity_hashes": {b.hash for b in prepared.blocks if b.role == "file"}}


def prepare_ahead(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict], text: str,
                  attachments: Sequence[Attachment], max_tokens: int, *, system: dict | None = None) -> PreparedInput:
    """Everything the next turn would work out before its first decode, done while the user types `text`: the
    input rendered and tokenized, the recovery decided and carried out where it fits the budget
    (`ConversationMemory.recover_ahead`), and a one-block message's tokens but its last decoded at the tail
    ahead of it (`decode_ahead`). The turn that sends the same text after the same history finds all of it
    (`run_turn`'s `prepared`, the decode's claim of the held tokens); any other turn ignores it (a held run
    that does not match is dropped by the next decode)."""
    prepared = prepare_input(rt, template, history, text, attachments, memory.turn + 1, memory.settings.block_tokens,
                             system=system)
    memory.set_query(text or prepared.user_message["content"][:2000])
    memory.recover_ahead(text, **recovery_inputs(memory, prepared, max_tokens))
    if len(prepared.blocks) == 1:                # a message of one block: decoded with the reply's opening
        memory.decode_ahead(prepared.blocks[0].tokens[:-1])     # its last token's logits are the turn's
    return prepared


def run_turn(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict],
             text: str, attachments: Sequence[Attachment], params: SamplingParams,
             on_token: Callable[[str], None] | None, cancel: threading.Event,
             on_progress: Callable[[int, int], None] | None = None, *, system: dict | None = None,
             role: str = "user", extra: dict | None = None, prepared: PreparedInput | None = None) -> Reply:
    """Run one turn; `history` (template messages after `system`) gains the input message and the reply.
    `prepared` (`prepare_ahead`) is used when it fits this turn, else the input is prepared here."""
    started = time.perf_counter()
    if text.strip():
        memory.expect_query(text)                 # embedded beside the input's rendering and the lexical signal
    turn = memory.begin_turn()
    block_tokens = memory.settings.block_tokens
    if prepared is None or not prepared.fits(history, text, attachments, turn, system=system, role=role,
                                             extra=extra, block_tokens=block_tokens):
        prepared = prepare_input(rt, template, history, text, attachments, turn, block_tokens, system=system,
                                 role=role, extra=extra)
    user_message, blocks = prepared.user_message, prepared.blocks
    opening, closing, next_opening = prepared.opening, prepared.closing, prepared.next_opening
    history.append(user_message)
    memory.set_query(text or user_message["content"][:2000])

    # Recovery, before the new tail: re-attached content (identity) and what the message needs.
    clock = TurnBreakdown()
    decision = recovery_inputs(memory, prepared, params.max_tokens)
    recovered = memory.recover(text, **decision)
    clock.add("decide", memory.last_decide_s - memory.last_embed_s)
    clock.add("embed", memory.last_embed_s)
    clock.add("restore", memory.last_restore_s)
    reused = {b.hash for b in recovered if b.role == "file"}
    message_tokens = prepared.message_tokens
    rt.boundary_if_spent()        # the turn's set-up (its rows, input, recovery) and its prefill: a step apart once
                                  # the set-up has taken a token step's time

    # Decode the message in blocks, evicting between them when the budget needs it.
    done, total = 0, message_tokens
    current: list[Block] = [*recovered, *memory.turn_protected]     # a wide recovery keeps its working set
    to_decode = [b for b in blocks if not (b.role == "file" and b.hash in reused)]   # identity hits came back
    last = to_decode.pop() if to_decode else None        # decoded with the reply's opening, in one call
    reused: list[dict] = []
    decoding = time.perf_counter()
    try:
        for at, block in enumerate(to_decode):
            rt.step_boundary()                                      # chunked prefill: a block a step
            following = [*to_decode[at + 1:], *([last] if last is not None else [])]
            hit = memory.append_reused(block, current=current, following=following)   # another's exact K/V
            if hit is not None:
                reused.append(hit)
                done += hit["repaired"]                             # decoded afresh after the seam
            else:
                memory.append_decoded(block, current=current, cancel=cancel)
                done += block.n_tokens
            if on_progress is not None:
                on_progress(done + sum(r["tokens"] for r in reused), total)
        if last is not None and (hit := memory.append_reused(last, current=current)) is not None:
            reused.append(hit)
            done += hit["repaired"]
            last = None
        memory.report_reuse(reused)
        clock.add("prompt_decode", time.perf_counter() - decoding)
        question = [b for b in blocks if b.role == "user"][-1:]      # kept while the reply is written
        reply = _generate(memory, rt, opening, closing, params, on_token, cancel, turn, current, started,
                          last_block=last, next_opening=next_opening, question=question, clock=clock)
        done += last.n_tokens if last is not None else 0
    except Cancelled:
        reply = Reply(text="", n_tokens=0, stopped="cancelled", ttft_s=0.0, decode_s=0.0,
                      prefill_tokens=done, recovered=[])
        _close_reply(memory, rt, turn, opening, [], closing, "", current, next_opening=next_opening)
    reply.prefill_tokens = done
    reply.reused_tokens = sum(r["tokens"] for r in reused)
    reply.recovered = [b.name for b in recovered]
    history.append({"role": "assistant", "content": reply.text, "evoke_turn": turn})
    memory.focus.update(memory.query)
    ending = time.perf_counter()
    memory.end_turn(keep=[b for b in recovered if b.state is BlockState.RESIDENT], reply=reply.text)
    clock.add("turn_end", time.perf_counter() - ending)
    memory.last_breakdown = reply.breakdown = _finished(clock, started)
    return reply


def _finished(clock: TurnBreakdown, started: float) -> dict:
    """The turn's breakdown as plain data, its total counted up to now (the turn end's evictions included)."""
    clock.finish(time.perf_counter() - started)
    return clock.as_dict()


def regenerate_reply(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict],
                     params: SamplingParams, on_token: Callable[[str], None] | None, cancel: threading.Event,
                     *, system: dict | None = None) -> Reply:
    """Sample a new reply to the last input of `history` (its old reply already removed): no prefill."""
    started = time.perf_counter()
    if not history or history[-1].get("role") == "assistant":
        raise ValueError("there is no message to reply to")
    turn = memory.begin_turn(history[-1]["evoke_turn"])
    frame = template.assistant_frame([*([system] if system else []), *history])
    opening, closing = rt.tokenize(frame.opening), rt.tokenize(frame.closing)
    next_opening = next_user_opening(rt, template, [*([system] if system else []), *history])
    memory.set_query(history[-1]["content"][-2000:])
    question = memory.question_of(turn)
    clock = TurnBreakdown()
    try:
        reply = _generate(memory, rt, opening, closing, params, on_token, cancel, turn, [], started,
                          next_opening=next_opening, question=question, clock=clock)
    except Cancelled:
        reply = Reply(text="", n_tokens=0, stopped="cancelled", ttft_s=0.0, decode_s=0.0, prefill_tokens=0,
                      recovered=[])
        _close_reply(memory, rt, turn, opening, [], closing, "", question, next_opening=next_opening)
    history.append({"role": "assistant", "content": reply.text, "evoke_turn": turn})
    ending = time.perf_counter()
    memory.end_turn()
    clock.add("turn_end", time.perf_counter() - ending)
    memory.last_breakdown = reply.breakdown = _finished(clock, started)
    return reply


def resumable_reply(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict], *,
                    system: dict | None = None) -> list[Block] | None:
    """The blocks of the last reply (`history` ends with it) when it can grow where it stopped, with no decode
    again: its last block resident at the tail, and its tokens the template's opening, exactly its stored text
    and the closing (nothing edited since, no stop string left in an older part). None when it cannot."""
    if memory.seq is None or not history or history[-1].get("role") != "assistant" or not history[-1]["content"]:
        return None
    parts = [b for b in memory.table.blocks if b.message_key() == (history[-1]["evoke_turn"], "reply")]
    frame = template.assistant_frame([*([system] if system else []), *history[:-1]])
    opening, closing = rt.tokenize_parts([(frame.opening, True)]), rt.tokenize(frame.closing)
    tokens = [t for part in parts for t in part.tokens]
    if (not parts or not memory.table.resident or memory.table.resident[-1] is not parts[-1] or not closing
            or parts[-1].n_tokens <= len(closing) or len(tokens) <= len(opening) + len(closing)
            or tokens[:len(opening)] != opening or tokens[-len(closing):] != closing):
        return None
    if rt.detokenize(tokens[len(opening):-len(closing)]) != history[-1]["content"]:
        return None
    return parts


def continue_reply(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict],
                   partial: str, params: SamplingParams, on_token: Callable[[str], None] | None,
                   cancel: threading.Event, *, system: dict | None = None,
                   resumed: list[Block] | None = None) -> Reply:
    """Sample on after `partial`, the text of the last reply so far (`history` ending with its input). With
    `resumed` (its blocks, `resumable_reply`) the reply grows in its own cells: only its last token decodes again.
    Else its blocks were removed, and its opening and `partial` decode as a rebuild would (older chunks as finished
    blocks). Either way the reply grows with no closing in between. The Reply's text is the whole reply;
    `on_token` hears only the new pieces. Cancelled propagates (the caller drops the KV)."""
    started = time.perf_counter()
    if not history or history[-1].get("role") == "assistant":
        raise ValueError("there is no message the reply answers")
    head = [system] if system else []
    turn = memory.begin_turn(history[-1]["evoke_turn"])
    frame = template.assistant_frame([*head, *history])
    opening, closing = rt.tokenize_parts([(frame.opening, True)]), rt.tokenize(frame.closing)
    next_opening = next_user_opening(rt, template, [*head, *history])
    memory.set_query(history[-1]["content"][-2000:])
    question = memory.question_of(turn)
    clock = TurnBreakdown()
    decoding = time.perf_counter()
    if resumed:
        resumed_tokens = sum(part.n_tokens for part in resumed) - len(opening) - len(closing)
        growing = memory.reopen_reply(resumed[-1], len(closing))
        chunks, prefill = [[]] * len(resumed), 1
    else:
        tokens = rt.tokenize_parts([(frame.opening, True), (partial, False)])
        chunks = split_tokens(rt, tokens, memory.settings.block_tokens) or [[]]
        for k, chunk in enumerate(chunks[:-1]):
            rt.step_boundary()
            memory.append_decoded(Block(name=_reply_name(turn, k), role="assistant", turn=turn, tokens=chunk,
                                        text=rt.detokenize(chunk)), current=question)
        growing, prefill, resumed_tokens = None, len(tokens), len(tokens) - len(opening)
    clock.add("prompt_decode", time.perf_counter() - decoding)
    reply = _generate(memory, rt, chunks[-1], closing, params, on_token, cancel, turn, [], started,
                      next_opening=next_opening, question=question, first_part=len(chunks) - 1, clock=clock,
                      resumed=growing)
    reply.resumed_tokens = resumed_tokens
    reply.n_tokens += resumed_tokens
    reply.prefill_tokens = prefill
    reply.text = partial + reply.text
    history.append({"role": "assistant", "content": reply.text, "evoke_turn": turn})
    ending = time.perf_counter()
    memory.end_turn()
    clock.add("turn_end", time.perf_counter() - ending)
    memory.last_breakdown = reply.breakdown = _finished(clock, started)
    return reply


def _reply_name(turn: int, part: int) -> str:
    return f"assistant#{turn}" if part == 0 else f"assistant#{turn}.{part}"


def _finish_older_part(memory: ConversationMemory, rt: Runtime, reply_block: Block, turn: int,
                       part: int) -> tuple[Block, int]:
    """Split the growing reply block into finished blocks (evictable like any other) and a growing rest of at
    most one block; returns the growing block and its part number."""
    chunks = split_tokens(rt, reply_block.tokens, memory.settings.block_tokens)
    if len(chunks) < 2:
        return reply_block, part
    pieces = [Block(name=_reply_name(turn, part + k), role="assistant", turn=turn, tokens=chunk,
                    text=rt.detokenize(chunk)) for k, chunk in enumerate(chunks[:-1])]
    part += len(pieces)
    growing = Block(name=_reply_name(turn, part), role="assistant", turn=turn, tokens=list(chunks[-1]), text="")
    memory.split_reply(reply_block, [*pieces, growing])
    return growing, part


def _generate(memory: ConversationMemory, rt: Runtime, opening: list[int], closing: list[int],
              params: SamplingParams, on_token, cancel: threading.Event, turn: int,
              current: list[Block], started: float, last_block: Block | None = None,
              next_opening: list[int] = (), question: list[Block] = (), first_part: int = 0,
              clock: TurnBreakdown | None = None, resumed: Block | None = None) -> Reply:
    """Sample the reply. `last_block` (the message's last block, not yet decoded) goes into the same
    llama_decode call as the reply's opening: the first token waits for one decode, not two.
    `next_opening` is decoded ahead with the closing (see `_close_reply`). `current` (this turn's
    recoveries) and `question` are kept while the reply grows unless the budget needs their room; the
    reply's own older blocks leave like any other, so the budget never cuts a reply (`min_budget_tokens`).
    `first_part`: the part number the growing block starts at (a continued reply's earlier parts are decoded).
    `resumed`: a continued reply's growing block, already at the tail with its logits (`reopen_reply`).
    `clock` (a fresh one when None) gains the prompt's last decode, sampling, token decodes and detokenising."""
    clock = clock or TurnBreakdown()
    perf = time.perf_counter
    decoding = perf()
    part = first_part
    question = list(question)
    reply_block = resumed
    if reply_block is None:
        reply_block = Block(name=_reply_name(turn, first_part), role="assistant", turn=turn, tokens=list(opening),
                            text="")
        memory.open_reply(reply_block, last_block=last_block, current=[*current, *question])
    clock.add("prompt_decode", perf() - decoding)
    sample_s = token_decode_s = detokenize_s = 0.0
    memory.reply_starts()          # what the reply reads; with the capture on, what the message attends to

    reply_text = ReplyText(rt.token_bytes, params.stop)     # the text of the tokens in the KV, none of a stop's
    generated: list[int] = []
    stopped = "max_tokens"
    ttft = 0.0
    first_at = None
    with rt.sampler(params, rt.context_of(memory.seq), seq=memory.seq) as sampler:
        while len(generated) < params.max_tokens:
            if cancel.is_set():
                stopped = "cancelled"
                break
            at = perf()
            token = sampler.sample()
            sampled = perf()
            sample_s += sampled - at
            if rt.is_eog(token):
                stopped = "eos"
                break
            piece, stop = reply_text.add(token)
            detokenize_s += perf() - sampled
            if stop:
                if piece and on_token is not None:
                    on_token(piece)
                stopped = "stop"
                break
            if first_at is None:
                first_at = perf()
                ttft = first_at - started
                clock.add("sample", sample_s)
                clock.add("detokenize", detokenize_s)
                clock.mark_first_token(ttft)
                sample_s = detokenize_s = 0.0
            if piece and on_token is not None:
                on_token(piece)
            if memory.reply_needs_room():
                reply_block, part = _finish_older_part(memory, rt, reply_block, turn, part)
                if not memory.make_reply_room(current, question, reply_block):
                    stopped = "budget"
                    break
            at = perf()            # the token's decode is the reply's step point: other replies and jobs run
            memory.grow_reply(reply_block, token)    # first, or it joins their shared step (`Runtime.decode`)
            token_decode_s += perf() - at
            generated.append(token)
    rest = reply_text.finish() if stopped != "stop" else ""
    if rest and on_token is not None:
        on_token(rest)
    text = reply_text.text
    tail = _end_before_stop(memory, rt, reply_block, generated, text) if stopped == "stop" else []
    decode_s = time.perf_counter() - first_at if first_at else 0.0
    clock.add("sample", sample_s)
    clock.add("token_decode", token_decode_s)
    clock.add("detokenize", detokenize_s)
    closing_at = perf()
    _close_reply(memory, rt, turn, [], generated, [*tail, *closing], text, [*current, *question], reply_block,
                 next_opening=next_opening, first_part=part)
    clock.add("turn_end", perf() - closing_at)
    return Reply(text=text, n_tokens=len(generated), stopped=stopped, ttft_s=ttft, decode_s=decode_s,
                 prefill_tokens=0, recovered=[], opening_tokens=0 if resumed else len(opening))


def _end_before_stop(memory: ConversationMemory, rt: Runtime, reply_block: Block, generated: list[int],
                     text: str) -> list[int]:
    """Take the start of the stop string that ended the reply back out of its KV (`tokens_before_stop`) and return
    the tokens of the text those tokens held before it, decoded in their place with the closing. Where an older
    part of the reply (split off while it grew) holds some of them, the KV is left as it is."""
    kept, rest = tokens_before_stop(rt.token_bytes, generated, text)
    in_block = min(reply_block.n_tokens, len(generated))    # the growing block ends with the last generated tokens
    if len(generated) - kept > in_block:
        return []
    memory.take_back_reply(reply_block, len(generated) - kept)
    return rt.tokenize_parts([(rest, False)])


def _close_reply(memory: ConversationMemory, rt: Runtime, turn: int, opening: list[int], generated: list[int],
                 closing: list[int], text: str, current: list[Block], reply_block: Block | None = None, *,
                 next_opening: list[int] = (), first_part: int = 0) -> None:
    """Decode the template's closing tokens and split the reply into assistant blocks. The opening of
    the next user message (`next_opening`) is decoded in the same call and held ahead: the next turn's
    first token then waits for the message's own tokens only. `first_part`: the part number of
    `reply_block` (parts before it were finished while the reply grew)."""
    if reply_block is None:
        reply_block = Block(name=f"assistant#{turn}", role="assistant", turn=turn, tokens=list(opening), text="")
        memory.open_empty_reply(reply_block, room=len(opening) + len(closing), current=current)
    memory.close_reply(reply_block, closing, next_opening=next_opening, current=current)
    chunks = split_tokens(rt, reply_block.tokens, memory.settings.block_tokens)
    pieces = []
    for k, chunk in enumerate(chunks):
        name = _reply_name(turn, first_part + k)
        pieces.append(Block(name=name, role="assistant", turn=turn, tokens=chunk, text=rt.detokenize(chunk)))
    memory.split_reply(reply_block, pieces)


def replay_input(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict],
                 text: str, attachments: Sequence[Attachment], *, system: dict | None = None,
                 role: str = "user", extra: dict | None = None,
                 on_block: Callable[[Block], None] | None = None) -> None:
    """Re-prefill one past input message from its history text (a KV rebuild): same blocks as `run_turn`."""
    turn = memory.begin_turn()
    message = input_message(text, attachments, turn, role, extra)
    segment = template.message_segment([*([system] if system else []), *history], message)
    history.append(message)
    memory.set_query(text)
    for block in message_blocks(rt, segment, text, attachments, turn, memory.settings.block_tokens):
        memory.append_decoded(block)
        if on_block is not None:
            on_block(block)


def replay_reply(memory: ConversationMemory, rt: Runtime, template: ChatTemplate, history: list[dict],
                 reply_text: str, *, system: dict | None = None,
                 on_block: Callable[[Block], None] | None = None) -> None:
    """Re-prefill one past reply from its text; a reply with no input before it opens a turn of its own."""
    opens_a_turn = not history or history[-1].get("role") == "assistant"
    turn = memory.begin_turn() if opens_a_turn else memory.turn
    frame = template.assistant_frame([*([system] if system else []), *history])
    reply_tokens = rt.tokenize_parts([(frame.opening, True), (reply_text, False), (frame.closing, True)])
    for k, chunk in enumerate(split_tokens(rt, reply_tokens, memory.settings.block_tokens)):
        name = f"assistant#{turn}" if k == 0 else f"assistant#{turn}.{k}"
        block = Block(name=name, role="assistant", turn=turn, tokens=chunk, text=rt.detokenize(chunk))
        memory.append_decoded(block)
        if on_block is not None:
            on_block(block)
    history.append({"role": "assistant", "content": reply_text, "evoke_turn": turn})
    if memory.query is not None:
        memory.focus.update(memory.query)
    memory.end_turn()
