# fsdp_train.py: FSDP2 with torch.distributed.checkpoint (DCP), requeue-safe under hpcdl run.
#
#   hpcdl run cluster=local cluster.tasks_per_node=2 -- python fsdp_train.py --steps 40
#
# Each checkpoint is a folder every rank writes its shards into. It is written under a
# temporary name and renamed by rank 0 once every rank has finished, so a folder with a
# final name is complete; one cut short (a second Ctrl-C, a node lost mid-save) keeps its
# temporary name and is never loaded. The folders live in $HPCDL_RUN_DIR/checkpoints, so
# `hpcdl resume --from-scratch` sets them aside like the store's files.
import argparse
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

import hpcdl.api as hp

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--save-every", type=int, default=10)
parser.add_argument("--keep-last", type=int, default=2)
parser.add_argument("--lr", type=float, default=1e-2)
args = parser.parse_args()

hp.catch_stop_signals()  # a stop (time limit, scancel, Ctrl-C) makes hp.stop_requested() true
env = hp.rank_env()
device = os.environ.get("HPCDL_DEVICE", "cpu")
if device.startswith("cuda"):
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
root = Path(os.environ.get("HPCDL_RUN_DIR", ".")) / "checkpoints"

torch.manual_seed(0)  # the same initial weights on every rank, before sharding
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64),
    torch.nn.GELU(),
    torch.nn.Linear(64, 64),
    torch.nn.GELU(),
    torch.nn.Linear(64, 1),
).to(device)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)


def complete(folder: Path) -> bool:
    return folder.name.startswith("step_") and (folder / ".metadata").is_file()


def save(step: int) -> None:
    """Every rank writes its shards; rank 0 renames the folder once all have, then purges."""
    final = root / f"step_{step:09d}"
    partial = root / f".partial_step_{step:09d}"
    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "opt": opt_state, "step": step}, checkpoint_id=partial)
    dist.barrier()  # every rank's shards are written
    if env.rank == 0:
        os.replace(partial, final)
        for old in sorted(p for p in root.iterdir() if complete(p))[: -args.keep_last]:
            shutil.rmtree(old)
    dist.barrier()  # no rank goes on (or exits) before the rename


def load_latest() -> int:
    """The newest complete checkpoint's step (0 for none), loaded into model and opt."""
    found = sorted(p for p in root.iterdir() if complete(p)) if root.is_dir() else []
    if not found:
        return 0
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "opt": opt_state, "step": 0}
    dcp.load(state, checkpoint_id=found[-1])  # in place, each rank its shards
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])
    print(f"rank {env.rank}: resumed from {found[-1].name}", flush=True)
    return int(state["step"])


def all_agree(flag: bool) -> bool:
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


start = load_latest()
for step in range(start, args.steps):
    # Each step's batch from its step and rank: a resumed run sees the same data.
    g = torch.Generator().manual_seed(1000 * step + env.rank)
    x = torch.randn(64, 32, generator=g).to(device)
    y = x[:, :4].sum(1, keepdim=True).sin()
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    stop = all_agree(hp.stop_requested())
    if stop or (step + 1) % args.save_every == 0:
        save(step + 1)
    if stop:
        dist.destroy_process_group()
        raise SystemExit(hp.EXIT_REQUEUE)  # 3: saved, requeue me
    if env.rank == 0 and (step + 1) % 10 == 0:
        print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)

# The full weights for use elsewhere: gathered to rank 0's CPU, one plain torch.save file.
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if env.rank == 0:
    torch.save(full, Path(os.environ.get("HPCDL_RUN_DIR", ".")) / "final.pt")
dist.destroy_process_group()
