"""The benchmark suite's smoke run: every benchmark runs on tiny sizes and writes its rows.

It checks that the benchmarks still run against the current hpcdl (they drive its job
payload, hooks and trainer), never how fast anything is: timings belong in
benchmarks/results/, as ratios measured in one run (docs/performance.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import pytest

from tests.conftest import smoke_benchmarks


def test_interleaved_runs_rounds_in_turn_and_drops_the_warmup() -> None:
    from benchmarks.timing import interleaved, median_ratio

    calls: list[str] = []

    def candidate(name: str):
        def call() -> int:
            calls.append(name)
            return len(calls)

        return call

    results = interleaved({"a": candidate("a"), "b": candidate("b")}, repeats=2, warmup_rounds=1)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert results == {"a": [3, 5], "b": [4, 6]}
    # Per-round ratios 2.0, 1.0 and 9.0: their median, not a ratio of separate medians.
    assert median_ratio([2.0, 3.0, 9.0], [1.0, 3.0, 1.0]) == 2.0


def test_the_record_of_an_epochs_last_step_waits_for_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only there, and only where the benchmark says how many steps an epoch has: a loop
    that queues its steps on a GPU without reading them is timed to where they have run."""
    from benchmarks import hooks

    waits: list[int] = []
    monkeypatch.setattr(hooks, "_wait_for_the_gpu", lambda: waits.append(1))
    monkeypatch.setenv(hooks.TIMES_VAR, str(tmp_path / "times"))
    for step in (1, 2, 3):
        hooks.write_record("step", step, 0, step, 0)
    assert waits == []
    monkeypatch.setenv(hooks.STEPS_VAR, "3")
    for step in (1, 2, 3):
        hooks.write_record("step", 3 + step, 1, step, 0)
    hooks.write_record("start", 7, 2, 3, 0)  # not a step record
    assert waits == [1]
    assert [r.step_in_epoch for r in hooks.read_records(tmp_path / "times")] == [1, 2, 3, 1, 2, 3, 3]


def test_a_failing_benchmark_leaves_the_others_rows_written_after_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU session's call can be killed at its time limit: the results file is rewritten
    after each benchmark, and a failing one does not stop the ones after it."""
    import json

    from benchmarks import run
    from benchmarks.base import Row, Settings

    seen_after_first: list[dict] = []

    def first(settings: Settings) -> list[Row]:
        return [Row("first.a", "x", "y", 1.5, 2.0)]

    def broken(settings: Settings) -> list[Row]:
        [written] = tmp_path.glob("*-smoke.json")  # first's row is already on disk
        seen_after_first.append(json.loads(written.read_text()))
        raise RuntimeError("boom")

    def last(settings: Settings) -> list[Row]:
        return [Row("last.b", "x", "y", 0.5, None)]

    monkeypatch.setitem(run.ALL_BENCHMARKS, "first", first)
    monkeypatch.setitem(run.ALL_BENCHMARKS, "broken", broken)
    monkeypatch.setitem(run.ALL_BENCHMARKS, "last", last)
    assert run.main(["first", "broken", "last", "--smoke", "--out", str(tmp_path)]) == 1
    assert "failed: broken (the other benchmarks' rows are written)" in capsys.readouterr().err
    [early] = seen_after_first
    assert (early["finished"], early["failed"], [r["id"] for r in early["rows"]]) == (
        False,
        [],
        ["first.a"],
    )
    [path] = tmp_path.glob("*-smoke.json")
    record = json.loads(path.read_text())
    assert (record["finished"], record["failed"]) == (True, ["broken"])
    assert [r["id"] for r in record["rows"]] == ["first.a", "last.b"]
    assert "- **incomplete**: failed: broken" in path.with_suffix(".md").read_text()


@pytest.mark.slow  # DataLoader worker processes, fresh interpreters; about 50 s on a 2-core VM
def test_smoke_run_writes_every_row_with_a_finite_positive_ratio(tmp_path: Path) -> None:
    from benchmarks.registry import BENCHMARKS

    record = smoke_benchmarks(tmp_path, "--all")

    assert record["smoke"] is True
    assert record["benchmarks"] == list(BENCHMARKS)
    for key in ("python", "torch", "numpy", "hpcdl"):
        assert record["versions"][key]
    assert record["machine"]["cpu_model"] and record["date"]
    assert "revision" in record["git"]

    ids = [row["id"] for row in record["rows"]]
    for name in BENCHMARKS:
        assert any(i.startswith(f"{name}.") for i in ids), f"no rows from {name}: {ids}"
    assert {
        "overhead.mlp.loop",
        "options.mlp.lagged_sync",
        "options.mlp.resident",
        "overhead.mlp.vs_dataloader",
        "overhead.mlp.lightning",  # Lightning is in the dev extra: its row must be there
        "lazy_epoch.loop",
        "resumed_step.vs_step",
        "resumed_step.vs_new_run",
        "resumed_step.vs_plain_resume",
        "sweep_submit.command",
        "sweep_submit.plan",
        "dry_run.vs_import_torch",
        "checkpoint.save",
        "checkpoint.load_latest",
        "checkpoint.resume",
        "checkpoint.stall",
        "mfu.resnet18_w8",
        "time_to_accuracy.cnn",
    } <= set(ids)
    rows = {row["id"]: row for row in record["rows"]}
    # MFU: the counted FLOPs and the measured peak make the ratio, which is 1 / MFU.
    mfu = rows["mfu.resnet18_w8"]["details"]
    assert mfu["flops_per_step"] > 0 and mfu["peak_flops_per_s"]["median"] > 0
    assert mfu["mfu"] == pytest.approx(1 / rows["mfu.resnet18_w8"]["ratio"], rel=1e-4)
    # Time to accuracy: on a CPU the hand loop does hpcdl's arithmetic, so both reach the
    # target at the same epoch with the same validation accuracy.
    tta = rows["time_to_accuracy.cnn"]["details"]
    assert tta["hpcdl_epochs"] == tta["hand_epochs"]
    assert tta["hpcdl_accuracy"] == tta["hand_accuracy"]
    assert min(tta["hpcdl_accuracy"]) >= tta["sizes"]["target"]
    # The sweep went to the stub sbatch as one job array; the dry run left torch alone.
    assert (
        rows["sweep_submit.command"]["details"]["slurm_calls"].count("sbatch JOB_ARRAY_SCRIPT") == 1
    )
    assert rows["sweep_submit.plan"]["details"]["create_sweep_s"]["median"] > 0
    assert rows["dry_run.vs_import_torch"]["details"]["imports_torch"] is False
    lightning = rows["overhead.mlp.lightning"]["details"]
    assert lightning["lightning_version"] and lightning["lightning_over_hpcdl"] > 0
    assert rows["overhead.mlp.vs_dataloader"]["details"]["dataloader_vs_hand"] > 0
    assert rows["overhead.mlp.loop"]["details"]["final_weights_identical_to_hand"] is True
    # The resumes ran as fresh processes, from the start of which their first step is timed.
    plain = rows["resumed_step.vs_plain_resume"]["details"]
    assert plain["plain_first_over_step"] > 0
    assert plain["time_to_first_step_s"]["resumed"]["median"] > 0
    for row in record["rows"]:
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, row
        assert row["what"] and row["baseline"]
        assert row["details"]["measured_s"]["median"] > 0, row
        assert row["details"]["baseline_s"]["median"] > 0, row


@pytest.mark.slow  # trains a tiny ResNet-18 twice in-process; about 10 s
def test_checkpoint_smoke_saves_loads_and_times_the_stall(tmp_path: Path) -> None:
    rows = {row["id"]: row for row in smoke_benchmarks(tmp_path, "checkpoint")["rows"]}
    assert list(rows) == [
        "checkpoint.save",
        "checkpoint.load_latest",
        "checkpoint.resume",
        "checkpoint.stall",
        "checkpoint.share",
    ]
    share = rows["checkpoint.share"]
    assert 0 < share["ratio"] < 1
    assert share["goal"] == (0.01 if share["details"]["device"] == "cuda" else 0.02)
    save = rows["checkpoint.save"]["details"]
    # hpcdl's file is torch.save's bytes plus the 48-byte trailer (torch skips no data).
    assert save["file_bytes"] > save["state_bytes"] > 0
    assert abs(save["file_bytes"] - 48 - save["torch_file_bytes"]) < 4096
    stall = rows["checkpoint.stall"]["details"]
    for key in ("saving_step_s", "normal_step_s", "after_save_s"):
        assert stall[key]["async"]["median"] > 0 and stall[key]["sync"]["median"] > 0
    assert "trainer.async_checkpoint=true" in stall["overrides"]


def test_checkpoint_stall_is_the_saving_interval_minus_a_normal_one() -> None:
    from benchmarks.checkpoint import SMOKE, step_intervals
    from benchmarks.hooks import Record

    # 16 steps 0.1 s apart; the save after step 8 (save_every 8) holds the loop 0.25 s,
    # and the three steps after it run 0.02 s slower (a background write beside them).
    t, records = 0.0, []
    for step in range(1, SMOKE.num_steps + 1):
        records.append(Record("step", step, 0, step, 0, t))
        t += 0.1 + (0.25 if step == 8 else 0.0) + (0.02 if step in (9, 10, 11) else 0.0)
    medians = step_intervals(records, SMOKE)
    assert medians["saving_step"] == pytest.approx(0.35)
    assert medians["normal_step"] == pytest.approx(0.1)
    assert medians["after_save"] == pytest.approx(0.12)
    assert medians["stall"] == pytest.approx(0.25)
    with pytest.raises(RuntimeError, match="step records"):
        step_intervals(records[:-1], SMOKE)


def test_overhead_rows_and_table_from_measured_rounds() -> None:
    from benchmarks.overhead import GPU_ONLY, SMOKE, Measured, rows_from, table

    def rounds(loop_s: float) -> list[dict[str, float]]:
        # Two rounds; the second 10% slower for every loop (a busier minute).
        return [
            {"loop": loop_s * k, "step": loop_s * k / 4, "period": loop_s * k, "boundary": 0.0}
            for k in (1.0, 1.1)
        ]

    loops = {"hand": rounds(0.8), "hpcdl": rounds(1.0), "dataloader": rounds(1.6)}
    weights = {"hand": ["w", "w"], "hpcdl": ["w", "w"], "dataloader": ["d1", "d2"]}
    cpu = Measured(SMOKE[0], loops, num_steps_per_epoch=4, device="cpu", weights=weights)
    ids = {row.id: row for row in rows_from(cpu)}
    assert list(ids) == ["overhead.mlp.loop", "overhead.mlp.epoch", "overhead.mlp.vs_dataloader"]
    assert ids["overhead.mlp.loop"].ratio == pytest.approx(1.25)
    assert ids["overhead.mlp.loop"].details["final_weights_identical_to_hand"] is True
    assert ids["overhead.mlp.vs_dataloader"].ratio == pytest.approx(0.625)
    assert ids["overhead.mlp.vs_dataloader"].goal is None  # P2's goal is for a GPU
    lines = table(cpu).splitlines()
    assert lines[2] == "| hpcdl | 1050.00 | 262.500 | 1.00x | - |"  # medians, in ms
    assert lines[3].startswith("| hand-written") and lines[3].endswith("| 0.80x | identical |")
    assert lines[4].endswith("| differ |")
    assert len(lines) == 5  # no Lightning row when it did not run
    # One run of hpcdl that ended elsewhere is enough to say so.
    diverged = Measured(SMOKE[0], loops, 4, "cpu", weights={**weights, "hpcdl": ["w", "x"]})
    assert rows_from(diverged)[0].details["final_weights_identical_to_hand"] is False

    gpu = Measured(
        SMOKE[0], {**loops, "lightning": rounds(2.5)}, 4, device="cuda", lightning="2.6.6"
    )
    ids = {row.id: row for row in rows_from(gpu)}
    assert ids["overhead.mlp.vs_dataloader"].goal == pytest.approx(1 / 3)
    assert ids["overhead.mlp.loop"].goal == 1.10  # P1 on a GPU: tiny models 1.10, CPU 1.05
    assert rows_from(cpu)[0].goal == 1.05
    resnet = Measured(GPU_ONLY[0], loops, 4, device="cuda")
    assert rows_from(resnet)[0].goal == 1.03  # ResNet-18 bf16 on a GPU
    lightning = ids["overhead.mlp.lightning"]
    assert lightning.ratio == pytest.approx(0.4) and lightning.meets_goal
    assert lightning.details["lightning_over_hpcdl"] == pytest.approx(2.5)
    assert table(gpu).splitlines()[-1].startswith("| Lightning 2.6.6, Trainer(barebones=True) |")
    assert table(gpu).splitlines()[-1].endswith("| - |")  # no weights recorded
    assert lightning.details["final_weights_identical_to_hand"] is None


@pytest.mark.slow  # imports Lightning and trains the MLP three times in-process; about 5 s
def test_lightning_and_hand_written_loops_do_the_same_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same seed, same orders: Lightning's loop ends with the hand loop's weights, and
    both stamp every step of every epoch; the DataLoader loop stamps them too."""
    import torch

    from benchmarks import hooks, lightning_loop, loops

    overrides = ["model=mlp", "data=breast_cancer", "trainer.batch_size=128"]
    trained, stamped = {}, {}
    for name, loop in (
        ("hand", loops.raw_slicing_loop),
        ("lightning", lightning_loop.lightning_loop),
        ("dataloader", loops.dataloader_loop),
    ):
        work = loops.build_work(overrides)
        times = tmp_path / f"{name}.times"
        monkeypatch.setenv(hooks.TIMES_VAR, str(times))
        loop(work, 2)
        trained[name] = work.model.state_dict()
        stamped[name] = [(r.epoch, r.step_in_epoch) for r in hooks.read_records(times)]
    steps = work.num_steps_per_epoch
    assert stamped["hand"] == [(e, s) for e in range(2) for s in range(1, steps + 1)]
    assert stamped["lightning"] == stamped["hand"] == stamped["dataloader"]
    for key, value in trained["hand"].items():
        assert torch.equal(value, trained["lightning"][key]), key
    # The DataLoader draws its own order: its weights differ, so the check above can fail.
    assert any(not torch.equal(v, trained["dataloader"][k]) for k, v in trained["hand"].items())


@pytest.mark.slow  # a fresh interpreter trains four loops; about 10 s
def test_bench_overhead_prints_every_loop_against_hpcdl(hpcdl) -> None:
    from benchmarks.lightning_loop import PINNED

    # From a folder outside the source tree: the command finds benchmarks/ itself.
    out = hpcdl(
        "bench", "overhead", "model=mlp", "data=breast_cancer", "trainer.batch_size=128",
        "--epochs", "3", "--repeats", "1", "--warmup-rounds", "0",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("model=mlp data=breast_cancer precision=fp32 batch 128 (4 steps")
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows[0] == "| loop | epoch (ms) | step (ms) | time / hpcdl's | hpcdl's final weights |"
    assert rows[1].startswith("| hpcdl |") and rows[1].endswith("| 1.00x | - |")
    assert [(r.split(" | ")[0], r.split(" | ")[-1]) for r in rows[2:]] == [
        ("| hand-written: randperm, x[idx]", "identical |"),
        ("| DataLoader(TensorDataset, shuffle=True)", "differ |"),
        (f"| Lightning {PINNED.split('==')[1]}, Trainer(barebones=True)", "identical |"),
    ]
    bad = hpcdl("bench", "overhead", "--epochs", "2")
    assert bad.returncode == 2 and "--epochs 2: at least 3" in bad.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=custom", "data.target=benchmarks.lazy:build"], "data=custom is read lazily"),
        (
            ["task=custom", "task.target=mylab:step", "trainer.early_stopping.monitor=val_loss"],
            "task=custom: the loops compared here train with cross-entropy",
        ),
        (["trainer.compile=true"], "trainer.compile=True: the hand-written and Lightning"),
    ],
)
def test_overhead_refuses_what_its_other_loops_cannot_do_alike(
    overrides: list[str], message: str
) -> None:
    from benchmarks.loops import check_comparable
    from hpcdl.cli.compose import compose_config
    from hpcdl.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        check_comparable(compose_config(["cluster=debug", *overrides]))
    check_comparable(compose_config(["cluster=debug", "model=cnn", "data=digits"]))


def test_bench_devices_prints_the_table_for_the_cpu_and_each_gpu(hpcdl) -> None:
    import torch

    out = hpcdl("bench", "devices", "--batch-sizes", "4,16", "--steps", "2")
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows[0].startswith("| device | batch | step (ms) | samples/s | speedup vs CPU |")
    assert len(rows) - 1 == 2 * (1 + torch.cuda.device_count())
    assert rows[1].startswith("| cpu (") and rows[1].endswith("| 1.00x |")
    if torch.version.cuda is None:  # no GPU row, and why (a student on a GPU node saw none)
        assert out.stderr == (
            f"note: torch {torch.__version__} is a CPU-only build: no GPU rows (on a GPU node, "
            "install a CUDA build of torch)\n"
        )
    elif torch.cuda.device_count():
        assert out.stderr == ""
    one = hpcdl("bench", "devices", "--batch-sizes", "4", "--steps", "1",
                env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert "| cpu (1 thread) |" in one.stdout, one.stdout
    bad = hpcdl("bench", "devices", "--batch-sizes", "4,x")
    assert bad.returncode == 2 and "--batch-sizes" in bad.stderr


def _hpcdl_and_hand_weights(
    tmp_path: Path, overrides: list[str], epochs: int
) -> tuple[str, str, Optional[str]]:
    """weights_sha256 after `epochs` epochs: hpcdl's run (in this process, one rank), the
    hand-written loop, and the hand loop with another seed's epoch orders (None for the GPU)."""
    from dataclasses import replace

    from benchmarks import loops
    from benchmarks.inprocess import create_run, run_in_process
    from hpcdl.provenance import weights_sha256

    overrides = [*overrides, f"trainer.max_epochs={epochs}", "trainer.early_stopping.patience=99"]
    run_dir = create_run(overrides, tmp_path / "run")
    with open(tmp_path / "run.log", "w") as log:
        assert run_in_process(run_dir, log, {}).completed
    summary = run_dir.read_summary()
    assert summary is not None
    hashes = []
    for seed_offset in (0, 1):
        work = loops.build_work(overrides)
        loops.raw_slicing_loop(replace(work, seed=work.seed + seed_offset), epochs)
        hashes.append(weights_sha256(work.model.state_dict()))
    return summary["weights_sha256"], hashes[0], hashes[1]


@pytest.mark.parametrize(
    ("overrides", "epochs"),
    [
        # dropout (the global RNG), a short last batch (398 rows, batch 30), 2 epochs
        (["model=mlp", "data=breast_cancer", "trainer.batch_size=30"], 2),
        (["model=mlp", "data=breast_cancer", "trainer.batch_size=7", "optim=adam"], 1),
        (["model=cnn", "data=digits", "trainer.batch_size=64", "trainer.precision=bf16"], 1),
        # The loss read one step late, the skip left to the fused kernel: the same weights
        # as a hand loop with that kernel.
        (["model=mlp", "data=breast_cancer", "trainer.batch_size=30", "trainer.lagged_sync=true"], 2),
    ],
    ids=["mlp-sgd", "mlp-adam", "cnn-bf16", "mlp-sgd-lagged"],
)
def test_hpcdl_ends_with_the_hand_written_loops_weights_bit_for_bit(
    tmp_path: Path, overrides: list[str], epochs: int
) -> None:
    """P1's exactness: with the same seed and epoch orders, hpcdl's trainer (its loss scaling
    for the global batch, its validation passes, checkpoints and metrics between epochs)
    does exactly the hand loop's arithmetic. The hand loop with another seed's orders ends
    elsewhere: the comparison can fail."""
    hpcdl_weights, hand, other_orders = _hpcdl_and_hand_weights(tmp_path, overrides, epochs)
    assert hpcdl_weights == hand
    assert other_orders != hand


@pytest.mark.gpu
def test_hpcdl_ends_with_the_hand_written_loops_weights_on_the_gpu(tmp_path: Path) -> None:
    """The same on a GPU in deterministic mode (trainer.deterministic=true: deterministic
    kernels for both, the same CUDA seeds)."""
    overrides = [
        "model=cnn", "data=digits", "trainer.batch_size=64", "trainer.device=cuda",
        "trainer.deterministic=true",
    ]  # fmt: skip
    hpcdl_weights, hand, _ = _hpcdl_and_hand_weights(tmp_path, overrides, 1)
    assert hpcdl_weights == hand


def test_kernel_counts_name_what_each_hpcdl_loop_adds_to_the_hand_written_step(capsys) -> None:
    """python -m benchmarks.kernels on the CPU: the aten operators per step of the three loops,
    and what hpcdl adds by name (eager: the loss read; lagged: the on-device skip test)."""
    from benchmarks import kernels

    kernels.counts.clear()
    assert kernels.main(["model=mlp", "data=breast_cancer"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    for loop in ("hand-written", "hpcdl lagged_sync=true", "hpcdl lagged_sync=false"):
        assert float(rows[loop].split("|")[2]) > 5  # a step is more than a few operators
    assert "- hpcdl lagged_sync=false:" in out and "aten::item +1" in out
    lagged = next(line for line in out.splitlines() if line.startswith("- hpcdl lagged_sync=true"))
    assert "aten::ne_ +1" in lagged and "aten::item" not in lagged  # no read of its own step
