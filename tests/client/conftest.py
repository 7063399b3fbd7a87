"""The client is importable as installed (``pip install -e clients/python``) or, when it is
not, from its source directory, so these tests run either way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CLIENT_SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"

if importlib.util.find_spec("selectivity_client") is None:
    sys.path.insert(0, str(CLIENT_SRC))
