"""Names of KV cache files: `<conversation id>.<ttl class>.bin`, temp files `.<id>.<random>.tmp`, and
model-hash folder names (16 lowercase hex).

Invariants: conversation ids are `[A-Za-z0-9_-]{1,128}` (no dots, so a name parses one way); a name
without a TTL class (`<id>.bin`) counts as "long", as in the Eliza-1 precache note.
"""

from __future__ import annotations

import re
import secrets

TTL_CLASSES = ("short", "long", "extended")
UNCLASSED_TTL = "long"
DEFAULT_TTL_SECONDS: dict[str, float] = {"short": 5 * 60.0, "long": 60 * 60.0, "extended": 24 * 3600.0}

_ID = r"[A-Za-z0-9_-]{1,128}"
_CONVERSATION_ID = re.compile(_ID)
_CACHE_FILE = re.compile(rf"(?P<id>{_ID})(?:\.(?P<ttl>{'|'.join(TTL_CLASSES)}))?\.bin")
_TEMP_FILE = re.compile(rf"\.(?P<id>{_ID})\.[0-9a-f]{{16}}\.tmp")
_MODEL_HASH = re.compile(r"[0-9a-f]{16}")


def check_conversation_id(conversation_id: str) -> str:
    if not isinstance(conversation_id, str) or not _CONVERSATION_ID.fullmatch(conversation_id):
        raise ValueError(f"conversation id {conversation_id!r} is not usable in a file name "
                         "(allowed: 1-128 of A-Z a-z 0-9 _ -)")
    return conversation_id


def check_ttl_class(ttl_class: str) -> str:
    if ttl_class not in TTL_CLASSES:
        raise ValueError(f"unknown TTL class {ttl_class!r}; valid: {', '.join(TTL_CLASSES)}")
    return ttl_class


def is_model_hash(name: str) -> bool:
    return bool(_MODEL_HASH.fullmatch(name))


def cache_file_name(conversation_id: str, ttl_class: str) -> str:
    return f"{check_conversation_id(conversation_id)}.{check_ttl_class(ttl_class)}.bin"


def candidate_names(conversation_id: str) -> list[str]:
    """Every name a conversation's file may have: one per TTL class plus the unclassed `<id>.bin`."""
    check_conversation_id(conversation_id)
    return [f"{conversation_id}.{ttl}.bin" for ttl in TTL_CLASSES] + [f"{conversation_id}.bin"]


def temp_file_name(conversation_id: str) -> str:
    return f".{check_conversation_id(conversation_id)}.{secrets.token_hex(8)}.tmp"


def parse_cache_file_name(filename: str) -> tuple[str, str] | None:
    """(conversation id, ttl class) for a well-formed cache file name, else None."""
    match = _CACHE_FILE.fullmatch(filename)
    if match is None:
        return None
    return match["id"], match["ttl"] or UNCLASSED_TTL


def is_temp_file_name(filename: str) -> bool:
    return bool(_TEMP_FILE.fullmatch(filename))


def parse_ttl_class(filename: str) -> str:
    """The TTL class encoded in `<base>.<ttl>.bin`; names without a known class count as "long"."""
    base = filename[:-len(".bin")] if filename.endswith(".bin") else filename
    _, dot, suffix = base.rpartition(".")
    return suffix if dot and suffix in TTL_CLASSES else UNCLASSED_TTL
