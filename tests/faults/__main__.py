"""python -m tests.faults [--quick] [--case ID ...]: run the fault cases, print the tally."""

from __future__ import annotations

import argparse
import sys

from tests.faults.processes import run_process_scenarios
from tests.faults.runner import run_cases, tally_table


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--quick", action="store_true", help="the reduced set CI runs")
    parser.add_argument("--case", action="append", default=[], help="only these case ids")
    parser.add_argument(
        "--scenario", action="append", default=[], help="only these scenarios (R2 ... R6)"
    )
    args = parser.parse_args()
    wanted = set(args.scenario) or {"R2", "R3", "R4", "R5", "R6"}
    results = []
    if wanted & {"R3", "R5"} or args.case:
        results += run_cases(quick=args.quick, only=args.case, progress=sys.stdout)
    if wanted & {"R2", "R4", "R6"} and not args.case:
        results += run_process_scenarios(quick=args.quick, progress=sys.stdout)
    results = [r for r in results if r.case.scenario in wanted or args.case]
    print(tally_table(results))
    failed = [r for r in results if r.problems]
    for r in failed:
        print(f"FAILED {r.case.scenario} {r.case.id}: {'; '.join(r.problems)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
