"""python -m tests.faults [--all | --cluster] [--quick] [--scenario R1 ...] [--case ID ...]:
run the fault scenarios, print the tally. Without --all or --cluster: the local ones (R2-R6
on this machine); --cluster: the dev-cluster ones (R1, and R4/R6 as Slurm jobs), with
slurm/devcluster started if it is not up (root); --all: both."""

from __future__ import annotations

import argparse
import sys

from tests.faults.processes import run_process_scenarios
from tests.faults.runner import run_cases, tally_table

LOCAL = {"R2", "R3", "R4", "R5", "R6"}
ON_CLUSTER = {"R1", "R4", "R6"}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--quick", action="store_true", help="the reduced set CI runs")
    parser.add_argument("--all", action="store_true", help="local and dev-cluster scenarios")
    parser.add_argument("--cluster", action="store_true", help="only the dev-cluster ones")
    parser.add_argument("--case", action="append", default=[], help="only these case ids")
    parser.add_argument(
        "--scenario", action="append", default=[], help="only these scenarios (R1 ... R6)"
    )
    args = parser.parse_args()
    wanted = set(args.scenario) or LOCAL | ON_CLUSTER
    local = not args.cluster
    on_cluster = args.all or args.cluster or "R1" in args.scenario
    results = []
    if local and (wanted & {"R3", "R5"} or args.case):
        results += run_cases(quick=args.quick, only=args.case, progress=sys.stdout)
    if local and wanted & {"R2", "R4", "R6"} and not args.case:
        results += run_process_scenarios(quick=args.quick, progress=sys.stdout)
    if on_cluster and wanted & ON_CLUSTER and not args.case:
        from tests.faults.cluster import run_cluster_scenarios

        results += run_cluster_scenarios(args.quick, wanted & ON_CLUSTER, progress=sys.stdout)
    results = [r for r in results if r.case.scenario in wanted or args.case]
    print(tally_table(results))
    failed = [r for r in results if r.problems]
    for r in failed:
        print(f"FAILED {r.case.scenario} {r.case.id}: {'; '.join(r.problems)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
