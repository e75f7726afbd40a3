"""A small foveated KNN-conv network trained on real images (scikit-learn's bundled digits).

The images are sampled through a foveated retina (nearest-neighbour ``grid_sample`` at the points of
an isotropic ring grid around a fixation, docs/operator.md §1.1), then go through two strided KNN convolutions,
a global average over nodes and a linear classifier::

    image [B,1,H,W] --retina--> x [B, 1, N0] --KNNConv s2--> [B, C1, N1] --KNNConv s2--> [B, C2, N2]
                    --mean over nodes--> [B, C2] --Linear--> logits [B, 10]

Every KNN convolution runs through :class:`fovi_lab.ops.autograd.KNNConvFunction` with the backend
named by the caller (``torch_compact``, ``warp_train``, ...). The Warp ops compute in fp16, so for them
the features entering each convolution are cast to fp16 and its output back to fp32; the parameters
stay fp32 (fp32 master weights, fp32 gradients), as under AMP.

Data parallel: when ``torch.distributed`` is initialised, :func:`train_digits` wraps the network in
``DistributedDataParallel`` and each of the ``W`` processes takes its ``batch / W`` slice of the same global
batch, so the averaged gradient is the one-process gradient of the whole batch (exactly so with
``norm="group"``; batch norm normalises over each process's slice unless converted to ``SyncBatchNorm``,
which :func:`main` does on CUDA). ``python -m fovi_lab train`` is the entry point, under ``torchrun`` too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from fovi_lab.graph.geometry import foveated_knn_graph
from fovi_lab.ops.autograd import KNNConv, get_ops

__all__ = ["load_digits_tensors", "FoveatedDigitsNet", "TrainResult", "train_digits", "param_digest", "WARMUP_STEPS",
           "main"]


def load_digits_tensors(size: int = 32, seed: int = 0, test_fraction: float = 0.25):
    """scikit-learn's 8x8 digits, upsampled to ``size`` x ``size`` in [0, 1], split train/test.

    Returns ``(x_train [N,1,size,size], y_train [N], x_test, y_test)`` as fp32 / int64 tensors.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


class FoveatedDigitsNet(torch.nn.Module):
    """Retina + two strided KNN convolutions + linear head (see the module docstring).

    Args:
        backend: ops name for every KNN convolution. res: retina resolution budget (res**2 points).
        a: CMF parameter (smaller = stronger foveation). k: neighbours per node. channels: (C1, C2).
        norm: ``"batch"`` (BatchNorm1d over batch and nodes) or ``"group"`` (GroupNorm with 4 groups: per
            image, so a data-parallel step equals the one-process step exactly).
    """

    def __init__(self, backend: str = "torch_compact", res: int = 32, a: float = 0.5, k: int = 9,
                 channels=(16, 32), ref_frame_mult: float = 2.0, fov: float = 16.0, norm: str = "batch"):
        super().__init__()
        if norm not in ("batch", "group"):
            raise ValueError(f"norm: expected 'batch' or 'group', got {norm!r}")
        self.backend = backend
        ops = get_ops(backend)
        dtypes = getattr(ops, "compute_dtypes", (torch.float32,))
        self.compute_dtype = torch.float32 if torch.float32 in dtypes else dtypes[0]
        g1 = foveated_knn_graph(fov=fov, a=a, res=res, in_stride=1, out_stride=2, k=k,
                                ref_frame_mult=ref_frame_mult)
        g2 = foveated_knn_graph(fov=fov, a=a, res=res, in_stride=2, out_stride=4, k=k,
                                ref_frame_mult=ref_frame_mult)
        self.graphs = (g1, g2)
        # retina sample points: the input grid's normalised visual coordinates, as a grid_sample grid
        self.register_buffer("retina", torch.tensor(np.array(g1.in_coords), dtype=torch.float32)
                             .view(1, 1, -1, 2), persistent=False)
        c1, c2 = channels
        self.conv1 = KNNConv.from_graph(g1, 1, c1, bias=True, backend=backend)
        self.conv2 = KNNConv.from_graph(g2, c1, c2, bias=True, backend=backend)
        make_norm = torch.nn.BatchNorm1d if norm == "batch" else (lambda c: torch.nn.GroupNorm(4, c))
        self.norm1 = make_norm(c1)
        self.norm2 = make_norm(c2)
        self.head = torch.nn.Linear(c2, 10)

    def sample(self, images: torch.Tensor, fixation: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Foveated sampling: ``[B,1,H,W]`` -> ``[B,1,N0]`` at the retina points shifted by ``fixation``."""
        grid = self.retina.expand(images.shape[0], -1, -1, -1)
        if fixation is not None:
            grid = grid + fixation.view(-1, 1, 1, 2)
        return F.grid_sample(images, grid, mode="nearest", align_corners=False).squeeze(2)

    def _conv(self, conv: KNNConv, x: torch.Tensor) -> torch.Tensor:
        return conv(x.to(self.compute_dtype)).float()

    def forward(self, images: torch.Tensor, fixation: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.sample(images, fixation)
        x = F.relu(self.norm1(self._conv(self.conv1, x)))
        x = F.relu(self.norm2(self._conv(self.conv2, x)))
        return self.head(x.mean(dim=2))


@dataclass
class TrainResult:
    """What :func:`train_digits` reports: the loss curve (mean over processes at the logged steps), the test
    accuracy, the wall seconds, ``images_per_s`` (global batch images per second over the steps after the first
    :data:`WARMUP_STEPS`, the devices synchronised at both ends) and ``param_digest`` (sha256 of every parameter's
    bytes after training: two runs that end bitwise equal have the same digest)."""
    backend: str
    device: str
    steps: List[int] = field(default_factory=list)
    loss: List[float] = field(default_factory=list)
    test_accuracy: float = float("nan")
    seconds: float = 0.0
    world_size: int = 1
    batch: int = 0
    images_per_s: Optional[float] = None
    param_digest: str = ""

    def as_dict(self) -> Dict:
        return {"backend": self.backend, "device": self.device, "steps": self.steps, "loss": self.loss,
                "test_accuracy": self.test_accuracy, "seconds": self.seconds, "world_size": self.world_size,
                "batch": self.batch, "images_per_s": self.images_per_s, "param_digest": self.param_digest}


#: Steps :func:`train_digits` leaves out of ``images_per_s`` (kernel builds, the first captures), at most a quarter.
WARMUP_STEPS = 5


def param_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in order: equal for two models whose parameters are bitwise equal."""
    import hashlib
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _world():
    """(rank, world size) of the initialised process group, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _check_train_args(backend: Optional[str], steps, batch, lr) -> None:
    """:func:`train_digits`'s arguments at the door, each named as the command line names it: a backend of the
    registry that trains (``backend``, unless a ``model`` is given), ``steps`` and ``batch`` integers >= 1 and
    ``lr`` a number > 0."""
    import argparse
    import numbers

    from fovi_lab.ops.arguments import backend_name

    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError(f"backend: expected a backend name (str), got {type(backend).__name__}")
        try:
            backend_name(trains=True)(backend)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"backend: {exc}") from None
    for arg, value in (("steps", steps), ("batch", batch)):          # numpy's integers are Integral too
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{arg}: expected an integer >= 1, got {value!r}")
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
        raise ValueError(f"lr: expected a number > 0, got {lr!r}")


def train_digits(backend: str = "torch_compact", steps: int = 30, batch: int = 64, lr: float = 1e-2,
                 device=None, seed: int = 0, log_every: int = 5, jitter: float = 0.05, log=None,
                 norm: str = "batch", model: Optional[torch.nn.Module] = None) -> TrainResult:
    """Train :class:`FoveatedDigitsNet` for ``steps`` Adam steps; returns the loss curve and test accuracy.

    Fixations are jittered by up to ``jitter`` (normalised units) per image during training. ``batch`` is
    the global batch: under ``torch.distributed`` each process trains a ``DistributedDataParallel`` copy
    on its ``batch / world_size`` slice (the logged loss is the mean over processes). ``model`` replaces
    the default network (built on ``device`` from ``backend`` and ``norm``).
    """
    _check_train_args(backend if model is None else None, steps, batch, lr)
    rank, world = _world()
    if batch % world:
        raise ValueError(f"batch: the global batch ({batch}) must split evenly over {world} processes")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = load_digits_tensors(seed=seed)
    model = (model if model is not None else FoveatedDigitsNet(backend=backend, norm=norm)).to(device)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)     # every process draws the same global batch
    res = TrainResult(backend, str(device), world_size=world, batch=batch)
    shard = slice(rank * (batch // world), (rank + 1) * (batch // world))
    warm = min(WARMUP_STEPS, steps // 4)
    t0 = t_warm = time.perf_counter()
    net.train()
    for step in range(1, steps + 1):
        if step == warm + 1:
            _sync(device)
            t_warm = time.perf_counter()
        i = torch.randint(0, len(ytr), (batch,), generator=gen)[shard]
        fix = ((torch.rand(batch, 2, generator=gen) * 2 - 1) * jitter)[shard]
        logits = net(xtr[i].to(device), fix.to(device))
        loss = F.cross_entropy(logits, ytr[i].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % log_every == 0 or step == 1 or step == steps:
            value = loss.detach()
            if world > 1:
                value = value.clone()
                torch.distributed.all_reduce(value)
                value /= world
            res.steps.append(step)
            res.loss.append(value.item())
            if log:
                log(f"[{backend}] step {step}/{steps} loss {res.loss[-1]:.3f}")
    _sync(device)
    res.images_per_s = batch * (steps - warm) / (time.perf_counter() - t_warm)
    res.param_digest = param_digest(model)
    model.eval()
    with torch.no_grad():
        correct = 0
        for j in range(0, len(yte), 256):
            correct += int((model(xte[j:j + 256].to(device)).argmax(1).cpu() == yte[j:j + 256]).sum())
    res.test_accuracy = correct / len(yte)
    res.seconds = time.perf_counter() - t0
    return res


#: The help text of ``python -m fovi_lab train``.
DESCRIPTION = """\
Train the small foveated digits network: scikit-learn's 8x8 digits, sampled through a foveated retina, go
through two strided KNN convolutions (computed by the chosen backend), a mean over nodes and a linear classifier.
It prints the loss every tenth of the steps and the test accuracy at the end; --out also writes them as JSON.

Several processes on one host train it data-parallel under torchrun, each on its share of the global batch
(NCCL on GPUs, one per process; gloo on CPUs):

  python -m fovi_lab train --backend warp_train --steps 300
  torchrun --nproc-per-node 2 -m fovi_lab train --backend warp_train
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab train``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import COUNT, backend_name, device_kind, int_at_least, out_file, positive_float

    parser.add_argument("--backend", type=backend_name(trains=True), default="torch_compact",
                        help="the backend that computes every KNN convolution: a registered backend that trains "
                             "(the package ships torch_compact, torch_binned and warp_train)")
    parser.add_argument("--steps", type=COUNT, default=300, help="Adam steps to train")
    parser.add_argument("--batch", type=COUNT, default=256,
                        help="global batch: images per step, split evenly over the processes")
    parser.add_argument("--lr", type=positive_float, default=1e-2, help="Adam's learning rate")
    parser.add_argument("--seed", type=int_at_least(0), default=0,
                        help="seed of the weights, the train/test split and the batches")
    parser.add_argument("--norm", choices=("batch", "group"), default="batch",
                        help="normalisation after each convolution: batch norm, or group norm (4 groups), which "
                             "makes a data-parallel step equal the one-process step exactly")
    parser.add_argument("--device", type=device_kind, default=None,
                        help="cpu or cuda (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument("--out", type=out_file, default=None,
                        help="also write the loss curve and the test accuracy here as JSON (rank 0 writes it)")


def run(args) -> int:
    """Train as ``args`` say (the options of :func:`add_arguments`); returns the exit status."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.batch % world:
        from fovi_lab.ops.arguments import usage_error
        usage_error("python -m fovi_lab train", f"--batch: expected a multiple of the {world} processes, "
                                                f"got {args.batch}")
    kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(kind)
    if world > 1:
        if kind == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if kind == "cuda" else "gloo")
    rank, world = _world()
    try:
        torch.manual_seed(args.seed)
        model = FoveatedDigitsNet(backend=args.backend, norm=args.norm)
        if world > 1 and kind == "cuda" and args.norm == "batch":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        say = (lambda m: print(m, flush=True)) if rank == 0 else None
        res = train_digits(args.backend, steps=args.steps, batch=args.batch, lr=args.lr, device=device,
                           seed=args.seed, log_every=max(1, args.steps // 10), log=say, model=model)
        if rank == 0:
            print(f"{args.backend} on {world} x {device.type}: {args.steps} steps in {res.seconds:.1f} s "
                  f"({res.images_per_s:.0f} images/s after the first {min(WARMUP_STEPS, args.steps // 4)}), "
                  f"final loss {res.loss[-1]:.3f}, test accuracy {res.test_accuracy:.1%}")
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(res.as_dict(), f, indent=1)
                print(f"wrote {os.path.abspath(args.out)}")
    finally:
        if world > 1:
            torch.distributed.barrier()          # no rank tears gloo down while another still talks
            torch.distributed.destroy_process_group()
    return 0


def main(argv=None) -> int:
    """``python -m fovi_lab train``: train the foveated digits network (see :data:`DESCRIPTION`); under
    ``torchrun`` with DDP. Returns the exit status; a usage error exits with status 2."""
    from fovi_lab.ops.arguments import CommandParser

    parser = CommandParser(prog="python -m fovi_lab train", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
