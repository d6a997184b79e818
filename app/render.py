"""Markdown to Qt rich-text HTML with markdown-it-py (CommonMark plus tables, strikethrough and linkify), fenced
code highlighted by Pygments.

Pure functions, no Qt. Invariants: raw HTML in a message is shown as text, never interpreted (markdown-it's
`html` option is off); links keep markdown-it's scheme check (no javascript:, vbscript:, file:, data:) and
images are not loaded (an image is shown as a link to it); an unclosed fence (a reply still streaming) is
code up to the end, as CommonMark says. `render_parts` gives the chat view the text and each top-level fenced
code block apart (a code block gets its own widget with a Copy button that scrolls sideways); a fence nested
in a list or a quote stays inside the text, highlighted. `render_markdown` gives one HTML document with a
copy:<i> link per fenced block, for places that show a message whole.
"""

from __future__ import annotations

import functools
import html
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.rules_core.linkify import linkify
from markdown_it.rules_core.state_core import StateCore
from markdown_it.rules_core.text_join import text_join
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

CODE_STYLE = "one-dark"
CODE_BG = "#1b1f27"
CODE_HEADER_BG = "#262b35"
LINK_COLOR = "#4493f8"
CODE_FONT = "font-family:'DejaVu Sans Mono',monospace; color:#d7dae0; margin:0;"


@dataclass
class Rendered:
    html: str
    code_blocks: list[str] = field(default_factory=list)   # copy:<i> links index into this


@dataclass(frozen=True)
class Part:
    """One piece of a message as the chat view shows it: Markdown as HTML, or one fenced code block."""

    kind: str                 # "html" | "code"
    html: str                 # the Markdown's HTML, or the code highlighted inside a <pre> (no wrapping)
    code: str = ""            # a code block's raw text (what Copy puts on the clipboard)
    lang: str = ""


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
def code_html(code: str, lang: str) -> str:
    """A highlighted <pre> for one code block; its lines never wrap (the view scrolls sideways)."""
    return f'<pre style="{CODE_FONT} white-space:pre;">{highlight_code(code, lang)}</pre>'


@functools.lru_cache(maxsize=256)
def _code_table(index: int, code: str, lang: str) -> str:
    """A whole-message code block: a header with the language and a copy:<index> link above the code."""
    label = html.escape(lang or "code")
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" style="margin-top:6px; margin-bottom:6px;">'
        f'<tr><td style="background-color:{CODE_HEADER_BG}; color:#8b93a5; font-size:small;">{label}</td>'
        f'<td align="right" style="background-color:{CODE_HEADER_BG}; font-size:small;">'
        f'<a href="copy:{index}" style="color:#7aa2f7; text-decoration:none;">Copy</a></td></tr>'
        f'<tr><td colspan="2" style="background-color:{CODE_BG};">'
        f'<pre style="{CODE_FONT}">{highlight_code(code, lang)}</pre>'
        f"</td></tr></table>"
    )


@functools.lru_cache(maxsize=256)
def _nested_code(code: str, lang: str) -> str:
    """A fence inside a list item or a quote: highlighted on the code background, inside the text."""
    return (f'<table width="100%" cellspacing="0" cellpadding="6" style="margin-top:4px; margin-bottom:4px;">'
            f'<tr><td style="background-color:{CODE_BG};"><pre style="{CODE_FONT}">{highlight_code(code, lang)}'
            f"</pre></td></tr></table>")


def fence_code(token: Token) -> tuple[str, str]:
    """A fence token's code (without the newline before the closing fence) and its language."""
    info = token.info.strip()
    return token.content.rstrip("\n"), info.split()[0] if info else ""


def _markdown_it() -> MarkdownIt:
    # "breaks": a line break in a chat message is a line break (as chat apps show it), not CommonMark's soft break
    md = MarkdownIt("commonmark", {"html": False, "linkify": True, "typographer": False, "breaks": True})
    md.enable(["table", "strikethrough", "linkify"])
    md.disable("image")                       # "![alt](src)" shows as "!" and a link: nothing is loaded
    rules = md.add_render_rule

    def table_open(self, tokens: Sequence[Token], idx: int, options, env) -> str:
        return '<table border="1" cellspacing="0" cellpadding="4" style="border-color:#5c6370;">\n'

    def fence(self, tokens: Sequence[Token], idx: int, options, env) -> str:
        code, lang = fence_code(tokens[idx])
        blocks = env.get("code_blocks") if isinstance(env, dict) else None
        if blocks is None:                    # render_parts: only fences nested in a list or a quote come here
            return _nested_code(code, lang)
        blocks.append(code)
        return _code_table(len(blocks) - 1, code, lang)

    def link_open(self, tokens: Sequence[Token], idx: int, options, env) -> str:
        tokens[idx].attrSet("style", f"color:{LINK_COLOR};")        # readable on the dark and the light theme
        return self.renderToken(tokens, idx, options, env)

    rules("table_open", table_open)
    rules("link_open", link_open)
    rules("fence", fence)
    md.core.ruler.at("inline", _cached_inline)   # inline + linkify + text_join, kept per run of inline text
    md.core.ruler.disable(["linkify", "text_join"])
    return md


_INLINE: OrderedDict[tuple[str, str], list[Token]] = OrderedDict()
INLINE_RUNS_KEPT = 4096


def _cached_inline(state: StateCore) -> None:
    """markdown-it's core rules `inline`, `linkify` and `text_join`, with the tokens of each run of inline text
    kept by its text (and the link references in scope): a streaming reply re-parses only the block that grows.
    The kept tokens are shared between documents; rendering only reads them (link_open sets the same style)."""
    references = state.env.get("references")
    scope = json.dumps(references, sort_keys=True) if references else ""
    for token in state.tokens:
        if token.type != "inline":
            continue
        key = (token.content, scope)
        children = _INLINE.get(key)
        if children is None:
            token.children = []
            state.md.inline.parse(token.content, state.md, state.env, token.children)
            alone = StateCore(token.content, state.md, state.env, [token])
            linkify(alone)
            text_join(alone)
            children = _INLINE[key] = token.children
            if len(_INLINE) > INLINE_RUNS_KEPT:
                _INLINE.popitem(last=False)
        else:
            _INLINE.move_to_end(key)
        token.children = children


_MD = _markdown_it()


@functools.lru_cache(maxsize=32)
def _tokens(text: str) -> tuple[Token, ...]:
    return tuple(_MD.parse(text))


def _render(tokens: Sequence[Token], env: dict | None = None) -> str:
    return _MD.renderer.render(list(tokens), _MD.options, {} if env is None else env)


def render_markdown(text: str) -> Rendered:
    """HTML for QTextBrowser and the raw text of each fenced code block (nested ones too, in order)."""
    blocks: list[str] = []
    rendered = _render(_tokens(text), {"code_blocks": blocks})
    return Rendered(rendered, blocks)


def _text_part(tokens: Sequence[Token]) -> Part | None:
    rendered = _render(tokens) if tokens else ""
    return Part("html", rendered) if rendered.strip() else None


@functools.lru_cache(maxsize=256)
def _parts(text: str) -> tuple[Part, ...]:
    tokens = _tokens(text)
    parts: list[Part] = []
    start = 0
    for i, token in enumerate(tokens):
        if token.type == "fence" and token.level == 0:
            if (before := _text_part(tokens[start:i])) is not None:
                parts.append(before)
            code, lang = fence_code(token)
            parts.append(Part("code", code_html(code, lang), code, lang))
            start = i + 1
    if (after := _text_part(tokens[start:])) is not None:
        parts.append(after)
    return tuple(parts)


def render_parts(text: str) -> list[Part]:
    """The message's text and top-level code parts, in order (empty text between fences is left out)."""
    return list(_parts(text))


def render_plain(text: str) -> str:
    """HTML for text shown verbatim (user messages keep their line breaks)."""
    return "<p style='white-space:pre-wrap;'>" + html.escape(text) + "</p>"
