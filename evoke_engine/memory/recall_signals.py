"""Recovery signals that see facts, not block averages: line-level dense max-similarity, BM25 over lines (SQLite
FTS5, or the code-aware `lexical` module), their reciprocal-rank fusion, and the margin rule for user messages;
with `skip_questions`, a user's earlier question that asks for a value (`asks_for_value`) is no line of either;
with `value_lines`, only lines that hold a value set a block's dense score (`value_lines.py`); with `glosses`, the
loaded model's gloss of a value line is one more line of its block in both signals (`glosses.py`).

Invariants: pure ranking over plain blocks and one embedder (no llama.cpp); line vectors are cached per embedder
by block content hash, file name where it is a line, whether questions are skipped, the versions of the spelled-out
text and the words where those are on, the block's glosses' digest and whether a gloss is embedded alone (an
embedder switch never mixes vectors, nor a KV file's vectors of another text), seeded from a KV file on a reopen
(`seed_lines`) and exported into it (`export_lines`); the engine's decisions never embed lines (`embed_lines=False`);
mode "block" reproduces the one-vector-per-block cosine exactly; every score a decision used is returned by `explain`.
"""

from __future__ import annotations

import re
import sqlite3
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from functools import lru_cache

import numpy as np

from ..kvcache.blocks import Block
from ..settings import RECALL_SIGNALS as SIGNALS
from . import lexical as code_lexical
from .embedder import Embedder
from .glosses import BOOK as GLOSSES
from .glosses import gloss_line
from .line_context import bare_declaration, expansions, read_as_words, spell_out
from .value_lines import value_line_scores, value_mask

RRF_K = 60                        # the usual reciprocal-rank-fusion constant (Cormack et al.)
CACHE_BLOCKS = 4096               # line vectors kept per embedder (LRU by block content hash)
# The version of the text a structured line is embedded as (`line_context.spell_out`). It is part of `line_key`, so a
# KV file's vectors of another text are never taken for these (a file written before has none of this version: its
# blocks' lines are embedded again at the next turn end). Bump it when `spell_out` changes what it writes.
LINE_CONTEXT_VERSION = 3
# The version of `line_context.read_as_words` (identifiers read as words, abbreviations expanded: `recall_identifier_
# words`), part of `line_key` where that is on (`|w1`) for the same reason. Bump it when `read_as_words` changes.
WORDS_VERSION = 1
# Whether the engine's decisions read lines with `words` (issue 61, first pass; where the working set has grown, see
# `ConversationMemory._identifier_words_apply`): on, measured on the dev, held and paraphrase day scripts
# (docs/benchmarks.md). A policy constant here until it is a `Settings` field (settings.py is another owner's file);
# `bench day|retrieval --identifier-words on|off` sets it for a run.
IDENTIFIER_WORDS = True
# Whether a structured line is also embedded spelled out with its context (`line_context.spell_out`: the file's words,
# its parent keys, JSON path, SQL table or compose service, the name as words) *beside* the line as written, where
# the words apply (issue 61, second pass; `recall_line_context` embeds it instead of the line). `bench day
# --context-beside on|off` sets it for a run. Its version is part of `line_key` (`|x1`).
CONTEXT_BESIDE = False
CONTEXT_BESIDE_VERSION = 1
# Whether the words' reading also drops a declaration's syntax (`line_context.bare_declaration`: `export const`, a SQL
# column's type and constraints) from what the embedder sees (issue 61, third pass; on since the eighth: the reworded
# script's TypeScript constants, dev and held no worse, docs/benchmarks.md); `bench day --bare-declarations on|off`
# sets it for a run. Part of `line_key` with the words (`|w1d2`).
BARE_DECLARATIONS = True
BARE_DECLARATIONS_VERSION = 2
# Whether a message that asks for a value is embedded as its question alone (`question_only`: "Quick one: How long
# does the proxy wait? Thanks!" -> "How long does the proxy wait?") for the dense signal (issue 61, third pass);
# `bench day --question-query on|off` sets it for a run. The lexical signal reads the whole message either way.
QUESTION_QUERY = False
# Whether the dense signal embeds a glossed line's gloss alone (`how often the status page reloads, in milliseconds`)
# instead of the gloss followed by its line (issue 61, sixth pass): the line's identifiers and syntax pull the vector
# towards the code and away from the question's plain words. The line stays one line of its block (a value line, read
# whole by BM25); only what its vector is made of changes. `bench day --gloss-alone on|off` sets it for a run; part
# of `line_key` where glosses are read (`|a1`).
GLOSS_ALONE = False
GLOSS_ALONE_VERSION = 1
_MARKUP = re.compile(r"<\|[^|>]*\|>")
_ROLE_LINE = re.compile(r"^(system|user|assistant|tool)$")
_CASE_TURN = re.compile(r"[a-z][A-Z]")
_FILE_MARK = re.compile(r"^\[(end of )?file [^\]\n]*\]$")      # turn.render_user_content's framing of a file
_WORD = re.compile(r"[A-Za-z0-9]+")
_ASKS = re.compile(r"[A-Za-z0-9)\]\"'`]\?(\s+[^?]{0,40})?$")     # ends asking, a short tail allowed ("Thanks!")
_WH_WORD = re.compile(r"\b(what|which|who|whom|whose|when|where|how)\b", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how", "i", "in",
    "is", "it", "its", "me", "my", "of", "on", "or", "our", "so", "that", "the", "their", "them", "there",
    "this", "to", "was", "we", "what", "when", "where", "which", "who", "whom", "why", "will", "with", "you",
    "your", "answer", "exact", "please", "reply", "just"})

# mode -> (dense signal: "block" | "lines" | None, lexical signal: "fts5" | "code" | None)
MODES: dict[str, tuple[str | None, str | None]] = {
    "block": ("block", None), "lines": ("lines", None), "lines+lexical": ("lines", "fts5"),
    "block+lexical": ("block", "fts5"), "lexical": (None, "code"), "fused": ("lines", "code")}
assert set(MODES) == set(SIGNALS), "settings.RECALL_SIGNALS and recall_signals.MODES name the same modes"

_line_cache: weakref.WeakKeyDictionary[Embedder, OrderedDict[str, tuple[list[str], np.ndarray | None]]] = \
    weakref.WeakKeyDictionary()


def block_lines(text: str) -> list[str]:
    """The block's text as lines (long ones cut at sentence ends), template markup dropped; very short
    lines are joined to the next one so a heading or an 'OK' never stands as a fact of its own."""
    return list(_block_lines(text))


@lru_cache(maxsize=1 << 14)
def _block_lines(text: str) -> tuple[str, ...]:
    """`block_lines`, once per distinct text (a decision reads every candidate's lines each turn)."""
    text = _MARKUP.sub("\n", text)
    pieces: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _ROLE_LINE.match(line) or _FILE_MARK.match(line):
            continue
        if len(line) > 240:
            pieces.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", line) if s.strip())
        else:
            pieces.append(line)
    merged: list[str] = []
    carry = ""
    for piece in pieces:
        piece = f"{carry} {piece}".strip() if carry else piece
        if len(piece) < 24:
            carry = piece
            continue
        merged.append(piece)
        carry = ""
    if carry:
        if merged:
            merged[-1] = f"{merged[-1]} {carry}"
        else:
            merged.append(carry)
    return tuple(merged)


def asks_for_value(line: str) -> bool:
    """A question that asks for something it does not hold: it ends asking, names what it wants with a wh-word and
    carries no number (`Quick one: How long does the proxy wait? Thanks!`). It states no fact, so an old one must not
    outrank the block that answers it. Polar and tag questions assert what they ask about and stay fact lines
    (`did I mention the freeze starts in June?`, `the timeout is 30 s now, right?`), as does any line with a digit."""
    return bool(_ASKS.search(line)) and bool(_WH_WORD.search(line)) and not _DIGIT.search(line)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def question_only(text: str) -> str:
    """The question of a message that asks for a value (`message_asks`): its sentences that end asking, each from
    after its last `: ` (a lead-in like "Quick one:" or "Sorry, I forgot:" says nothing of what is asked), joined;
    any other message as written."""
    if not message_asks(text):
        return text
    asked = []
    for sentence in _SENTENCE_END.split(_MARKUP.sub(" ", text).strip()):
        if sentence.rstrip().endswith("?") and _WH_WORD.search(sentence):
            tail = sentence.rsplit(": ", 1)[-1]
            asked.append(tail if _WH_WORD.search(tail) else sentence)
    return " ".join(asked) or text


def fact_lines(block: Block, skip_questions: bool = False, line_context: bool = False, before: str = "",
               glosses: bool = False, beside: bool = False) -> list[str]:
    """The block's lines that may hold a fact: `block_lines`, less a user message's lines that `asks_for_value`
    when `skip_questions` (an assistant's or a file's lines are never questions the user asked); with
    `line_context`, each structured line spelled out with its file's name and parent keys (`line_context.spell_out`;
    `before`: the same file's text ahead of the block, read for parent keys); with `glosses`, each value line the
    loaded model glossed is followed by its gloss line (`glosses.gloss_line`), after the block's own lines; with
    `beside` (and not `line_context`), the spelled-out lines that differ from the written ones follow them."""
    if line_context or beside:
        text = spell_out(_MARKUP.sub("\n", block.text), block.file_name, _MARKUP.sub("\n", before))
        spelled = list(_fact_lines(text, block.role, skip_questions))
    if line_context:
        lines = spelled
    else:
        lines = list(_fact_lines(block.text, block.role, skip_questions))
        if beside:
            written = set(lines)
            lines += [line for line in dict.fromkeys(spelled) if line not in written]
    return [*lines, *GLOSSES.lines(block.hash)] if glosses else lines


@lru_cache(maxsize=1 << 14)
def _fact_lines(text: str, role: str, skip_questions: bool) -> tuple[str, ...]:
    """`fact_lines` of a text in a role, once per distinct one."""
    lines = _block_lines(text)
    if skip_questions and role == "user":
        return tuple(line for line in lines if not asks_for_value(line))
    return lines


def message_asks(text: str) -> bool:
    """Whether a message asks for a value in one of its lines (`asks_for_value`)."""
    return any(asks_for_value(line) for line in block_lines(text))


def only_asks(block: Block) -> bool:
    """A user message that states nothing: it has lines and every one `asks_for_value` (`Quick one: how long does
    the proxy wait? Thanks!`). A file's or an assistant's block never only asks."""
    return block.role == "user" and bool(_block_lines(block.text)) and not _fact_lines(block.text, "user", True)


def line_key(block: Block, file_names: bool = False, skip_questions: bool = False, line_context: bool = False,
             words: bool = False, glosses: bool = False, beside: bool = False) -> str:
    """The cache key of a block's lines: its content hash, with its file's name where that is one of the lines, a
    mark where its questions are left out (a user message's, with `skip_questions`), the version of the spelled-
    out text where structured lines are embedded with their context (`line_context`: `|c1`), that of the words
    identifiers are read as (`words`: `|w1`), that of the spelled-out lines beside the written ones (`beside`: `|x1`)
    and, with `glosses`, its glosses' digest where it has any (`|g1.…`)."""
    key = f"{block.hash}|{block.file_name}" if file_names and block.file_name else block.hash
    key = f"{key}|q" if skip_questions and block.role == "user" else key
    key = f"{key}|c{LINE_CONTEXT_VERSION}" if line_context else key
    key = f"{key}|w{WORDS_VERSION}" if words else key
    key = f"{key}d{BARE_DECLARATIONS_VERSION}" if words and BARE_DECLARATIONS else key
    key = f"{key}|x{CONTEXT_BESIDE_VERSION}" if beside and not line_context else key
    if not glosses:
        return key
    suffix = GLOSSES.suffix(block.hash)
    return f"{key}{suffix}|a{GLOSS_ALONE_VERSION}" if suffix and GLOSS_ALONE else f"{key}{suffix}"


def file_name_line(file_name: str) -> str:
    """A file's name as a line of its own for the embedder (`docker/api.Dockerfile` -> `file docker api Dockerfile`):
    a question that names what the file is about ("the image", "the workflow") meets its blocks."""
    return "file " + " ".join(_WORD.findall(code_words(file_name)))


def line_vectors(embedder: Embedder, blocks: Iterable[Block], *, file_names: bool = False,
                 skip_questions: bool = False, line_context: bool = False, words: bool = False,
                 glosses: bool = False, beside: bool = False,
                 before: Callable[[Block], str] | None = None) -> dict[str, tuple[list[str], np.ndarray | None]]:
    """Lines and their unit vectors for each block (by `line_key`), embedded in one batch where missing; with
    `file_names`, a file's block has its file's name as one more line; with `skip_questions`, a user message's
    lines are its `fact_lines` (none, when all of it asks); with `line_context`, structured lines are embedded
    spelled out (`before(block)`: its file's text ahead of it, for parent keys); with `words`, every line is embedded
    as `line_context.read_as_words` reads it (identifiers as words, abbreviations expanded) instead of `code_words`;
    with `glosses`, the model's gloss lines of its value lines are embedded beside them, with `beside` the spelled-
    out form of its structured lines (`fact_lines`).
    A decision on the critical path embeds nothing: it reads `cached_lines`."""
    cache = _line_cache.setdefault(embedder, OrderedDict())
    keys = {b: line_key(b, file_names, skip_questions, line_context, words, glosses, beside) for b in blocks
            if b.text.strip()}
    missing: dict[str, list[str]] = {}
    alone: dict[str, str] = {}                      # a gloss line -> its gloss, with GLOSS_ALONE
    for block, key in keys.items():
        if key in cache:
            cache.move_to_end(key)                     # kept through this call's own evictions
        elif key not in missing:
            ahead = before(block) if (line_context or beside) and before is not None and block.file_name else ""
            lines = fact_lines(block, skip_questions, line_context, ahead, glosses, beside)
            named = file_names and bool(block.file_name)
            missing[key] = [*lines, file_name_line(block.file_name)] if named else lines
            if glosses and GLOSS_ALONE:
                alone.update((gloss_line(line, gloss), gloss) for line, gloss in GLOSSES.of(block.hash))
    if missing:
        read = (_read_bare if BARE_DECLARATIONS else read_as_words) if words else code_words
        flat = [alone[line] if line in alone else read(line) for lines in missing.values() for line in lines]
        vectors = embedder.embed(flat) if flat else None
        if vectors is None and getattr(embedder, "warming", False):
            return cached_lines(embedder, keys.values())      # warming: the missing ones are embedded once it is ready
        at = 0
        for key, lines in missing.items():
            cache[key] = (lines, None if vectors is None else vectors[at:at + len(lines)])
            at += len(lines)
        while len(cache) > CACHE_BLOCKS:
            cache.popitem(last=False)
    return cached_lines(embedder, keys.values())


def _read_bare(line: str) -> str:
    """A line as the embedder reads it with `BARE_DECLARATIONS`: its declaration's syntax dropped, then as words."""
    return read_as_words(bare_declaration(line))


def cached_lines(embedder: Embedder, keys: Iterable[str]) -> dict[str, tuple[list[str], np.ndarray | None]]:
    """The cached lines and vectors of these `line_key`s, each marked recently used (a decision on the critical
    path computes each block's key once and embeds nothing)."""
    cache = _line_cache.setdefault(embedder, OrderedDict())
    found = {}
    for key in keys:
        entry = cache.get(key)
        if entry is not None:
            cache.move_to_end(key)
            found[key] = entry
    return found


def code_words(line: str) -> str:
    """The line as the embedder reads it: identifiers split into words (`MAX_UPLOAD_CHUNK_BYTES = 4096` ->
    `MAX UPLOAD CHUNK BYTES = 4096`, `maxConcurrentJobs` -> `max Concurrent Jobs`); prose is unchanged."""
    def split(match: re.Match) -> str:
        word = match.group(0)
        if "_" not in word.strip("_") and not _CASE_TURN.search(word):
            return word
        return " ".join(p for piece in word.split("_") for p in code_lexical.CAMEL.findall(piece))
    return code_lexical.RAW.sub(split, line)


def lexical_lines(block: Block, skip_questions: bool = False, words: bool = False, glosses: bool = False) -> list[str]:
    """The block's lines as the code-aware BM25 reads them: a file's lines carry its path (`lib/db.py`: `lib db py`),
    so a question that names the module ("the DB helper") meets every line of it, not only the framing line; with
    `skip_questions`, a user message's are its `fact_lines`; with `words`, each line (and path) also carries the
    words its abbreviations stand for (`line_context.expansions`: `..._MS = 4500` gains `milliseconds`); with
    `glosses`, the model's gloss lines of its value lines follow (`glosses.gloss_line`)."""
    lines = list(_lexical_lines(block.text, block.role, block.file_name, skip_questions, words))
    return [*lines, *GLOSSES.lines(block.hash)] if glosses else lines


@lru_cache(maxsize=1 << 14)
def _lexical_lines(text: str, role: str, file_name: str | None, skip_questions: bool,
                   words: bool = False) -> tuple[str, ...]:
    """`lexical_lines` of a text in a role and file, once per distinct one."""
    lines = _fact_lines(text, role, skip_questions)
    if file_name:
        lines = tuple(f"{line} {file_name}" for line in lines)
    if words:
        lines = tuple(f"{line} {' '.join(extra)}" if (extra := expansions(line)) else line for line in lines)
    return lines


def reply_grounding(reply: str, message: str, blocks: Iterable[Block]) -> dict[Block, int]:
    """The blocks the reply's words came from: for each term of `reply` that is not in `message` (an echo of the
    question is no evidence) and occurs in exactly one of `blocks`, that block gets a count. `It is 9085.` grounds
    the one block holding `pool_size: 9085`; a reply of common words grounds nothing. Model-agnostic (read from
    the reply's text, with `lexical.terms`); blocks without such a term are absent."""
    asked = set(code_lexical.terms(message))
    said = {t for t in code_lexical.terms(reply) if t not in asked}
    if not said:
        return {}
    holders: dict[str, list[Block]] = {}
    for block in blocks:
        held = set().union(*(code_lexical.line_bag(line)[0] for line in lexical_lines(block)))
        for term in said & held:
            holders.setdefault(term, []).append(block)
    counts: dict[Block, int] = {}
    for owners in holders.values():
        if len(owners) == 1:
            counts[owners[0]] = counts.get(owners[0], 0) + 1
    return counts


def query_terms(text: str) -> list[str]:
    seen: list[str] = []
    for word in _WORD.findall(text.lower()):
        if len(word) > 1 and word not in STOPWORDS and word not in seen:
            seen.append(word)
    return seen


def bm25_by_block(lines: dict[str, list[str]], query: str) -> dict[str, float]:
    """Best-line BM25 (FTS5, Porter stemming) of each block key for the query's terms; higher is better."""
    terms = query_terms(query)
    if not terms:
        return {}
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE lines USING fts5(block UNINDEXED, body, tokenize='porter unicode61')")
        db.executemany("INSERT INTO lines(block, body) VALUES (?, ?)",
                       [(key, line) for key, block_lines_ in lines.items() for line in block_lines_])
        match = " OR ".join(f'"{t}"' for t in terms)
        best: dict[str, float] = {}
        for key, rank in db.execute("SELECT block, bm25(lines) FROM lines WHERE lines MATCH ?", (match,)):
            best[key] = max(best.get(key, 0.0), -float(rank))    # FTS5's bm25 is negative: lower is better
        return best
    finally:
        db.close()


def _ranks(values: dict[Block, float]) -> dict[Block, int]:
    order = sorted(values, key=lambda k: values[k], reverse=True)
    return {key: i + 1 for i, key in enumerate(order)}


class RecallSignal:
    """Scores for one recovery decision over saved candidates and resident blocks (the gate). With
    `embed_lines=False` (the engine's turns) it embeds nothing: a block whose line vectors are not cached yet is
    ranked by its block vector and its detail says `lines_pending`. With `value_lines` (the caller passes it when
    the message asks for a value), only a block's lines that hold a value set its dense score, and a block with
    none ranks after one whose value line matches as well (`value_lines.value_line_scores`; the embedded text and
    the line keys do not change)."""

    def __init__(self, mode: str, *, query_text: str, query: np.ndarray | Callable[[], np.ndarray | None] | None,
                 saved: list[Block], residents: list[Block], embedder: Embedder, user_margin: float = 0.0,
                 file_names: bool = False, skip_questions: bool = False, line_context: bool = False,
                 value_lines: bool = False, embed_lines: bool = True, words: bool = False,
                 glosses: bool = False, beside: bool = False) -> None:
        if mode not in SIGNALS:
            raise ValueError(f"recall signal {mode!r}: choose one of {', '.join(SIGNALS)}")
        self.mode = mode
        dense_kind, lexical_kind = MODES[mode]
        pool = [*saved, *residents]
        lexical: dict[Block, float] = {}
        if lexical_kind is not None:
            if lexical_kind == "fts5":
                by_hash = bm25_by_block({b.hash: fact_lines(b, skip_questions, glosses=glosses) for b in pool},
                                        query_text)
            else:
                by_hash = code_lexical.bm25_lines(
                    {b.hash: lexical_lines(b, skip_questions, words, glosses) for b in pool}, query_text)
            lexical = {b: by_hash[b.hash] for b in pool if b.hash in by_hash}
        by_lines = dense_kind == "lines" and query is not None and embedder.enabled
        keys = {b: line_key(b, file_names, skip_questions, line_context, words, glosses, beside) for b in pool} \
            if by_lines else {}
        if not by_lines:
            vectors = {}
        elif embed_lines:
            vectors = line_vectors(embedder, pool, file_names=file_names, skip_questions=skip_questions,
                                   line_context=line_context, words=words, glosses=glosses, beside=beside)
        else:
            vectors = cached_lines(embedder, keys.values())
        if callable(query):              # a message's vector made meanwhile (`Embedder.embed_soon`): needed from here
            query = query()
        self._query = query
        dense: dict[Block, float] = {}                 # in the pool's order: ties rank in it
        best_line: dict[Block, tuple[list[str], np.ndarray]] = {}     # its lines and their similarities
        pending: set[Block] = set()
        lines_apply = by_lines and query is not None
        for block in pool:
            value = None
            if lines_apply:
                entry = vectors.get(keys[block])
                if entry is None and block.text.strip():
                    pending.add(block)                 # not embedded yet: its block vector ranks it
                else:
                    lines, matrix = entry or ([], None)
                    if skip_questions and block.role == "user" and not lines:
                        value = -1.0                   # all of it asks: no line to match, last in the dense order
                    elif matrix is not None and len(lines):
                        sims = matrix @ query
                        value = float(sims.max())
                        best_line[block] = (lines, sims)
            dense[block] = _cos(block.embedding, query) if value is None else value
        # the message asks for a value: only lines that hold one set a block's dense score (`value_lines`)
        self._value_margin = value_line_scores(best_line, dense) if value_lines and best_line else None
        dense_rank = _ranks(dense)
        if dense_kind is None:                         # lexical alone: BM25, no hit scores 0
            lexical_rank = code_lexical.ranks(lexical, pool)
            score = {key: lexical.get(key, 0.0) for key in pool}
        elif lexical_kind == "code":                   # both full lists, ties after the last hit (Cormack et al.)
            lexical_rank = code_lexical.ranks(lexical, pool)
            score = {key: 1 / (RRF_K + dense_rank[key]) + 1 / (RRF_K + lexical_rank[key]) for key in pool}
        elif lexical:
            lexical_rank = _ranks(lexical)
            score = {key: 1 / (RRF_K + dense_rank[key]) + (1 / (RRF_K + lexical_rank[key]) if key in lexical else 0.0)
                     for key in dense}
        else:
            lexical_rank, score = {}, dict(dense)
        self.score_of = score
        # what `explain` reads, kept as computed: a decision explains only the few blocks it picks
        self._kinds = (dense_kind, lexical_kind)
        self._dense, self._best_line, self._pending = dense, best_line, pending
        self._lexical, self._lexical_rank, self._dense_rank = lexical, lexical_rank, dense_rank
        self._blocked: set[Block] = set()
        self._gate_user(saved, dense, score, user_margin)
        self.resident_best: dict[str, float] = {}
        for block in residents:
            self.resident_best[block.role] = max(score[block], self.resident_best.get(block.role, -1.0))

    def _gate_user(self, saved: list[Block], dense: dict[Block, float], score: dict[Block, float],
                   margin: float) -> None:
        """A saved user message competes only as the best saved match by `margin` (dense similarity):
        the user's own wording ('here are my files') otherwise outranks the chunk that holds the fact."""
        if margin <= 0 or not saved:
            return
        top = max(saved, key=lambda b: score[b])
        rivals = sorted((dense[b] for b in saved if b.role != "user"), reverse=True)[:1]
        for block in saved:
            if block.role != "user":
                continue
            ok = block is top and (not rivals or dense[block] >= rivals[0] + margin)
            if not ok:
                score[block] = -1.0
                self._blocked.add(block)

    def similarity(self, block: Block) -> float:
        return self.score_of.get(block, -1.0)

    def own_tops(self, blocks: Iterable[Block], n: int) -> list[Block]:
        """The best `n` of `blocks` by each signal alone, the dense one's first, no repeats (a lexical top needs a
        hit). A question in other words than the fact's line shares no term with it: the fused rank then buries
        the block the line vectors rank first behind every block that shares an asking word."""
        blocks = list(blocks)
        dense_kind, lexical_kind = self._kinds
        orders = []
        if dense_kind is not None:
            orders.append(sorted(blocks, key=lambda b: self._dense.get(b, -1.0), reverse=True)[:n])
        if lexical_kind is not None:
            hits = [b for b in blocks if self._lexical.get(b, 0.0) > 0]
            orders.append(sorted(hits, key=lambda b: self._lexical[b], reverse=True)[:n])
        return list(dict.fromkeys(b for order in orders for b in order))

    def explain(self, block: Block) -> dict:
        """The signal values behind `block`'s score (its recovery event and decision record)."""
        if block not in self._dense:
            return {}
        dense_kind, lexical_kind = self._kinds
        detail = {"signal": self.mode, "block_cosine": round(_cos(block.embedding, self._query), 3)}
        if block in self._best_line:
            lines, sims = self._best_line[block]
            at = int(np.argmax(sims))
            if self._value_margin is not None:
                held = np.flatnonzero(value_mask(lines))             # the lines that set the score
                at = int(held[np.argmax(sims[held])]) if held.size else at
                detail["value_line"] = bool(held.size) or f"none: best line less {self._value_margin:.3f}"
            detail.update(line_cosine=round(self._dense[block], 3), best_line=lines[at][:100])
        elif block in self._pending:
            detail["lines_pending"] = True
        if lexical_kind is not None:
            detail.update(bm25=round(self._lexical.get(block, 0.0), 3), lexical_rank=self._lexical_rank.get(block))
            if dense_kind is not None:
                detail.update(dense_rank=self._dense_rank[block], fused=round(self.score_of[block], 5))
        if block in self._blocked:
            detail["user_margin_blocked"] = True
        return detail


def _cos(a: np.ndarray | None, b: np.ndarray | None) -> float:
    if a is None or b is None:
        return 0.0
    return float(a @ b)


def prepare(embedder: Embedder, mode: str, blocks: Iterable[Block], *, file_names: bool = False,
            skip_questions: bool = False, line_context: bool = False, words: bool = False, glosses: bool = False,
            beside: bool = False, before: Callable[[Block], str] | None = None) -> None:
    """Embed the lines of `blocks` now (turn end, or a block just glossed), so a later recovery finds them cached."""
    if MODES[mode][0] == "lines" and embedder.enabled:
        line_vectors(embedder, blocks, file_names=file_names, skip_questions=skip_questions,
                     line_context=line_context, words=words, glosses=glosses, beside=beside, before=before)


def export_lines(embedder: Embedder, blocks: Iterable[Block]) -> dict[str, tuple[list[str], np.ndarray]]:
    """The cached line vectors of `blocks` (every `line_key` variant cached for them), for a KV file."""
    cache = _line_cache.get(embedder)
    if not cache:
        return {}
    hashes = {b.hash for b in blocks}
    return {key: (lines, vectors) for key, (lines, vectors) in cache.items()
            if vectors is not None and key.split("|", 1)[0] in hashes}


def seed_lines(embedder: Embedder, records: dict[str, tuple[list[str], np.ndarray]]) -> int:
    """Put line vectors read from a KV file into `embedder`'s cache (a reopen embeds none of them); the count
    added. The caller has checked that the file's vectors are this embedder's."""
    cache = _line_cache.setdefault(embedder, OrderedDict())
    added = 0
    for key, (lines, vectors) in records.items():
        if key not in cache and len(lines) == len(vectors):
            cache[key] = (list(lines), np.asarray(vectors, dtype=np.float32))
            added += 1
    while len(cache) > CACHE_BLOCKS:
        cache.popitem(last=False)
    return added


def clear_cache(embedder: Embedder) -> None:
    """Forget the line vectors cached for `embedder` (a bench measuring one conversation's own costs)."""
    _line_cache.pop(embedder, None)
