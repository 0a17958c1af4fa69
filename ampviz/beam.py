"""A small regression task whose gradients are small for a reason a learner can follow: a
surrogate model of beam deflection.

Each example is a simply supported beam (span 5 m) carrying two point loads. The inputs are the
two load positions (m), the two loads (1-10 kN) and the beam's bending stiffness EI (0.5-2 MN m^2,
timber or light steel floor beams); the target is the deflection at 64 evenly spaced gauges, in
metres, from the Euler-Bernoulli closed form (computed in float64, no noise). The model
standardises its inputs, embeds them (Linear 5 -> 32), runs two pre-LayerNorm residual MLP blocks
(LayerNorm, Linear 32 -> 64, GELU, Linear 64 -> 32, plus the skip), a final LayerNorm and a
Linear head to 64 standardised deflections, and turns those back into metres with the training
set's per-gauge mean and spread. The loss is the mean squared error in m^2; the optimiser Adam
(learning rate 1e-3).

Why its gradients are small: the loss averages over batch x 64 numbers (16,384 for a batch of
256), so its gradient with respect to one predicted deflection is 2 x error / 16,384; the errors
are millimetres (about 5e-3 m), about 6e-7; the head's output is then multiplied by each gauge's
spread in metres (about 1e-2), and the chain rule multiplies the gradient by it again: about 5e-9
where the gradient enters the network's last fp16 output, below fp16's smallest subnormal
(2^-24, 6e-8). Without a loss scale, fp16's backward pass flushes most of them to 0 and every
layer below gets its gradient from there; fp32, bf16 (fp32's range) and fp16 with a scale of
2^16 keep them, and Adam, which divides each step by the running size of that weight's own
gradient, learns from them as from large ones.

``ampviz.live`` trains it as the ``"beam"`` model. This module needs torch.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SPAN", "GAUGES", "N_TRAIN", "N_TEST", "beams", "BeamNet", "BeamData"]

SPAN = 5.0  # m
LOADS = 2  # point loads per beam
LOAD_KN = (1.0, 10.0)  # kN, uniform
EI_MNM2 = (0.5, 2.0)  # bending stiffness, MN m^2, uniform
GAUGES = 64  # deflection at 64 evenly spaced points
N_TRAIN, N_TEST = 4096, 1024


def beams(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random beams from ``gen``: inputs (n, 5) = (a1, a2 [m], P1, P2 [kN], EI [MN m^2]) and
    deflections (n, 64) in metres (downwards positive), both float32 (computed in float64)."""
    f64 = torch.float64
    a = SPAN * (0.1 + 0.8 * torch.rand(n, LOADS, generator=gen, dtype=f64))
    p = LOAD_KN[0] + (LOAD_KN[1] - LOAD_KN[0]) * torch.rand(n, LOADS, generator=gen, dtype=f64)
    ei = EI_MNM2[0] + (EI_MNM2[1] - EI_MNM2[0]) * torch.rand(n, 1, generator=gen, dtype=f64)
    return torch.cat([a, p, ei], 1).float(), deflection(a, p, ei).float()


def deflection(a: torch.Tensor, p: torch.Tensor, ei: torch.Tensor) -> torch.Tensor:
    """Deflection (m) at the gauges of beams with point loads ``p`` (kN) at ``a`` (m) and stiffness
    ``ei`` (MN m^2): superposed closed forms for a simply supported beam (float64)."""
    f64 = torch.float64
    x = (torch.arange(GAUGES, dtype=f64) + 0.5) / GAUGES * SPAN
    P, EI, L = p.to(f64) * 1e3, ei.to(f64) * 1e6, SPAN
    w = torch.zeros(a.shape[0], GAUGES, dtype=f64)
    for k in range(a.shape[1]):
        ak, pk = a[:, k:k + 1].to(f64), P[:, k:k + 1]
        bk = L - ak
        left = pk * bk * x * (L**2 - bk**2 - x**2) / (6 * L * EI)  # 0 <= x <= a
        right = pk * ak * (L - x) * (L**2 - ak**2 - (L - x) ** 2) / (6 * L * EI)  # a <= x <= L
        w += torch.where(x <= ak, left, right)
    return w


class Block(nn.Module):
    """A pre-LayerNorm residual MLP block: h + fc2(GELU(fc1(LayerNorm(h))))."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, h):
        return h + self.fc2(self.act(self.fc1(self.norm(h))))


class BeamNet(nn.Module):
    """Standardised inputs -> embed -> residual blocks -> LayerNorm -> head -> deflections in metres
    (the training set's per-gauge mean plus its spread times the head's output)."""

    def __init__(self, x_mean, x_std, y_mean, y_std, width: int = 32, hidden: int = 64, depth: int = 2):
        super().__init__()
        self.register_buffer("x_mean", x_mean.clone())
        self.register_buffer("x_std", x_std.clone())
        self.register_buffer("y_mean", y_mean.clone())
        self.register_buffer("y_std", y_std.clone())
        self.embed = nn.Linear(x_mean.numel(), width)
        self.blocks = nn.Sequential(*[Block(width, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, y_mean.numel())

    def forward(self, x):
        h = self.blocks(self.embed((x - self.x_mean) / self.x_std))
        return self.y_mean + self.y_std * self.head(self.norm(h))


class BeamData:
    """The seeded data set: ``N_TRAIN`` training and ``N_TEST`` held-out beams from a generator
    seeded with ``seed``; ``model(init_seed)`` builds a ``BeamNet`` standardised on the training
    set (its initialisation drawn inside ``torch.random.fork_rng``, the caller's random state left
    alone); ``sampler(batch_size, seed)`` draws training batches with replacement."""

    def __init__(self, seed: int = 1):
        X, Y = beams(N_TRAIN + N_TEST, torch.Generator().manual_seed(seed))
        self.X, self.Y = X[:N_TRAIN], Y[:N_TRAIN]
        self.X_test, self.Y_test = X[N_TRAIN:], Y[N_TRAIN:]

    def model(self, init_seed: int = 0) -> BeamNet:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            return BeamNet(self.X.mean(0), self.X.std(0), self.Y.mean(0), self.Y.std(0))

    def sampler(self, batch_size: int, seed: int):
        gen = torch.Generator().manual_seed(seed)

        def batch():
            idx = torch.randint(0, N_TRAIN, (batch_size,), generator=gen)
            return (self.X[idx],), self.Y[idx]

        return batch
