"""The Hugging Face hub through `huggingface_hub`: search for GGUF repositories, list a repository's GGUF files with
their sizes and LFS sha256, and choose the file a `REPO[:QUANT|:FILE]` spec names.

Invariants: the endpoint is read from HF_ENDPOINT at each call (never cached at import), and passed explicitly to
every `huggingface_hub` call; every failure leaves here as a `ModelHubError` subclass (unreachable, not found,
offline mode) naming the endpoint or the repository, never as an HTTP library's exception.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .catalogue import Catalogue, quant_of
from .errors import HubNotFoundError, HubUnreachableError, ModelHubError

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANTS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0")   # a pull without a quant takes the first found
SEARCH_TIMEOUT_S = 15.0
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def hub_endpoint() -> str:
    """HF_ENDPOINT (a mirror, or the tests' fake hub) or huggingface.co, read now."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's network errors: huggingface_hub 1.x uses httpx, 2.x its fork httpx2."""
    found: list[type[BaseException]] = []
    for module in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(importlib.import_module(module).TransportError)
    return tuple(found)


@contextlib.contextmanager
def hub_errors(endpoint: str, what: str) -> Iterator[None]:
    """Maps huggingface_hub's and the HTTP client's exceptions to this package's errors; `what` names the thing
    asked for ("bartowski/X-GGUF", "the search")."""
    from huggingface_hub import errors as hf

    try:
        yield
    except hf.HFValidationError as exc:
        raise HubNotFoundError(f"{what} is not a valid Hugging Face repository id (owner/name): {exc}") from exc
    except hf.OfflineModeIsEnabled as exc:
        raise HubUnreachableError(endpoint, "offline mode is on (HF_HUB_OFFLINE is set); unset it to download") \
            from exc
    except (hf.RepositoryNotFoundError, hf.GatedRepoError) as exc:
        raise HubNotFoundError(f"{what} is not on the hub at {endpoint}, or is private or gated "
                               "(log in with `hf auth login` for gated models)") from exc
    except (hf.RevisionNotFoundError, hf.EntryNotFoundError) as exc:
        raise HubNotFoundError(f"{what}: no such revision or file on the hub at {endpoint}") from exc
    except hf.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise ModelHubError(f"the hub at {endpoint} refused {what} (HTTP {status}); try again later") from exc
    except transport_errors() as exc:
        raise HubUnreachableError(endpoint, f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc


@dataclass(frozen=True)
class HubFile:
    path: str                 # inside the repository
    size_bytes: int
    sha256: str | None        # the LFS object's sha256 (None for a file not in LFS)
    quant: str | None
    part: tuple[int, int] | None = None      # (index, count) of a split GGUF, 1-based


@dataclass(frozen=True)
class RepoListing:
    repo: str
    commit: str | None        # the revision's commit: downloads use it so every part comes from one snapshot
    files: tuple[HubFile, ...]     # the GGUF files (mmproj projectors left out), by path


@dataclass(frozen=True)
class HubRepo:
    repo: str
    downloads: int
    likes: int
    updated: str


def _api(endpoint: str):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint)


def list_gguf_files(repo: str, revision: str = "main", endpoint: str | None = None) -> RepoListing:
    """The repository's GGUF files with sizes and LFS sha256 (one `model_info(files_metadata=True)` request)."""
    endpoint = endpoint or hub_endpoint()
    with hub_errors(endpoint, repo):
        info = _api(endpoint).model_info(repo, revision=revision, files_metadata=True)
    files = []
    for sibling in info.siblings or ():
        name = sibling.rfilename
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        lfs = sibling.lfs
        size = lfs.size if lfs is not None else (sibling.size or 0)
        split = SPLIT_PART.search(name)
        files.append(HubFile(name, int(size), lfs.sha256 if lfs is not None else None, quant_of(name),
                             (int(split.group(1)), int(split.group(2))) if split else None))
    return RepoListing(repo, info.sha, tuple(sorted(files, key=lambda f: f.path)))


def search_gguf(query: str, limit: int = 20, endpoint: str | None = None) -> list[HubRepo]:
    """GGUF repositories whose name matches `query`, most downloaded first. One request, as
    `HfApi.list_models(search=, filter="gguf", sort="downloads", limit=)` sends it, without its retries (they
    back off for about 24 s when offline before the error could be said)."""
    from huggingface_hub import ModelInfo, get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    endpoint = endpoint or hub_endpoint()
    params = {"search": query, "filter": "gguf", "sort": "downloads", "limit": limit}
    with hub_errors(endpoint, f"the search for {query!r}"):
        response = get_session().get(f"{endpoint}/api/models", params=params, headers=build_hf_headers(),
                                     timeout=SEARCH_TIMEOUT_S)
        hf_raise_for_status(response)
        found = [ModelInfo(**item) for item in response.json()]
    return [HubRepo(m.id, int(m.downloads or 0), int(m.likes or 0),
                    m.last_modified.date().isoformat() if m.last_modified else "") for m in found]


@dataclass(frozen=True)
class PullSpec:
    repo: str
    quant: str | None = None
    file: str | None = None


def parse_spec(spec: str, catalogue: Catalogue | None = None) -> PullSpec:
    """`REPO`, `REPO:QUANT`, `REPO:FILE.gguf`, or a catalogue id (with an optional `:QUANT`), as `ollama pull`
    takes them. A catalogue entry, named by id or by its repository, brings its default quant."""
    spec = spec.strip()
    head, _, tail = spec.partition(":")
    if not head:
        raise ValueError(f"{spec!r}: give a repository (owner/name) or a catalogue id, e.g. qwen2.5-coder-7b-instruct")
    entry = catalogue.by_id(head) if catalogue else None
    if entry is None and catalogue is not None:
        entry = catalogue.by_repo(head)
    repo = entry.repo if entry else head
    if "/" not in repo:
        raise ValueError(f"{head!r} is neither a catalogue id nor a repository (owner/name); "
                         "`evoke-desk models` lists the catalogue")
    if tail.lower().endswith(".gguf"):
        return PullSpec(repo, file=tail)
    quant = tail or (entry.default_quant if entry else None)
    return PullSpec(repo, quant=quant)


def choose_file(listing: RepoListing, spec: PullSpec) -> HubFile:
    """The file `spec` names in `listing`: by path, by quant, else the first of DEFAULT_QUANTS found. A split GGUF
    (`-00001-of-00003`) is refused with a message: llama.cpp needs every part beside the first."""
    files = listing.files
    if not files:
        raise HubNotFoundError(f"{listing.repo} has no GGUF files (llama.cpp needs GGUF; look for a -GGUF repo)")
    if spec.file:
        chosen = next((f for f in files if f.path == spec.file or f.path.lower() == spec.file.lower()), None)
        if chosen is None:
            raise HubNotFoundError(f"{listing.repo} has no file {spec.file!r}; it has: {_names(files)}")
    else:
        wanted = [spec.quant] if spec.quant else list(DEFAULT_QUANTS)
        chosen = None
        for quant in wanted:
            matches = [f for f in files if (f.quant or "").lower() == quant.lower() and (f.part or (1, 1))[0] == 1]
            if matches:
                chosen = matches[0]
                break
        if chosen is None and spec.quant:
            quants = sorted({f.quant for f in files if f.quant})
            raise HubNotFoundError(f"{listing.repo} has no {spec.quant} file; its quants: {', '.join(quants)}")
        chosen = chosen or files[0]
    if chosen.part is not None and chosen.part[1] > 1:
        raise ModelHubError(f"{chosen.path} is part {chosen.part[0]} of a GGUF split in {chosen.part[1]} files, "
                            "which pull does not download yet: choose a quant that is one file")
    return chosen


def _names(files: tuple[HubFile, ...], most: int = 8) -> str:
    names = [f.path for f in files[:most]]
    return ", ".join(names) + (f" and {len(files) - most} more" if len(files) > most else "")
