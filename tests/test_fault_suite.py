"""The fault suite's reduced set, in CI: every bad input ends with one line naming the key or
file, exit status 2, and its folder exactly as it was (R3); no crafted file runs code (R5);
a writer killed inside a save leaves the newest complete checkpoint loadable (R2); a
failing rank of a 2-rank job ends it, named, with nothing left running (R4). The whole
set: `python -m tests.faults` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from tests.faults.cases import CASES
from tests.faults.processes import run_process_scenarios
from tests.faults.runner import run_cases, tally_table


def test_the_suite_has_what_the_issue_asks_for() -> None:
    scenarios = [c.scenario for c in CASES]
    assert scenarios.count("R3") >= 60 and scenarios.count("R5") >= 4
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.faults
def test_the_reduced_fault_suite_survives_every_case() -> None:
    results = run_cases(quick=True) + run_process_scenarios(quick=True)
    failed = [f"{r.case.id}: {'; '.join(r.problems)}" for r in results if r.problems]
    assert not failed, tally_table(results) + "\n" + "\n".join(failed)
