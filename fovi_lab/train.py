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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from fovi_lab.graph.geometry import foveated_knn_graph
from fovi_lab.ops.autograd import KNNConv, get_ops

__all__ = ["load_digits_tensors", "FoveatedDigitsNet", "TrainResult", "train_digits"]


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
    """

    def __init__(self, backend: str = "torch_compact", res: int = 32, a: float = 0.5, k: int = 9,
                 channels=(16, 32), ref_frame_mult: float = 2.0, fov: float = 16.0):
        super().__init__()
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
        self.norm1 = torch.nn.BatchNorm1d(c1)
        self.norm2 = torch.nn.BatchNorm1d(c2)
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
    backend: str
    device: str
    steps: List[int] = field(default_factory=list)
    loss: List[float] = field(default_factory=list)
    test_accuracy: float = float("nan")
    seconds: float = 0.0

    def as_dict(self) -> Dict:
        return {"backend": self.backend, "device": self.device, "steps": self.steps, "loss": self.loss,
                "test_accuracy": self.test_accuracy, "seconds": self.seconds}


def train_digits(backend: str = "torch_compact", steps: int = 30, batch: int = 64, lr: float = 1e-2,
                 device=None, seed: int = 0, log_every: int = 5, jitter: float = 0.05, log=None) -> TrainResult:
    """Train :class:`FoveatedDigitsNet` for ``steps`` Adam steps; returns the loss curve and test accuracy.

    Fixations are jittered by up to ``jitter`` (normalised units) per image during training.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = load_digits_tensors(seed=seed)
    model = FoveatedDigitsNet(backend=backend).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    res = TrainResult(backend, str(device))
    t0 = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        i = torch.randint(0, len(ytr), (batch,), generator=gen)
        fix = (torch.rand(batch, 2, generator=gen) * 2 - 1) * jitter
        logits = model(xtr[i].to(device), fix.to(device))
        loss = F.cross_entropy(logits, ytr[i].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % log_every == 0 or step == 1 or step == steps:
            res.steps.append(step)
            res.loss.append(loss.item())
            if log:
                log(f"[{backend}] step {step}/{steps} loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        correct = 0
        for j in range(0, len(yte), 256):
            correct += int((model(xte[j:j + 256].to(device)).argmax(1).cpu() == yte[j:j + 256]).sum())
    res.test_accuracy = correct / len(yte)
    res.seconds = time.perf_counter() - t0
    return res
