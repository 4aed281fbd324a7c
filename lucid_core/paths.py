"""Where the project's own files lie: the repository root, for shipped defaults and the shared data beside it.

Kept apart from the modules that read those files so that finding a path imports nothing heavy (pandas,
joblib): `lucid explain` and every live round name the models root without training anything.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
