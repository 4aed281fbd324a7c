"""The library's shape, read from its own imports: no import circle, the policy core never imports a driver,
the runtime's rooms import only the rooms below them, no room takes another's private names, and no runtime
module grows past 400 lines (issue 37)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lucid_core"
#: the runtime's rooms, bottom first: each may import only the rooms before it
ROOMS = ("store", "hosts", "round", "surfaces")
MAX_RUNTIME_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import of lucid_core in the file, lazy ones too."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("lucid_core")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("lucid_core"):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.append((sub, []) if sub in known else (source, [alias.name]))
    return found


def _resolve(target: str, known: set[str]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {_resolve(t, known) for t, _ in _imports(name, path, known)}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" and parts[2] in ROOMS else None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_library() -> None:
    assert _cycles(_graph()) == []


def test_the_policy_core_imports_no_driver() -> None:
    graph = _graph()
    wrong = {m: sorted(t for t in ts if t.startswith(("lucid_core.sim", "lucid_core.runtime")))
             for m, ts in graph.items() if m.startswith("lucid_core.policy")}
    assert {m: ts for m, ts in wrong.items() if ts} == {}


def test_each_room_imports_only_the_rooms_below_it() -> None:
    wrong = []
    for module, targets in _graph().items():
        room = _room(module)
        if room is None:
            continue
        for target in targets:
            other = _room(target)
            if other is not None and ROOMS.index(other) > ROOMS.index(room):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_room_takes_another_rooms_private_names() -> None:
    modules = _modules()
    known = set(modules)
    wrong = []
    for name, path in modules.items():
        room = _room(name)
        for source, names in _imports(name, path, known):
            other = _room(_resolve(source, known) or "")
            if other is not None and other != room:
                wrong += [f"{name} takes {source}.{n}" for n in names if n.startswith("_")]
    assert wrong == []


def test_every_room_says_what_it_owns_and_may_import() -> None:
    for room in ROOMS:
        init = PACKAGE / "runtime" / room / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "import" in doc, f"{init} lacks its two-line docstring"


@pytest.mark.parametrize("path", sorted((PACKAGE / "runtime").rglob("*.py")), ids=lambda p: p.name)
def test_no_runtime_module_over_400_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_RUNTIME_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines"
