"""The path a report takes through analysis/: which modules and rooms it enters, and how often
it comes back to one it had left (issue 35's measure of "back and forth").

    .venv/bin/python bench/report_path.py [RUN_URI]     # default: the golden demo run

Every Python call made while `build_report` runs is traced (sys.setprofile); consecutive
calls in one module are one visit. Printed: the modules entered, the visits, the returns to a
module already left, and the same for rooms (analysis' sub-packages), with the room sequence
collapsed (`read derive steps ...`). Reports to a temporary folder, no HTML.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "golden" / "events" / "demo"


def _visits(names: list[str]) -> list[str]:
    """Consecutive repeats collapsed: the sequence of visits."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


def _returns(visits: list[str]) -> int:
    """Visits to a name that had been visited before (and left)."""
    seen: set[str] = set()
    count = 0
    for name in visits:
        count += name in seen
        seen.add(name)
    return count


def main() -> int:
    from analysis import build_report

    uri = sys.argv[1] if len(sys.argv) > 1 else str(next(GOLDEN.iterdir()))
    modules: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("analysis."):
                modules.append(name)

    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(profile)
        try:
            build_report(uri, out, html=False, progress=False)
        finally:
            sys.setprofile(None)
    visits = _visits(modules)
    rooms = _visits([m.split(".")[1] for m in visits])
    print(f"modules entered: {len(set(visits))}; visits: {len(visits)}; "
          f"returns to a module already left: {_returns(visits)}")  # fmt: skip
    print(f"rooms entered: {len(set(rooms))}; visits: {len(rooms)}; "
          f"returns to a room already left: {_returns(rooms)}")  # fmt: skip
    print("most visited modules:", ", ".join(f"{m} {n}" for m, n in Counter(visits).most_common(6)))
    print("room sequence:", " ".join(rooms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
