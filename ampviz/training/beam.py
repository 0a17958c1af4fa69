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

``ampviz.training.live`` trains it as the ``"beam"`` model; ``gradients`` returns one backward pass of it
(notebook 02's gradients); ``short_runs`` trains it briefly in fp32, fp16, fp16 with a scaler and bf16
(notebook 00's first look at a stall). This module needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ampviz._args import _shown
from ampviz._args import _real, _seed, _whole

__all__ = ["SPAN", "GAUGES", "N_TRAIN", "N_TEST", "beams", "deflection", "BeamNet", "BeamData",
           "BeamGradients", "gradients"]

SPAN = 5.0  # m
LOADS = 2  # point loads per beam
LOAD_KN = (1.0, 10.0)  # kN, uniform
EI_MNM2 = (0.5, 2.0)  # bending stiffness, MN m^2, uniform
GAUGES = 64  # deflection at 64 evenly spaced points
N_TRAIN, N_TEST = 4096, 1024
MAX_BEAMS = 10**6  # 64 deflections each: 0.5 GB of float64 while they are computed
MAX_BATCH = 65536


def _generator(gen) -> torch.Generator:
    if not isinstance(gen, torch.Generator):
        raise TypeError(f"gen must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), not {_shown(gen)}")
    if gen.device.type != "cpu":
        raise ValueError(f"gen must be a CPU generator, not one on {gen.device}")
    return gen


def _column(name: str, value, n: int | None, what: str) -> torch.Tensor:
    """``value`` as a float64 tensor of shape (n, k), its numbers finite."""
    try:
        t = torch.as_tensor(value, dtype=torch.float64) if not isinstance(value, torch.Tensor) else value.detach()
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise TypeError(f"{name} must be a tensor or array of numbers ({what}), not {_shown(value)}") from None
    if t.is_complex() or not (t.is_floating_point() or t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8,
                                                                     torch.uint8)):
        raise TypeError(f"{name} must hold real numbers ({what}), not {t.dtype}")
    t = t.to(torch.float64)
    if t.dim() != 2 or (n is not None and t.shape[0] != n):
        rows = "n rows" if n is None else f"{n} rows"
        raise ValueError(f"{name} must be a 2-D tensor with {rows}, one per beam ({what}), not of shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite numbers ({what})")
    return t


def beams(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random beams from ``gen``: inputs (n, 5) = (a1, a2 [m], P1, P2 [kN], EI [MN m^2]) and
    deflections (n, 64) in metres (downwards positive), both float32 (computed in float64)."""
    n = _whole("n", n, 0, MAX_BEAMS)
    gen = _generator(gen)
    f64 = torch.float64
    a = SPAN * (0.1 + 0.8 * torch.rand(n, LOADS, generator=gen, dtype=f64))
    p = LOAD_KN[0] + (LOAD_KN[1] - LOAD_KN[0]) * torch.rand(n, LOADS, generator=gen, dtype=f64)
    ei = EI_MNM2[0] + (EI_MNM2[1] - EI_MNM2[0]) * torch.rand(n, 1, generator=gen, dtype=f64)
    return torch.cat([a, p, ei], 1).float(), deflection(a, p, ei).float()


def deflection(a: torch.Tensor, p: torch.Tensor, ei: torch.Tensor) -> torch.Tensor:
    """Deflection (m) at the gauges of beams with point loads ``p`` (kN) at ``a`` (m) and stiffness
    ``ei`` (MN m^2): superposed closed forms for a simply supported beam (float64). ``a`` and ``p``
    are (n, loads), ``ei`` is (n, 1); loads outside the span are refused."""
    a = _column("a", a, None, "load positions in metres")
    p = _column("p", p, a.shape[0], "loads in kN")
    ei = _column("ei", ei, a.shape[0], "bending stiffness in MN m^2")
    if p.shape[1] != a.shape[1] or ei.shape[1] != 1:
        raise ValueError(f"p must have one column per load position (a has {a.shape[1]}) and ei one column, "
                         f"not {p.shape[1]} and {ei.shape[1]}")
    if a.shape[0] > MAX_BEAMS:
        raise ValueError(f"at most {MAX_BEAMS:,} beams at a time, not {a.shape[0]:,}")
    if bool(((a < 0) | (a > SPAN)).any()) or bool((ei <= 0).any()):
        raise ValueError(f"load positions must lie on the span (0 to {SPAN:g} m) and ei must be above 0")
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
        for name, t in (("x_mean", x_mean), ("x_std", x_std), ("y_mean", y_mean), ("y_std", y_std)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or not t.is_floating_point() or t.numel() == 0 \
                    or t.numel() > 4096:
                raise TypeError(f"{name} must be a 1-D float tensor of 1 to 4,096 numbers (per input or per "
                                f"gauge), not {_shown(t)}")
        if x_std.shape != x_mean.shape or y_std.shape != y_mean.shape:
            raise ValueError("x_std must match x_mean's shape and y_std y_mean's")
        width, hidden = _whole("width", width, 1, 4096), _whole("hidden", hidden, 1, 4096)
        depth = _whole("depth", depth, 0, 64)
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
        X, Y = beams(N_TRAIN + N_TEST, torch.Generator().manual_seed(_seed(seed)))
        self.X, self.Y = X[:N_TRAIN], Y[:N_TRAIN]
        self.X_test, self.Y_test = X[N_TRAIN:], Y[N_TRAIN:]

    def model(self, init_seed: int = 0) -> BeamNet:
        init_seed = _seed(init_seed, "init_seed")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            return BeamNet(self.X.mean(0), self.X.std(0), self.Y.mean(0), self.Y.std(0))

    def sampler(self, batch_size: int, seed: int):
        batch_size = _whole("batch_size", batch_size, 1, MAX_BATCH)
        gen = torch.Generator().manual_seed(_seed(seed))

        def batch():
            idx = torch.randint(0, N_TRAIN, (batch_size,), generator=gen)
            return (self.X[idx],), self.Y[idx]

        return batch


# --------------------------------------------------------------------------------------------
# One backward pass, as notebook 02 studies it
# --------------------------------------------------------------------------------------------

_AUTOCAST = {None: None, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, eq=False)
class BeamGradients:
    """The gradients of one backward pass: ``params`` by parameter name ("head.weight", ...) and
    ``outputs`` by Linear layer ("head", ...: the gradient of that layer's output, one value per
    example and unit), each a flattened float32 numpy array, in forward order. ``weights`` and
    ``layer_outputs`` are each kind in one array, ``all`` both (the parameters' first)."""

    params: dict
    outputs: dict
    loss: float

    @property
    def weights(self) -> np.ndarray:
        return np.concatenate(list(self.params.values()))

    @property
    def layer_outputs(self) -> np.ndarray:
        return np.concatenate(list(self.outputs.values()))

    @property
    def all(self) -> np.ndarray:
        return np.concatenate([self.weights, self.layer_outputs])


def gradients(seed: int = 0, *, loss_scale=1.0, batch_size: int = 256, autocast=None) -> BeamGradients:
    """One forward and backward pass of the fresh beam model on its first training batch: the
    model, data and batch of ``ampviz.training.live.build_task("beam", seed)`` (data seeded with
    ``seed + 1``, the model's initialisation with ``seed``, batches with ``seed + 2``).

    The backward pass starts from ``mse_loss * loss_scale`` (what a loss scaler does); for a power
    of two, every gradient comes out multiplied by exactly that power of two. ``autocast``: None
    runs everything in float32; "float16" or "bfloat16" runs the forward pass under CPU autocast
    in that dtype (the Linear layers' outputs, and so their gradients, are then in it; the loss is
    float32), as ``torch.amp`` training does. The Linear layers are the ones autocast runs in the
    low precision, so their outputs are the gradients fp16 carries through the backward pass.
    """
    seed = _seed(seed, spare=2)
    loss_scale = _real("loss_scale", loss_scale)
    batch_size = _whole("batch_size", batch_size, 1, MAX_BATCH)
    if not (autocast is None or isinstance(autocast, str)) or autocast not in _AUTOCAST:
        raise ValueError(f"autocast must be None (float32), 'float16' or 'bfloat16', not {_shown(autocast)}")
    data = BeamData(seed + 1)
    model = data.model(seed)
    (x,), y = data.sampler(batch_size, seed + 2)()
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    outputs: dict = {}
    handles = []

    def watch(name):
        def keep(grad):
            outputs[name] = grad.detach().float().reshape(-1).numpy().copy()

        def hook(module, args, output):
            output.register_hook(keep)
        return hook

    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_hook(watch(name)))
    try:
        with torch.autocast("cpu", dtype=_AUTOCAST[autocast], enabled=autocast is not None):
            loss = nn.functional.mse_loss(model(x), y)
        (loss * loss_scale).backward()
    finally:
        for h in handles:
            h.remove()
    params = {name: p.grad.detach().float().reshape(-1).numpy().copy() for name, p in model.named_parameters()}
    return BeamGradients(params, {name: outputs[name] for name in linears}, float(loss.detach()))
