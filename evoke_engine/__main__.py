"""`python -m evoke_engine chat`: the headless way to chat, with /stats for the memory counters;
`python -m evoke_engine serve`: the OpenAI-compatible endpoint without the window;
`python -m evoke_engine device`: which device llama.cpp would run on, and the remote devices set (JSON);
`python -m evoke_engine rpc-worker`: a remote-device worker (llama.cpp's rpc-server) for another machine's app;
`python -m evoke_engine models` / `pull REPO[:QUANT|:FILE]`: the model catalogue, and a verified download from the hub;
`--version` on each.

Invariants: the terminal shows every reply as it streams; Ctrl-C stops a reply, not the program; warnings
of the engine's loggers (a failed KV file write, a spill that found no room) reach stderr, and they and a failed
start (a bad model path) also reach the rotating log file (`evoke_engine.logs`); `serve` stops cleanly (exit 0,
KV files written) on SIGTERM, SIGINT and SIGHUP; the endpoint's key comes from a file or the environment, never
only from the process list without a warning.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from . import Engine, EvokeError, Settings
from .errors import DataDirInUseError
from .logs import configure_logging as configure_log_handlers
from .logs import version_line
from .settings import RECOVERY_BACKENDS

HELP = """commands: /stats  /blocks  /attach FILE  /budget N  /new  /quit"""
API_KEY_ENV = "EVOKE_API_KEY"
SERVE_BESIDE_THE_WINDOW = ("if that is the Evoke Desk window, turn on its endpoint instead: Settings → Endpoint → "
                           "Serve the API endpoint (the window's engine then serves the API on the same data)")


log = logging.getLogger("evoke_engine.cli")


def configure_logging() -> None:
    """Warnings and errors of every logger to stderr, and INFO and up to the rotating log file (uvicorn's own
    config leaves the root logger alone)."""
    configure_log_handlers(logging.WARNING)


def failed(exc: BaseException) -> None:
    """A start that failed: said on stderr and kept in the log file."""
    log.error("%s", exc)


def resolve_api_key(args: argparse.Namespace, settings_key: str, environ: dict[str, str] | None = None) -> str | None:
    """The endpoint's key: --api-key-file, else --api-key (with a warning: other local users see it in the process
    list), else $EVOKE_API_KEY, else the api_key setting; None when none is set. ValueError says what is wrong."""
    environ = os.environ if environ is None else environ
    key_file, key = getattr(args, "api_key_file", None), getattr(args, "api_key", None)
    if key_file and key:
        raise ValueError("give --api-key-file or --api-key, not both")
    if key_file:
        path = Path(key_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the API key file {path}: {exc}") from exc
        key = text.strip()
        if not key or any(ch.isspace() for ch in key):
            raise ValueError(f"the API key file {path} must hold one key on one line (it is empty or has spaces)")
        if os.name == "posix" and mode & 0o077:
            print(f"warning: the API key file {path} is readable by other users; chmod 600 it", file=sys.stderr)
        return key
    if key:
        print("warning: --api-key is visible to every local user in the process list; use --api-key-file or "
              f"${API_KEY_ENV}", file=sys.stderr)
        return key
    return environ.get(API_KEY_ENV, "").strip() or settings_key or None


def chat(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in {"model_path": args.model, "budget_tokens": args.budget,
                                   "recovery": args.recovery}.items() if v is not None}
    try:
        settings = Settings.load(**overrides)
        print(f"loading {settings.model_path or 'the embedded SmolLM2-135M-Instruct'} ...", flush=True)
        engine = Engine(settings)
    except (EvokeError, ValueError) as exc:
        failed(exc)
        return 2
    info = engine.model_info()
    print(f"{info.name} on {info.device}, context {info.n_ctx}, budget {settings.budget_tokens} tokens. {HELP}")
    conv = engine.new_conversation()
    attachments: list[tuple[str, str]] = []
    try:
        while True:
            try:
                line = input("\nyou> ")
            except EOFError:
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/stats":
                stats = conv.stats()
                print(json.dumps({k: v for k, v in stats.as_dict().items() if k not in ("blocks", "events")}, indent=1))
                continue
            if text == "/blocks":
                for block in conv.stats().blocks:
                    print(f"  {block['name']:<28} {block['state']:<9} {block['tokens']:>5} tokens")
                continue
            if text.startswith("/attach "):
                path = Path(text.split(" ", 1)[1]).expanduser()
                try:
                    attachments.append((path.name, path.read_text(errors="replace")))
                    print(f"attached {path.name}; it goes with your next message")
                except OSError as exc:
                    print(f"cannot read {path}: {exc.strerror}")
                continue
            if text.startswith("/budget "):
                try:
                    conv.set_budget(int(text.split()[1]))
                except (ValueError, EvokeError) as exc:
                    print(f"error: {exc}")
                continue
            if text == "/new":
                conv = engine.new_conversation()
                print("new conversation")
                continue
            print("evoke> ", end="", flush=True)
            future = conv.submit(text, attachments, on_token=lambda p: print(p, end="", flush=True))
            attachments = []
            try:
                reply = future.result()
            except KeyboardInterrupt:
                conv.cancel()
                reply = future.result()
            except EvokeError as exc:
                print(f"\nerror: {exc}")
                continue
            stats = conv.stats()
            print(f"\n[{reply.n_tokens} tokens, {reply.tokens_per_s:.1f} tok/s, first token {reply.ttft_s:.2f} s, "
                  f"active {stats.active_tokens}/{stats.budget_tokens}, evictions {stats.evictions}, "
                  f"recoveries {stats.recoveries}]")
    finally:
        engine.close()
    return 0


def serve(args: argparse.Namespace) -> int:
    from .server import ServerConfig
    from .server import serve as run_server

    overrides = {k: v for k, v in {"model_path": args.model, "budget_tokens": args.budget}.items() if v is not None}
    try:
        settings = Settings.load(**overrides)
        port = settings.server_port if args.port is None else args.port
        config = ServerConfig(host=args.host or settings.server_host, port=port,
                              api_key=resolve_api_key(args, settings.api_key), allow_remote=args.allow_remote,
                              allowed_hosts=list(args.allowed_host or []), cors_origins=list(args.cors_origin or []),
                              max_request_bytes=settings.server_max_request_bytes,
                              max_prefill_tokens=args.max_prefill_tokens or 0)
        config.check_bind()
        print(f"loading {settings.model_path or 'the embedded SmolLM2-135M-Instruct'} ...", flush=True)
        engine = Engine(settings, wait=False)        # the port opens while the model loads (`run_server`)
    except (EvokeError, ValueError) as exc:
        failed(exc)
        if isinstance(exc, DataDirInUseError):
            print(SERVE_BESIDE_THE_WINDOW, file=sys.stderr)
        return 2
    try:
        return run_server(engine, config, lifetime_s=args.lifetime)
    finally:
        engine.close()


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; others need --allow-remote)")
    p.add_argument("--port", type=int, help="port (default: the server_port setting, 8765)")
    p.add_argument("--api-key-file", help="require the Bearer key held in this file (one line; keep it chmod 600)")
    p.add_argument("--api-key", help=f"require this Bearer key (visible in the process list: prefer --api-key-file "
                   f"or ${API_KEY_ENV}; default: ${API_KEY_ENV}, then the api_key setting)")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback address (prints a warning)")
    p.add_argument("--allowed-host", action="append", help="another Host header name to accept (repeatable)")
    p.add_argument("--cors-origin", action="append", help="send CORS headers for this origin (repeatable)")
    p.add_argument("--model", help="GGUF file (default: the embedded model)")
    p.add_argument("--budget", type=int, help="active KV tokens per conversation")
    p.add_argument("--lifetime", type=float, help="stop by itself after this many seconds (tests, scripts)")
    p.add_argument("--max-prefill-tokens", type=int, help="tokens one request may have decoded before its reply "
                   "(default: the whole context less the reply's room); lower bounds how long one request holds "
                   "the model while others wait")


def build_parser(prog: str = "python -m evoke_engine") -> argparse.ArgumentParser:
    """The command line: one subcommand each for `chat`, `serve`, `device`, `aider-metadata`, `rpc-worker`, `models`
    and `pull`."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--version", action="version", version=version_line("evoke-engine"))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("chat", help="chat in the terminal")
    p.add_argument("--model", help="GGUF file (default: the embedded model)")
    p.add_argument("--budget", type=int, help="active KV tokens per conversation")
    p.add_argument("--recovery", choices=RECOVERY_BACKENDS)
    add_serve_arguments(sub.add_parser("serve", help="serve the OpenAI-compatible endpoint"))
    sub.add_parser("device", help="print the device llama.cpp would run on and the remote devices, as JSON")
    p = sub.add_parser("aider-metadata", help="print aider's model metadata for this endpoint (its context window): "
                       "save it as .aider.model.metadata.json or pass it with aider --model-metadata-file")
    p.add_argument("--name", default="openai/evoke", help="the model name given to aider (default openai/evoke)")
    from .models import cli as models_cli

    models_cli.add_models_arguments(sub.add_parser("models", help="list the model catalogue and the models on disk; "
                                                   "search the hub (--search) or list a repository's files (--files)"))
    models_cli.add_pull_arguments(sub.add_parser("pull", help="download a GGUF from the Hugging Face hub into the "
                                                 "models folder (resumable, sha256-verified), like `ollama pull`"))
    from .runtime import rpc_worker

    rpc_worker.add_arguments(sub.add_parser("rpc-worker", help="serve this machine's device to another machine's "
                                            "app (llama.cpp's rpc-server; loopback unless --allow-remote)"))
    return parser


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """The names of `parser`'s subcommands (the entry-point test runs each one)."""
    return [name for action in parser._subparsers._group_actions for name in action.choices]


def main(argv: list[str] | None = None, prog: str = "python -m evoke_engine") -> int:
    from .runtime import rpc_worker

    args = build_parser(prog).parse_args(argv)
    configure_logging()
    if args.command == "device":
        from .device_report import main as print_device

        print_device()
        return 0
    if args.command == "aider-metadata":
        from .server.api_errors import aider_metadata

        print(json.dumps(aider_metadata(Settings.load(), args.name), indent=2))
        return 0
    if args.command == "rpc-worker":
        return rpc_worker.main(args)
    if args.command in ("models", "pull"):
        from .models import cli as models_cli

        return models_cli.models_main(args) if args.command == "models" else models_cli.pull_main(args)
    return serve(args) if args.command == "serve" else chat(args)


if __name__ == "__main__":
    sys.exit(main())
