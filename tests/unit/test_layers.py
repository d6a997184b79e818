"""Issue 25's layering rule, checked on the source: below engine.py no module refers to `Engine` (imports or
annotations); the conversation handle, the package entry points, the server and the benches may. Every import
(lazy and TYPE_CHECKING ones included, no exemptions) goes down the layers runtime < kvcache < memory <
conversations < the top level (engine, conversation, worker, sweeps, server/); store/ and the shared
leaves (settings, settings_hub, errors, events, stats, package_files, rpc_split) may be imported from anywhere and
import only each other; only runtime/ imports llama_cpp. The lab (the top-level `benchmarks/` package: benches,
workloads, the simulator) sits outside the engine: nothing in evoke_engine/ imports it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import evoke_engine

pytestmark = pytest.mark.unit

PACKAGE = Path(evoke_engine.__file__).resolve().parent
NAMES_ENGINE = re.compile(r"import .*\bEngine\b|[:(\[,] *['\"]?Engine['\"]?\b")
ALLOWED = {"engine.py", "conversation.py", "__init__.py", "__main__.py"}
ALLOWED_FOLDERS = {"server"}


def test_no_module_below_the_engine_names_it():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ALLOWED_FOLDERS or (len(relative.parts) == 1 and relative.name in ALLOWED):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAMES_ENGINE.search(line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert offenders == []


def test_the_conversation_handle_calls_only_public_engine_methods():
    source = (PACKAGE / "conversation.py").read_text(encoding="utf-8")
    used = set(re.findall(r"self\.engine\.(\w+)", source))
    assert used and all(not name.startswith("_") for name in used)
    assert not used & {"history", "thread", "lifecycle", "model", "turns"}, "engine-thread state, not methods"


# -- issue 25's layout: each subpackage imports only the layers below it -------------------------------------------
LAYERS = ("runtime", "kvcache", "memory", "conversations")          # lowest first; the top level sits above them
LEAVES = {"settings", "settings_hub", "errors", "events", "stats", "package_files", "rpc_split", "store"}
LLAMA_CPP_FOLDERS = {"runtime"}


def _module_of(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path, package: list[str] | None = None) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in the file, lazy and TYPE_CHECKING ones included; for
    `from X import a` both X and X.a (a may be a submodule). Relative imports resolve against `package` (by
    default the file's own place in evoke_engine)."""
    if package is None:
        package = ["evoke_engine", *_module_of(path)][: None if path.name == "__init__.py" else -1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _place(parts: list[str]) -> str:
    """A module's place: one of LAYERS, "leaf" (store and the shared top-level leaves) or "top"."""
    if parts and parts[0] in LAYERS:
        return parts[0]
    return "leaf" if parts and parts[0] in LEAVES else "top"


def _allowed(source: str, target: str) -> bool:
    if target == "leaf" or source == "top":
        return True
    if source == "leaf":
        return False
    return target != "top" and LAYERS.index(target) <= LAYERS.index(source)


def test_every_module_imports_only_its_own_layer_and_those_below():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _place(_module_of(path))
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] == "evoke_engine" and not _allowed(source, _place(parts[1:])):
                offenders.append(f"{path.relative_to(PACKAGE)}:{line}: {source} imports {name}")
    assert not offenders, "upward imports:\n" + "\n".join(sorted(set(offenders)))


def test_only_the_runtime_imports_llama_cpp():
    offenders = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                 if path.relative_to(PACKAGE).parts[0] not in LLAMA_CPP_FOLDERS
                 for line, name in _imports(path) if name.split(".")[0] == "llama_cpp"]
    assert not offenders, "llama_cpp imported outside runtime/: " + ", ".join(offenders)
    assert any(name.startswith("llama_cpp") for _, name in _imports(PACKAGE / "runtime" / "runtime.py"))


def test_the_layer_packages_import_nothing_at_their_top():
    """`import evoke_engine.memory` costs nothing: no re-exports, so nothing pulls llama.cpp in by accident."""
    for layer in LAYERS:
        assert _imports(PACKAGE / layer / "__init__.py") == [], layer


def test_the_layer_rule_sees_an_upward_import():
    assert _place(["runtime", "kv"]) == "runtime" and _place(["store", "history"]) == "leaf"
    assert not _allowed("kvcache", "memory") and not _allowed("conversations", "top")
    assert not _allowed("leaf", "runtime") and _allowed("memory", "runtime") and _allowed("runtime", "leaf")


# -- issue 47: one door per layer -----------------------------------------------------------------------------------
ROOT = PACKAGE.parent
PUBLIC_MODULES = {"evoke_engine", "evoke_engine.settings", "evoke_engine.errors", "evoke_engine.events",
                  "evoke_engine.stats", "evoke_engine.package_files", "evoke_engine.logs", "evoke_engine.shutdown"}
APP_MAY_ALSO = {"evoke_engine.server",              # the window runs the endpoint beside its engine
                "evoke_engine.__main__"}            # `evoke-desk serve|chat|device` pass through to the engine's CLI
LAB_FILES = {"bench.py"}                             # the window's own bench drives the lab's workloads


def _engine_imports(path: Path, package: list[str]) -> list[tuple[int, str]]:
    """(line, name) of each import of evoke_engine in `path` (relative ones resolved against `package`); for
    `from X import a` only X (the module the names come from)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "evoke_engine"]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module.split(".")[0] == "evoke_engine":
                found.append((node.lineno, module))
    return found


def test_the_app_uses_the_engines_public_api_only():
    offenders = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        allowed = PUBLIC_MODULES | APP_MAY_ALSO | ({"benchmarks"} if path.name in LAB_FILES else set())
        offenders += [f"app/{path.relative_to(ROOT / 'app')}:{line}: {name}"
                      for line, name in _engine_imports(path, []) if not any(
                          name == a or name.startswith(a + ".") and a != "evoke_engine" for a in allowed)]
    assert not offenders, "the app reaches past the engine's public API:\n" + "\n".join(offenders)


def test_the_endpoint_uses_the_engines_public_api_only():
    offenders = []
    for path in sorted((PACKAGE / "server").glob("*.py")):
        package = ["evoke_engine", "server"]
        offenders += [f"server/{path.name}:{line}: {name}" for line, name in _engine_imports(path, package)
                      if name not in PUBLIC_MODULES and not name.startswith("evoke_engine.server")]
    assert not offenders, "the endpoint reaches past the engine's public API:\n" + "\n".join(offenders)


def _runtime_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports when run (imports under `if TYPE_CHECKING:` are annotations only)."""
    modules = {".".join(["evoke_engine", *_module_of(p)]): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
                node.body = []
        package = ["evoke_engine", *_module_of(path)][: None if path.name == "__init__.py" else -1]
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
                deps |= {base, *(f"{base}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if d in modules and d != name and d != "evoke_engine"}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative over a small graph)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_within_or_across_layers():
    assert _circles(_runtime_graph()) == []


def test_the_circle_finder_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_from_another_module():
    offenders = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


REACHES_INTO_MEMORY = re.compile(r"memory\.(sequence|counters)\b|memory\.turn\s*[+]?=|memory\.table\.pin\b|"
                                 r"memory\.focus\.vector\s*=")


def test_turns_and_edits_reach_memory_through_its_methods_only():
    """Issue 47: memory owns the reply protocol (open, grow, split, make room, close, roll back): the turn, the
    edits, the lifecycle and the engine call its methods, never its sequence, counters or turn number."""
    offenders = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
                 for path in sorted([*(PACKAGE / "conversations").glob("*.py"), *PACKAGE.glob("*.py")])
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if REACHES_INTO_MEMORY.search(line)]
    assert not offenders, "reaches past memory's methods:\n" + "\n".join(offenders)


SLOT_WRITES = re.compile(r"\bkv\.(drop|share|restore|evict|hold_ahead|claim_ahead)\(|"
                         r"prefixes\.(share_into|hold_opening)\(")
SCRATCH_ONLY = {"conversations/completion.py"}     # empties the scratch sequence it used, never a slot


def test_nothing_outside_the_resident_sequence_writes_a_slots_cells():
    """Issue 47: `ResidentSequence` is the one writer of a slot's cells (entering a slot included: the drop, the
    prefix share, the unpark, the held opening); the layers above it only ask."""
    folders = [PACKAGE / "conversations", PACKAGE / "memory"]
    offenders = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
                 for path in sorted([*(p for f in folders for p in f.glob("*.py")), *PACKAGE.glob("*.py")])
                 if str(path.relative_to(PACKAGE)) not in SCRATCH_ONLY
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if SLOT_WRITES.search(line)]
    assert not offenders, "a slot's cells written outside ResidentSequence:\n" + "\n".join(offenders)


def test_nothing_in_the_engine_imports_the_lab():
    """Issue 47: the benches, workloads and simulator live in the top-level `benchmarks/` package, which the wheel
    does not ship; an engine module that imported it would break the installed app."""
    offenders = [f"{path.relative_to(PACKAGE)}:{line}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line, name in _imports(path) if name.split(".")[0] == "benchmarks"]
    assert not offenders, "the engine imports the lab:\n" + "\n".join(offenders)


def test_the_simulator_pulls_in_no_llama_cpp():
    """Issue 47: kv_sim (the fake KV cache and runtime the unit tier and the model-free benches run on) reaches,
    through everything it imports, no engine module that imports llama_cpp (the package's own __init__ aside)."""
    simulator = ROOT / "benchmarks" / "kv_sim.py"
    assert not any(name.split(".")[0] in {"llama_cpp", "benchmarks"} for _, name in _imports(simulator, ["benchmarks"]))
    graph = _runtime_graph()
    seen: set[str] = set()
    todo = [name for _, name in _imports(simulator, ["benchmarks"]) if name in graph]
    assert todo, "kv_sim imports engine modules (errors, runtime.held_ahead, runtime.saved_kv)"
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    modules = {".".join(["evoke_engine", *_module_of(p)]): p for p in PACKAGE.rglob("*.py")}
    loading = sorted(name for name in seen
                     if any(imported.split(".")[0] == "llama_cpp" for _, imported in _imports(modules[name])))
    assert loading == [], f"the simulator reaches llama_cpp through {loading}"
