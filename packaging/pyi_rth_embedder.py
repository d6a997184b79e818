"""PyInstaller runtime hook: the bundle's exported ONNX embedder (made and checked at build time by
packaging/build_bundle.sh; the bundle has no torch to export it) is copied into the user's embedder cache, where
the engine looks for it (`evoke_engine.memory.embedder.default_cache_dir`), when that cache lacks it: once per
user, about 90 MB, a fraction of a second.

Invariants: a record (`<name>.json`) is written last and whole (a temporary name, then a rename), after its graph
and tokenizer, as `onnx_encoder` writes an export, so a start killed half-way leaves no record for a partial
export; a failure (a read-only home) is never fatal: the engine then logs that the embedder is not available.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path


def _copy_whole(source: Path, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _install_exports() -> None:
    bundled = Path(getattr(sys, "_MEIPASS", "")) / "evoke_embedders"
    records = [p for p in bundled.glob("*.json") if not p.name.endswith(".tokenizer.json")]
    if not records:
        return
    import platformdirs

    cache = Path(platformdirs.user_cache_dir("evoke-desk")) / "embedders"     # = embedder.default_cache_dir()
    for record in records:
        if (cache / record.name).is_file():
            continue
        try:
            cache.mkdir(parents=True, exist_ok=True)
            stem = record.name[: -len(".json")]
            for part in (f"{stem}.onnx", f"{stem}.tokenizer.json", record.name):    # the record last
                _copy_whole(bundled / part, cache / part)
        except OSError as exc:
            print(f"evoke-desk: cannot put the bundled embedder into {cache}: {exc}", file=sys.stderr)


_install_exports()
