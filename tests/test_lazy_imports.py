"""Every `from lucid_core... import name` and `from lucid_airflow... import name` in the repository names something
that exists, the lazy ones inside functions too. Commands import late to start fast, so a moved name breaks only
when that path runs: the plugin's tuner and trace-path checks imported `lucid_home` from a module it had left, and
only the Airflow DAG tests noticed."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("lucid_core", "lucid_airflow")


def _imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every absolute from-import of the project's packages."""
    found = []
    for folder in ("lucid_core", "plugins", "dags", "tests", "benchmarks", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(PACKAGES):
                    found += [(str(path.relative_to(REPO)), node.module, a.name) for a in node.names if a.name != "*"]
    return found


def test_every_imported_name_of_the_project_exists():
    if str(REPO / "plugins") not in sys.path:
        sys.path.insert(0, str(REPO / "plugins"))
    imports = _imports()
    missing = []
    for where, module, name in imports:
        found = importlib.import_module(module)
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: from {module} import {name}")
    assert len(imports) > 500 and missing == []
