"""Code-aware lexical matching: identifiers split on `_`, camelCase and dots (the whole identifier kept too),
numbers kept as tokens, lowercased, plural-stemmed; Okapi BM25 of a message's terms over lines.

Invariants: pure functions of text (no embedder, no SQLite, no llama.cpp); the same tokenizer reads messages and
lines; a block's score is its best line's (a fact is one line), statistics are the candidate lines' own.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

K1, B = 1.2, 0.75                    # the usual BM25 constants (Robertson et al.)
RAW = re.compile(r"[A-Za-z0-9_]+")
CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# General English function words only (no workload's wording): they carry no topic.
_FUNCTION_WORDS = """
a about above after again against all also am an and any are as at be been before being below between both but by
can could did do does doing down during each few for from further had has have having he her here hers him his how
i if in into is it its itself just let me more most my no nor not now of off on once only or other our ours out over
own same she should so some such than that the their theirs them then there these they this those through to too
under until up very was we were what when where which while who whom why will with would you your yours
"""
STOPWORDS = frozenset(_FUNCTION_WORDS.split())


def stem(word: str) -> str:
    """A light plural stemmer (Harman's S-stemmer): `retries` -> `retry`, `classes` -> `class`, `jobs` -> `job`."""
    if len(word) > 4 and word.endswith("ies") and word[-4] not in "ae":
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "xes", "ches", "shes", "zzes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "os")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Lexical terms of `text`, in order, repeats kept: `maxConcurrentJobs` gives `max`, `concurrent`, `job` and
    `maxconcurrentjobs`; `lib/db.py` gives `lib`, `db`, `py`; `5432` stays `5432`. Stopwords and one-letter words
    are dropped (one-digit numbers stay)."""
    out: list[str] = []
    for raw in RAW.findall(text):
        parts = [p.lower() for piece in raw.split("_") for p in CAMEL.findall(piece)]
        for part in parts:
            if part in STOPWORDS or (len(part) < 2 and not part.isdigit()):
                continue
            out.append(part if part.isdigit() else stem(part))
        if len(parts) > 1:
            out.append(raw.lower().replace("_", ""))      # the identifier as a whole: a name asked for exactly
    return out


def bm25_lines(lines: Mapping[str, Sequence[str]], query: str) -> dict[str, float]:
    """Best-line BM25 of each key's lines for the query's distinct terms; keys without a matching line are
    absent. Document frequencies and lengths are those of all the given lines (summed from each key's own, which
    are kept per distinct set of lines: a decision reads the same blocks' lines turn after turn)."""
    wanted = list(dict.fromkeys(terms(query)))
    if not wanted:
        return {}
    keyed = [(key, _lines_summary(tuple(key_lines))) for key, key_lines in lines.items()]
    n = sum(len(docs) for _, (docs, _, _) in keyed)
    if not n:
        return {}
    avg = sum(length for _, (_, _, length) in keyed) / n
    wanted_set = set(wanted)
    df: Counter = Counter()
    for _, (_, key_df, _) in keyed:
        for t in wanted_set.intersection(key_df):
            df[t] += key_df[t]
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in wanted if df[t]}
    best: dict[str, float] = {}
    for key, (docs, key_df, _) in keyed:
        if key_df.keys().isdisjoint(idf):
            continue
        for bag, length in docs:
            if bag.keys().isdisjoint(idf):
                continue
            score = sum(idf[t] * bag[t] * (K1 + 1) / (bag[t] + K1 * (1 - B + B * length / avg))
                        for t in idf if t in bag)
            if score > 0:
                best[key] = max(best.get(key, 0.0), score)
    return best


@lru_cache(maxsize=1 << 14)
def _lines_summary(key_lines: tuple[str, ...]) -> tuple[tuple[tuple[Counter, int], ...], Counter, int]:
    """One key's lines for `bm25_lines`: the (bag, length) of each line that has terms, in how many of them each
    term occurs, and their total length."""
    docs = tuple(bag for line in key_lines if (bag := line_bag(line))[1])
    return docs, Counter(t for bag, _ in docs for t in bag), sum(length for _, length in docs)


@lru_cache(maxsize=1 << 16)
def line_bag(line: str) -> tuple[Counter, int]:
    """A line's term counts and length, computed once per distinct line (a decision reads every candidate's
    lines each turn; the text of a line never changes). Callers never mutate the Counter."""
    bag = Counter(terms(line))
    return bag, sum(bag.values())


def ranks(values: Mapping, keys: Iterable) -> dict:
    """1-based ranks of `keys` by `values` (higher first); keys without a value share the rank after the last."""
    order = sorted((k for k in keys if k in values), key=lambda k: values[k], reverse=True)
    rank = {k: i + 1 for i, k in enumerate(order)}
    return {k: rank.get(k, len(order) + 1) for k in keys}
