"""BENCHMARKS.md is assembled from benchmarks/results/*.md: a figure written only into the page is lost at the
next `bash benchmarks/assemble.sh`, so the page must be exactly what its parts make."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / "benchmarks" / "assemble.sh"), "--check"], capture_output=True,
                          text=True, timeout=60)


def _copy_page_and_parts(root: Path) -> None:
    """The assembler, its parts and the page as they are in the repository, under `root`."""
    (root / "benchmarks").mkdir()
    shutil.copy(REPO / "benchmarks" / "assemble.sh", root / "benchmarks")
    shutil.copytree(REPO / "benchmarks" / "results", root / "benchmarks" / "results")
    shutil.copy(REPO / "BENCHMARKS.md", root / "BENCHMARKS.md")


def test_the_page_is_what_its_parts_make():
    result = _check(REPO)
    assert result.returncode == 0, result.stderr


def test_a_section_edited_only_in_the_page_is_caught(tmp_path):
    _copy_page_and_parts(tmp_path)
    page = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert _check(tmp_path).returncode == 0
    (tmp_path / "BENCHMARKS.md").write_text(page + "\n## A section nobody put in a part\n", encoding="utf-8")
    result = _check(tmp_path)
    assert result.returncode != 0 and "edit the parts" in result.stderr


def test_a_part_the_page_leaves_out_is_caught(tmp_path):
    _copy_page_and_parts(tmp_path)
    (tmp_path / "benchmarks" / "results" / "new_area.md").write_text("# New area\n", encoding="utf-8")
    result = _check(tmp_path)
    assert result.returncode != 0 and "new_area" in result.stderr
