"""Text attachments: read a file the user attached or dropped, name a large paste.

Invariant: only UTF-8 (or UTF-8 with BOM / Latin-1 fallback for plain text) files under
MAX_BYTES become attachments; anything else is refused with a readable AttachmentError.
"""

from __future__ import annotations

from pathlib import Path

MAX_BYTES = 4 << 20
LARGE_PASTE_CHARS = 2000
LARGE_PASTE_LINES = 40


class AttachmentError(Exception):
    """The file cannot be attached (missing, binary, too large); the message says why."""


def read_text_attachment(path: str | Path) -> tuple[str, str]:
    """(file name, text) of a text file, or AttachmentError."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise AttachmentError(f"cannot attach {path.name}: {exc.strerror or exc}") from exc
    if not path.is_file():
        raise AttachmentError(f"cannot attach {path.name}: not a file")
    if size > MAX_BYTES:
        raise AttachmentError(f"cannot attach {path.name}: {size / (1 << 20):.1f} MiB is over the "
                              f"{MAX_BYTES >> 20} MiB limit for text attachments")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"cannot attach {path.name}: {exc.strerror or exc}") from exc
    if b"\x00" in data[:8192]:
        raise AttachmentError(f"cannot attach {path.name}: it looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return path.name, text


def is_large_paste(text: str) -> bool:
    return len(text) >= LARGE_PASTE_CHARS or text.count("\n") >= LARGE_PASTE_LINES


def paste_name(text: str, taken: set[str]) -> str:
    """A file name for pasted text: pasted-N.<ext>, guessing a code extension from the content."""
    head = text.lstrip()[:400]
    ext = "txt"
    if head.startswith(("def ", "import ", "from ", "class ", "#!/usr/bin/env python")):
        ext = "py"
    elif head.startswith(("{", "[")):
        ext = "json"
    elif head.startswith(("#include", "int main")):
        ext = "c"
    n = 1
    while f"pasted-{n}.{ext}" in taken:
        n += 1
    return f"pasted-{n}.{ext}"
