"""hpcdl's benchmarks: every figure is a ratio against a baseline measured in the same run.

    python -m benchmarks.run --all                    # every benchmark, full sizes
    python -m benchmarks.run lazy_epoch --repeats 7   # one benchmark
    python -m benchmarks.run --all --smoke --out /tmp/b   # tiny sizes (the CI smoke test)

A benchmark is one function registered in benchmarks.registry; it returns rows
{id, what, baseline, ratio, goal, details}. The runner writes them, with the machine and
the versions, to benchmarks/results/<date>-<host>-<device>.{json,md}. See
docs/performance.md for what each row measures and how to read it.
"""
