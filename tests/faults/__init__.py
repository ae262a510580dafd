"""The fault suite: scenarios tried on purpose, with a tally of what survived.

    python -m tests.faults              # every case, a tally per scenario
    python -m tests.faults --quick      # the reduced set CI runs (tests/test_fault_suite.py)

R3 bad input and R5 crafted checkpoints: each case runs the real `hpcdl` command on a
prepared folder and must end with one line naming the key or file, exit status 2, and the
folder exactly as it was (nothing created, nothing overwritten, no code run). Deterministic:
the same cases in the same order every time.
"""
