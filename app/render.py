"""Markdown to Qt rich-text HTML, with fenced code highlighted by Pygments and a copy link per block.

Pure functions, no Qt: raw HTML in a message is shown as text, never interpreted; an unclosed
fence (a reply still streaming) renders as code up to the end. `render_parts` gives the chat view text
and code apart (each code block gets its own widget that scrolls sideways); `render_markdown` gives
one HTML document (copy:<i> links) for places that show a message whole.
"""

from __future__ import annotations

import functools
import html
import re
from dataclasses import dataclass, field

import markdown
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

CODE_STYLE = "one-dark"
CODE_BG = "#1b1f27"
CODE_HEADER_BG = "#262b35"
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^\n`]*)\n", re.MULTILINE)


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)   # copy:<i> links index into this


def split_fences(text: str) -> list[tuple[str, str, str]]:
    """Split into ("text", body, "") and ("code", body, language) segments, in order."""
    segments: list[tuple[str, str, str]] = []
    pos = 0
    while True:
        match = _FENCE.search(text, pos)
        if match is None:
            break
        if match.start() > pos:
            segments.append(("text", text[pos:match.start()], ""))
        fence = match.group(2)
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = closing.search(text, match.end())
        lang = match.group(3).strip().split()[0] if match.group(3).strip() else ""
        if end is None:                       # still streaming: the rest is code
            segments.append(("code", text[match.end():], lang))
            return segments
        segments.append(("code", text[match.end():end.start()].rstrip("\n"), lang))
        pos = end.end() + 1
    if pos < len(text):
        segments.append(("text", text[pos:], ""))
    return segments


def _markdown() -> markdown.Markdown:
    md = markdown.Markdown(extensions=["tables", "sane_lists"], output_format="html")
    md.preprocessors.deregister("html_block")      # raw HTML stays text
    md.inlinePatterns.deregister("html")
    return md


_MD = _markdown()
_FORMATTER = HtmlFormatter(style=CODE_STYLE, noclasses=True, nowrap=True)


@functools.lru_cache(maxsize=64)
def _lexer(lang: str):
    try:
        return get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        return TextLexer()


def highlight_code(code: str, lang: str) -> str:
    """Pygments HTML for `code` (inline styles, no wrapper)."""
    if len(code) > 200_000:
        return html.escape(code)
    return highlight(code, _lexer(lang), _FORMATTER).rstrip("\n")


@functools.lru_cache(maxsize=256)
def _code_table(index: int, code: str, lang: str) -> str:
    label = html.escape(lang or "code")
    body = highlight_code(code, lang)
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" style="margin-top:6px; margin-bottom:6px;">'
        f'<tr><td style="background-color:{CODE_HEADER_BG}; color:#8b93a5; font-size:small;">{label}</td>'
        f'<td align="right" style="background-color:{CODE_HEADER_BG}; font-size:small;">'
        f'<a href="copy:{index}" style="color:#7aa2f7; text-decoration:none;">Copy</a></td></tr>'
        f'<tr><td colspan="2" style="background-color:{CODE_BG};">'
        f'<pre style="font-family:\'DejaVu Sans Mono\',monospace; color:#d7dae0; margin:0;">{body}</pre>'
        f"</td></tr></table>"
    )


@functools.lru_cache(maxsize=256)
def _convert(text: str) -> str:
    _MD.reset()
    return _MD.convert(text)


def render_markdown(text: str) -> Rendered:
    """HTML for QTextBrowser and the raw text of each fenced code block."""
    parts: list[str] = []
    blocks: list[str] = []
    for kind, body, lang in split_fences(text):
        if kind == "code":
            parts.append(_code_table(len(blocks), body, lang))
            blocks.append(body)
        elif body.strip():
            parts.append(_convert(body))
    return Rendered("".join(parts), blocks)


@dataclass(frozen=True)
class Part:
    """One piece of a message as the chat view shows it: Markdown as HTML, or one fenced code block."""

    kind: str                 # "html" | "code"
    html: str                 # the Markdown's HTML, or the code highlighted inside a <pre> (no wrapping)
    code: str = ""            # a code block's raw text (what Copy puts on the clipboard)
    lang: str = ""


@functools.lru_cache(maxsize=256)
def code_html(code: str, lang: str) -> str:
    """A highlighted <pre> for one code block; its lines never wrap (the view scrolls sideways)."""
    return (f'<pre style="font-family:\'DejaVu Sans Mono\',monospace; color:#d7dae0; margin:0; '
            f'white-space:pre;">{highlight_code(code, lang)}</pre>')


def render_parts(text: str) -> list[Part]:
    """The message's text and code parts, in order (empty text between fences is left out)."""
    parts: list[Part] = []
    for kind, body, lang in split_fences(text):
        if kind == "code":
            parts.append(Part("code", code_html(body, lang), body, lang))
        elif body.strip():
            parts.append(Part("html", _convert(body)))
    return parts


def render_plain(text: str) -> str:
    """HTML for text shown verbatim (user messages keep their line breaks)."""
    return "<p style='white-space:pre-wrap;'>" + html.escape(text) + "</p>"
