# lightning_train.py: a Lightning script that hpcdl can stop, requeue and resume (docs/scripts.md).
#   hpcdl run cluster=local cluster.tasks_per_node=2 -- python lightning_train.py --epochs 20
import argparse
import os
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import hpcdl.api as hp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--sleep", type=float, default=0.0)  # per batch: time to stop it
args = parser.parse_args()
hp.catch_stop_signals()  # from here on, a stop signal only sets hp.stop_requested()


class StopOnRequest(OnExceptionCheckpoint):
    """hpcdl's stop request ends fit after the same batch on every rank, exit status 3;
    on_exception (OnExceptionCheckpoint) saves RUN_DIR/checkpoints/on_exception.ckpt first."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning has just installed its own SIGTERM handler, which runs a collective inside
        # the handler and can deadlock DDP (2.6); hpcdl's flag-only handlers replace it.
        hp.catch_stop_signals()

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.strategy.reduce_boolean_decision(hp.stop_requested(), all=False):
            raise SystemExit(hp.EXIT_REQUEUE)


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )

    def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
        time.sleep(args.sleep)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(0)
x = torch.randn(512, 10)
loader = DataLoader(TensorDataset(x, x.mean(1, keepdim=True)), batch_size=64)
# The ranks hpcdl started: Lightning must neither start its own nor count fewer.
env = hp.rank_env()
per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
root = hp.run_dir() or Path("runs/lightning")  # the same for every attempt; plain python: here
trainer = L.Trainer(
    max_epochs=args.epochs,
    accelerator="auto",  # the GPUs the job was given (cluster.gpus_per_node), else the CPU
    devices=per_node,
    num_nodes=env.world_size // per_node,
    strategy="ddp" if env.world_size > 1 else "auto",
    default_root_dir=root,
    callbacks=[
        ModelCheckpoint(dirpath=root / "checkpoints", save_last=True),
        StopOnRequest(root / "checkpoints"),
    ],
    enable_progress_bar=False,
    logger=False,
)
model = Net()
trainer.fit(model, loader, ckpt_path="last")  # the newest of last.ckpt, on_exception.ckpt
if trainer.global_rank == 0:  # read by metrics_file=result.json
    loss = torch.nn.functional.mse_loss(model.net(x), x.mean(1, keepdim=True)).item()
    (root / "result.json").write_text(
        f'{{"train_loss": {loss:.6f}, "step": {trainer.global_step}}}\n'
    )
