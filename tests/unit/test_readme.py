"""The README is one screen that points into docs/ (issue 58 item 18): under 250 lines, the command CI runs stated
in it, and every relative link in it and in docs/*.md naming a file (and a heading, where it names one) that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def relative_links(markdown: Path) -> list[str]:
    text = FENCE.sub("", markdown.read_text(encoding="utf-8"))       # code blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def heading_slugs(markdown: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but `-` and `_` dropped, spaces `-`."""
    slugs = set()
    for line in FENCE.sub("", markdown.read_text(encoding="utf-8")).splitlines():
        if match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            slugs.add(re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-"))
    return slugs


def ci_command() -> str:
    """The command `.ci/run` runs: its last line that is not a comment, `set` or `cd`."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    return commands[-1]


def test_readme_is_one_screen_under_250_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/ and link it"


def test_readme_states_the_test_command_ci_runs():
    command = ci_command()
    assert command == "make test"           # .ci/run: "Runs the README's test command"
    blocks = "\n".join(FENCE.findall(README.read_text(encoding="utf-8")))
    assert re.search(rf"^{re.escape(command)}(\s|$)", blocks, re.MULTILINE), \
        f"README.md's code blocks no longer show `{command}`, the command .ci/run runs"


def test_readme_says_how_to_get_a_real_model_and_where_the_endpoint_is():
    text = README.read_text(encoding="utf-8")
    assert re.search(r"^evoke-desk pull \S+", text, re.MULTILINE)
    assert "evoke-desk serve" in text and "http://127.0.0.1:8765/v1" in text and "OpenAI-compatible" in text


def test_every_relative_link_in_the_readme_and_docs_names_an_existing_file_and_heading():
    broken = []
    for markdown in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in relative_links(markdown):
            path_part, _, anchor = target.partition("#")
            file = (markdown.parent / path_part).resolve() if path_part else markdown
            if not file.exists():
                broken.append(f"{markdown.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in heading_slugs(file):
                broken.append(f"{markdown.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_links_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in relative_links(README)}
    pages = {page.resolve() for page in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(p.name for p in pages - linked)}"
