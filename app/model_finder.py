"""Where GGUF models usually live: the app's models folder, the Hugging Face cache, LM Studio.

Invariant: the search is bounded (depth and count) and never raises; the embedded default
model is always the first entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 6
MAX_FILES = 200


@dataclass(frozen=True)
class ModelFile:
    path: str | None          # None is the embedded default
    label: str
    source: str
    size_bytes: int = 0


def search_roots(models_dir: Path | None = None) -> list[tuple[str, Path]]:
    home = Path.home()
    hf_home = Path(os.environ.get("HF_HOME", home / ".cache" / "huggingface"))
    roots = [("Evoke Desk models", models_dir)] if models_dir else []
    roots += [
        ("Hugging Face cache", Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub"))),
        ("LM Studio", home / ".lmstudio" / "models"),
        ("LM Studio", home / ".cache" / "lm-studio" / "models"),
        ("GPT4All", home / ".local" / "share" / "nomic.ai" / "GPT4All"),
        ("Jan", home / "jan" / "models"),
        ("Ollama-style folder", home / "models"),
    ]
    return roots


def _walk(root: Path, limit: int) -> list[Path]:
    found: list[Path] = []
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        if len(Path(dirpath).parts) - base_depth >= MAX_DEPTH:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in sorted(filenames):
            if name.lower().endswith(".gguf") and "mmproj" not in name.lower():
                found.append(Path(dirpath) / name)
                if len(found) >= limit:
                    return found
    return found


def _embedded() -> ModelFile:
    from .messages import EMBEDDED_MODEL_FILE

    label = f"{EMBEDDED_MODEL_FILE}  (embedded)"
    try:
        from evoke_engine import default_model_path
        path = default_model_path()
        return ModelFile(None, label, "built in", path.stat().st_size if path.exists() else 0)
    except Exception:  # noqa: BLE001 - the picker must open even without the engine package
        return ModelFile(None, label, "built in")


def find_models(models_dir: Path | None = None,
                roots: list[tuple[str, Path]] | None = None) -> list[ModelFile]:
    """The embedded model, then every GGUF found in the usual places (deduplicated)."""
    models = [_embedded()]
    seen: set[str] = set()
    for source, root in roots if roots is not None else search_roots(models_dir):
        try:
            if not root.is_dir():
                continue
            for path in _walk(root, MAX_FILES - len(models)):
                real = str(path.resolve())
                if real in seen:
                    continue
                seen.add(real)
                size = path.stat().st_size
                label = f"{path.name}  ({size / (1 << 30):.2f} GiB)"
                models.append(ModelFile(str(path), label, source, size))
        except OSError:
            continue
        if len(models) >= MAX_FILES:
            break
    return models
