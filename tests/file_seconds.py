"""python -m tests.file_seconds UNIT.xml: rewrite tests/file_seconds.json, each test file's
total seconds in a pytest --junitxml report (tests/run.sh's unit tier on CI's machine),
which tests/conftest.py orders the files by (longest first, for the xdist workers)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")


def file_seconds(report: Path) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.slurm.test_x[.TestClass]
        end = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        totals["/".join(parts[: end + 1]) + ".py"] += float(case.get("time", 0))
    return {name: round(s) for name, s in totals.most_common() if s >= 1}


if __name__ == "__main__":
    TABLE.write_text(json.dumps(file_seconds(Path(sys.argv[1])), indent=1) + "\n")
