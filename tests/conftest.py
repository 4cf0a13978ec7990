"""The top conftest: plugins for every test run (issue 22's per-module time table)."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]
if str(_REPO_ROOT) not in sys.path:  # tests/ is not a package; make tests.timing importable
    sys.path.insert(0, str(_REPO_ROOT))

pytest_plugins = ["tests.timing", "pytester"]
