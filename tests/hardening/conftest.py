from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # harden.py, slowproxy.py
sys.path.insert(0, str(HERE.parent / "agents"))  # agent_helpers (tiny Trainer helpers)
