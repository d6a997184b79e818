"""`evoke-desk models` (the catalogue, hub search, a repository's files, and what is on disk, marked) and
`evoke-desk pull REPO[:QUANT|:FILE]` (a download with a terminal progress line), for evoke_engine/__main__.py.

Invariants: results go to stdout, progress and errors to stderr; exit 0 on success, 2 on an error said in one
line, 130 on Ctrl-C (a pull keeps its partial file and says that the same command resumes it). Offline, `models`
still lists the catalogue and the files on disk and says the hub could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from .catalogue import Catalogue, load_catalogue, local_models, models_dir
from .download import DownloadProgress, pull
from .errors import ModelHubError, format_bytes
from .hub import hub_endpoint, list_gguf_files, search_gguf


def add_models_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--search", metavar="TEXT", help="search the Hugging Face hub for GGUF repositories")
    p.add_argument("--files", metavar="REPO", help="list a hub repository's GGUF files with sizes and sha256")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_pull_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="REPO[:QUANT|:FILE]",
                   help="a hub repository (owner/name), optionally :QUANT (Q4_K_M) or :FILE.gguf, or a catalogue "
                        "id from `evoke-desk models` (qwen2.5-coder-7b-instruct)")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default main)")


def _folder() -> Path:
    from ..settings import Settings

    return models_dir(Settings.load().data_dir)


def _error(message: object) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def models_main(args: argparse.Namespace) -> int:
    try:
        catalogue, folder = load_catalogue(), _folder()
    except (ModelHubError, ValueError) as exc:
        return _error(exc)
    try:
        if args.search:
            return _print_search(args.search, args.json)
        if args.files:
            return _print_files(args.files, folder, args.json)
    except ModelHubError as exc:
        return _error(exc)
    return _print_catalogue(catalogue, folder, args.json)


def _print_catalogue(catalogue: Catalogue, folder: Path, as_json: bool) -> int:
    on_disk = local_models(folder, catalogue)
    have = {(m.catalogue_id, m.quant) for m in on_disk}
    if as_json:
        print(json.dumps({"catalogue_version": catalogue.version, "models_dir": str(folder), "models": [
            {"id": m.id, "repo": m.repo, "name": m.name, "context_length": m.context_length, "licence": m.licence,
             "has_fim": m.has_fim, "has_tools": m.has_tools, "n_layer": m.n_layer, "default_quant": m.default_quant,
             "quants": [{"name": q.name, "file": q.file, "size_bytes": q.size_bytes,
                         "size_approximate": q.size_approximate, "on_disk": (m.id, q.name) in have}
                        for q in m.quants]} for m in catalogue.models],
            "on_disk": [{"path": str(m.path), "size_bytes": m.size_bytes, "catalogue_id": m.catalogue_id,
                         "quant": m.quant} for m in on_disk]}, indent=1))
        return 0
    print(f"Model catalogue v{catalogue.version} ({catalogue.updated}); get one with: evoke-desk pull ID[:QUANT]")
    print(f"  {'ID':<33} {'PARAMS':>6} {'CONTEXT':>7}  {'FIM':<3} {'TOOLS':<5} {'LICENCE':<10} "
          "QUANTS (~size; * on disk)")
    for m in catalogue.models:
        quants = "  ".join(f"{'*' if (m.id, q.name) in have else ''}{q.name} {format_bytes(q.size_bytes)}"
                           for q in m.quants)
        mark = "*" if any(i == m.id for i, _ in have) else " "
        print(f"{mark} {m.id:<33} {m.params_b:>5.1f}B {m.context_length // 1024:>6}K  {'yes' if m.has_fim else '-':<3} "
              f"{'yes' if m.has_tools else '-':<5} {m.licence:<10} {quants}")
    print(f"\nOn disk in {folder}:" if on_disk else f"\nNo models on disk yet in {folder}.")
    for m in on_disk:
        label = f"  ({m.catalogue_id} {m.quant})" if m.catalogue_id else ""
        print(f"  {m.path.relative_to(folder)}  {format_bytes(m.size_bytes)}{label}")
    return 0


def _print_search(query: str, as_json: bool) -> int:
    found = search_gguf(query)
    if as_json:
        print(json.dumps([vars(r) for r in found], indent=1))
        return 0
    if not found:
        print(f"no GGUF repositories on {hub_endpoint()} match {query!r}")
    for repo in found:
        print(f"  {repo.repo:<60} {repo.downloads:>9} downloads  {repo.likes:>5} likes  {repo.updated}")
    return 0


def _print_files(repo: str, folder: Path, as_json: bool) -> int:
    from .download import destination

    listing = list_gguf_files(repo)
    rows = [(f, destination(folder, repo, f.path).is_file()) for f in listing.files]
    if as_json:
        print(json.dumps({"repo": listing.repo, "commit": listing.commit, "files": [
            {"path": f.path, "size_bytes": f.size_bytes, "sha256": f.sha256, "quant": f.quant, "on_disk": here}
            for f, here in rows]}, indent=1))
        return 0
    print(f"{listing.repo} at {listing.commit or '?'}: pull one with evoke-desk pull {repo}:QUANT")
    for f, here in rows:
        print(f"{'*' if here else ' '} {f.path:<60} {format_bytes(f.size_bytes):>10}  {f.quant or '':<10} "
              f"sha256 {(f.sha256 or '-')[:12]}")
    return 0


class ProgressLine:
    """One terminal line redrawn in place (a tty), or a line per 10% (a log, a pipe)."""

    def __init__(self, out: TextIO = sys.stderr) -> None:
        self.out, self.tty, self.last_tenth = out, out.isatty(), -1
        self.started = time.monotonic()

    def __call__(self, p: DownloadProgress) -> None:
        eta = "--:--" if p.eta_s is None else _clock(p.eta_s)
        line = (f"{p.fraction * 100:5.1f}%  {format_bytes(p.done_bytes)} / {format_bytes(p.total_bytes)}  "
                f"{format_bytes(p.speed_bps)}/s  eta {eta}")
        if self.tty:
            print(f"\r  {line}   ", end="", file=self.out, flush=True)
        elif int(p.fraction * 10) > self.last_tenth:
            self.last_tenth = int(p.fraction * 10)
            print(f"  {line}", file=self.out, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=self.out, flush=True)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def pull_main(args: argparse.Namespace) -> int:
    progress = ProgressLine()
    try:
        catalogue, folder = load_catalogue(), _folder()
        print(f"pulling {args.spec} from {hub_endpoint()} into {folder}", file=sys.stderr, flush=True)
        pulled = pull(args.spec, folder, catalogue=catalogue, revision=args.revision, on_progress=progress)
    except KeyboardInterrupt:
        progress.end()
        print("stopped; what arrived is kept: run the same command to resume", file=sys.stderr)
        return 130
    except (ModelHubError, ValueError) as exc:
        progress.end()
        return _error(exc)
    progress.end()
    if pulled.already_present:
        print(f"already on disk: {pulled.path}", file=sys.stderr)
    else:
        resumed = f", resumed after {format_bytes(pulled.resumed_from)}" if pulled.resumed_from else ""
        print(f"verified sha256 {pulled.sha256[:12]}… ({format_bytes(pulled.size_bytes)}{resumed})", file=sys.stderr)
    print(pulled.path)
    print(f"use it: evoke-desk --model {pulled.path}  (or pick it in Settings → Model)", file=sys.stderr)
    return 0
