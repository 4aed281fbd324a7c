"""Airflow test fixtures: a throwaway AIRFLOW_HOME (set before airflow is imported), a migrated
metadata DB, a Lucid store seeded with finished jobs, and a loopback SMTP server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

_HOME = Path(tempfile.mkdtemp(prefix="lucid-airflow-test-"))
os.environ.update({
    "AIRFLOW_HOME": str(_HOME / "airflow"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow' / 'airflow.db'}",
    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
})
os.environ.setdefault("PYTHONPATH", str(REPO))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "plugins") not in sys.path:
    sys.path.insert(0, str(REPO / "plugins"))

def pytest_sessionfinish(session, exitstatus) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """`airflow db migrate` once per session into the temporary AIRFLOW_HOME."""
    subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], check=True, capture_output=True, timeout=300,
                   env=dict(os.environ))
    return Path(os.environ["AIRFLOW_HOME"])


@pytest.fixture
def lucid_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "lucid"
    monkeypatch.setenv("LUCID_HOME", str(home))
    monkeypatch.setenv("LUCID_TRACES_DIR", str(REPO / "include" / "sample"))  # tuner runs replay its trace
    monkeypatch.delenv("LUCID_REPORTS_DIR", raising=False)
    return home
