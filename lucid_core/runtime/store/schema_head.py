"""The newest schema the packaged migrations define, read from their files without Alembic or SQLAlchemy: a store
stamped with it is current (`Store.migrate` has nothing to do, and `plain_read` may read it as it is)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

_REVISION_LINE = re.compile(r"""^(revision|down_revision)\s*(?::[^=]*)?=\s*(None|'(\w+)'|"(\w+)")\s*$""", re.M)


@functools.cache
def packaged_head() -> str | None:
    """The head revision of the packaged migrations, read from their `revision` and `down_revision` lines
    without importing Alembic; None when the files do not read as one simple chain (`migrate` then asks Alembic)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        if path.name.startswith(("__init__", ".#")):  # what Alembic skips too
            continue
        found = {key: a or b or None for key, _, a, b in _REVISION_LINE.findall(path.read_text(encoding="utf-8"))}
        if not found.get("revision") or "down_revision" not in found:
            return None
        revisions.add(found["revision"])  # type: ignore[arg-type]
        if found["down_revision"]:
            parents.add(found["down_revision"])  # type: ignore[arg-type]
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None
