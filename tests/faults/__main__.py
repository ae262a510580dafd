"""python -m tests.faults [--quick] [--case ID ...]: run the fault cases, print the tally."""

from __future__ import annotations

import argparse
import sys

from tests.faults.runner import run_cases, tally_table


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--quick", action="store_true", help="the reduced set CI runs")
    parser.add_argument("--case", action="append", default=[], help="only these case ids")
    args = parser.parse_args()
    results = run_cases(quick=args.quick, only=args.case, progress=sys.stdout)
    print(tally_table(results))
    failed = [r for r in results if r.problems]
    for r in failed:
        print(f"FAILED {r.case.scenario} {r.case.id}: {'; '.join(r.problems)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
