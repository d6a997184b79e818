"""The curated model catalogue (resources/model_catalogue.json), the models folder, and which entries are on disk.

Invariants: a loaded `Catalogue` is validated whole (a bad field raises `CatalogueError` naming the entry and field,
never a KeyError later); entries are frozen; the models folder is `data_dir/models`, and files there whose names
do not end in `.gguf` or that sit under a hidden folder (partial downloads) are never listed as models.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..package_files import resources_root
from .errors import CatalogueError

CATALOGUE_FILE = "model_catalogue.json"
CATALOGUE_VERSION = 1                     # the format this code reads; a newer file is refused with a message
MODELS_FOLDER = "models"
QUANT_PATTERN = re.compile(r"(?:UD-)?(?:I?Q\d(?:_[0-9A-Z]+)*|BF16|F16|F32|FP16|MXFP4(?:_MOE)?)", re.IGNORECASE)


@dataclass(frozen=True)
class Quant:
    name: str                 # "Q4_K_M"
    file: str                 # the file's path inside the repository
    size_bytes: int
    size_approximate: bool    # from a rounded listing; the hub's exact size is read before a download


@dataclass(frozen=True)
class CatalogueModel:
    id: str                   # "qwen2.5-coder-7b-instruct": what `evoke-desk pull` accepts besides a repository
    name: str
    repo: str                 # Hugging Face repository id, "owner/name"
    family: str
    arch: str
    params_b: float
    n_layer: int | None
    context_length: int
    licence: str
    has_fim: bool
    has_tools: bool
    chat: bool
    default_quant: str
    quants: tuple[Quant, ...]
    tool_call_format: str | None = None
    active_params_b: float | None = None
    licence_note: str = ""
    notes: str = ""

    def quant(self, name: str) -> Quant | None:
        return next((q for q in self.quants if q.name.lower() == name.lower()), None)


@dataclass(frozen=True)
class Catalogue:
    version: int
    updated: str
    models: tuple[CatalogueModel, ...]

    def by_id(self, model_id: str) -> CatalogueModel | None:
        return next((m for m in self.models if m.id.lower() == model_id.lower()), None)

    def by_repo(self, repo: str) -> CatalogueModel | None:
        return next((m for m in self.models if m.repo.lower() == repo.lower()), None)


_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {   # name -> (types, required)
    "id": (str, True), "name": (str, True), "repo": (str, True), "family": (str, True), "arch": (str, True),
    "params_b": ((int, float), True), "n_layer": ((int, type(None)), True), "context_length": (int, True),
    "licence": (str, True), "has_fim": (bool, True), "has_tools": (bool, True), "chat": (bool, True),
    "default_quant": (str, True), "quants": (list, True), "tool_call_format": ((str, type(None)), False),
    "active_params_b": ((int, float, type(None)), False), "licence_note": (str, False), "notes": (str, False),
}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _model_from(raw: Any, where: str) -> CatalogueModel:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: an entry must be an object")
    unknown = set(raw) - set(_FIELDS)
    if unknown:
        raise CatalogueError(f"{where}: unknown fields {sorted(unknown)}")
    for name, (types, required) in _FIELDS.items():
        if name not in raw:
            if required:
                raise CatalogueError(f"{where}: missing field {name!r}")
            continue
        value = raw[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise CatalogueError(f"{where}: field {name!r} has the wrong type ({type(value).__name__})")
    where = f"{where} ({raw['id']})"
    if not _REPO_ID.match(raw["repo"]):
        raise CatalogueError(f"{where}: repo {raw['repo']!r} is not a Hugging Face id (owner/name)")
    if raw["context_length"] <= 0 or (raw["n_layer"] is not None and raw["n_layer"] <= 0):
        raise CatalogueError(f"{where}: context_length and n_layer must be positive")
    quants = []
    for i, q in enumerate(raw["quants"]):
        if not isinstance(q, dict) or set(q) != {"name", "file", "size_bytes", "size_approximate"}:
            raise CatalogueError(f"{where}: quant {i} needs exactly name, file, size_bytes, size_approximate")
        if not (isinstance(q["size_bytes"], int) and q["size_bytes"] > 0 and str(q["file"]).endswith(".gguf")):
            raise CatalogueError(f"{where}: quant {q['name']!r} needs a positive size and a .gguf file")
        quants.append(Quant(str(q["name"]), str(q["file"]), q["size_bytes"], bool(q["size_approximate"])))
    if not quants:
        raise CatalogueError(f"{where}: no quants")
    if len({q.name.lower() for q in quants}) != len(quants):
        raise CatalogueError(f"{where}: two quants share a name")
    fields = {k: v for k, v in raw.items() if k != "quants"}
    model = CatalogueModel(**fields, quants=tuple(quants))
    if model.quant(model.default_quant) is None:
        raise CatalogueError(f"{where}: default_quant {model.default_quant!r} is not one of its quants")
    return model


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def parse_catalogue(text: str, source: str = CATALOGUE_FILE) -> Catalogue:
    """A catalogue from JSON text, validated whole. CatalogueError says which entry and field is wrong."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogueError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise CatalogueError(f"{source}: expected an object with a 'models' list")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise CatalogueError(f"{source}: 'version' must be a positive integer")
    if version > CATALOGUE_VERSION:
        raise CatalogueError(f"{source} is catalogue version {version}; this Evoke Desk reads up to "
                             f"{CATALOGUE_VERSION}: update Evoke Desk")
    models = tuple(_model_from(raw, f"{source} entry {i}") for i, raw in enumerate(doc["models"]))
    ids = [m.id.lower() for m in models]
    if len(set(ids)) != len(ids):
        raise CatalogueError(f"{source}: two entries share an id")
    return Catalogue(version=version, updated=str(doc.get("updated", "")), models=models)


def load_catalogue(path: Path | None = None) -> Catalogue:
    """The shipped catalogue (through importlib.resources), or the one at `path`."""
    if path is None:
        text = resources_root().joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
        return parse_catalogue(text)
    return parse_catalogue(Path(path).read_text(encoding="utf-8"), str(path))


def models_dir(data_dir: Path) -> Path:
    """The app's models folder: where pulls land and the model picker looks first (`data_dir/models`)."""
    return Path(data_dir) / MODELS_FOLDER


def quant_of(file_name: str) -> str | None:
    """The quantisation named in a GGUF file name ('Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf' -> 'Q4_K_M')."""
    stem = Path(file_name).name
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem)
    found = [m.group(0) for m in re.finditer(r"(?<![A-Za-z0-9])" + QUANT_PATTERN.pattern + r"$", stem,
                                             re.IGNORECASE)]
    return found[-1].upper() if found else None


@dataclass(frozen=True)
class LocalModel:
    path: Path
    size_bytes: int
    catalogue_id: str | None       # the catalogue entry this file is one quant of, if any
    quant: str | None


def local_models(folder: Path, catalogue: Catalogue | None = None) -> list[LocalModel]:
    """The GGUF files in the models folder, each matched to its catalogue entry by file name. Hidden folders
    (partial downloads live in `.partial/`) and non-.gguf names are skipped; a missing folder is an empty list."""
    by_file = {q.file.lower(): (m.id, q.name) for m in (catalogue.models if catalogue else ()) for q in m.quants}
    found: list[LocalModel] = []
    if not Path(folder).is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
                continue
            path = Path(dirpath) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            model_id, quant = by_file.get(name.lower(), (None, quant_of(name)))
            found.append(LocalModel(path, size, model_id, quant))
    return found
