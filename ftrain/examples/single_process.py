"""A single-process training script protected by ftrain: no process group, no torchrun.

    python -m ftrain.examples.single_process --location ./ckpt/single-demo
    ftrain run single-demo --nodes 1 --gpus-per-node 1 -- python -m ftrain.examples.single_process

The manager makes a private one-process group of its own. Besides the model and optimizer it saves an
exponential moving average of the weights, as any object with `state_dict`/`load_state_dict` can be saved.
"""

import argparse
import hashlib

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.process_exit import run_then_exit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--location", help="a directory or s3://bucket/prefix/<run> (ftrain run sets it)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # ftrain: name what shapes training, load, save when due, and save the end
    ckpt = CheckpointManager(args.location, model=model, optimizer=optimizer, states={"ema": ema}, every=10)
    step = ckpt.load()
    while step < args.steps:
        inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(step))
        loss = nn.functional.mse_loss(model(inputs), inputs.mean(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update_parameters(model)
        step += 1
        if ckpt.due(step):
            ckpt.save(step)
    ckpt.save(step, final=True)  # the end state is the run's last checkpoint (skipped if just saved)
    ckpt.close()

    weights = [*model.parameters(), *ema.parameters()]
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in weights)).hexdigest()
    print(f"FINAL step={step} loss={loss.item():.4f} params_sha256={digest}", flush=True)


if __name__ == "__main__":
    run_then_exit(main)  # exits without the interpreter's teardown, which races gloo's threads
