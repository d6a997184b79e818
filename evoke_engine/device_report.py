"""`python -m evoke_engine device`: the device llama.cpp would run on and, with remote devices set, every device the
configured model would use, as JSON. A CLI above the runtime, so the runtime's modules import none of each other
to serve it.

Invariants: it loads no model weights (the placement reads the GGUF's metadata only); a bad model path or remote
setting is reported in the JSON (`devices_error`), never raised. It names each native library's CPU variant.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from . import package_files
from .errors import EvokeError
from .kvcache import kvquant
from .runtime import device, kv_direct, rpc_placement
from .runtime.runtime import Runtime, default_model_path
from .settings import Settings


def main() -> None:
    """`python -m evoke_engine device`: what this process would run on, as JSON; with remote devices set
    (Settings → Model → Remote devices), every device the configured model would use, its memory and layers."""
    info = device.detect()
    report = {**asdict(info), **device.capabilities(), "native_libraries": package_files.native_report(),
              "kv_direct_loaded": kv_direct.available(), "kv_quant_native": kvquant.native_kernels()}
    settings = Settings.load()
    if settings.rpc_servers:
        try:
            path = Path(settings.model_path) if settings.model_path else default_model_path()
            placement = rpc_placement.plan(settings, info, path, Runtime.gpu_layers_requested(settings, info))
            report["model"] = str(path)
            report["devices"] = [share.as_dict() for share in placement.shares]
            report["notices"] = placement.notices
        except (EvokeError, ValueError) as exc:
            report["devices_error"] = str(exc)
    print(json.dumps(report, indent=2))
