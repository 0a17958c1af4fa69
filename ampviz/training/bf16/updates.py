"""Updates lost in bf16 weights, and three fixes, measured on one run.

``lost_update_runs``: plain gradient descent on a seeded linear regression with the weights kept in
five ways on the same data (``METHODS``: fp32, bf16, bf16 with fp32 master weights, with a Kahan
buffer (``kahan``), with stochastic rounding (``rounding``)); per step the loss, the share
of updates a bf16 weight loses and the share after which the run's state did not change
(``UpdateRun``, ``LostUpdateRuns``); ``lost_update_table`` and ``lost_update_steps_table`` print them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ampviz.text import Table, measured, number
from ampviz._args import _shown
from ampviz._args import _real, _seed, _whole
from ampviz.training.bf16.arguments import _MAKER, _stats
from ampviz.training.bf16.kahan import kahan_add_
from ampviz.training.bf16.rounding import stochastic_round_bf16

# --------------------------------------------------------------------------------------------
# 3. Lost updates in bf16 weights, and three fixes
# --------------------------------------------------------------------------------------------

#: How the runs of ``lost_update_runs`` keep the weights: key -> label.
METHODS = {
    "fp32": "fp32 weights",
    "bf16": "bf16 weights",
    "master": "bf16 + fp32 master weights",
    "kahan": "bf16 + Kahan compensation",
    "stochastic": "bf16 + stochastic rounding",
}

MAX_STEPS = 5000
MAX_FEATURES = 256
MAX_ROWS = 4096
MAX_TRACE = 250_000  # steps x features kept per run
MAX_RUN_WORK = 5 * 10**8  # steps x samples x features


@dataclass(frozen=True, eq=False)
class UpdateRun:
    """One way of keeping the weights (``method``, a key of ``METHODS``), step by step.

    ``weights``: (steps + 1, features) the weights the forward pass used before each step and
    after the last (bf16 values, or fp32 for the "fp32" run), as float64; ``updates``: (steps,
    features) each step's update -lr · gradient (float32); ``loss``: (steps + 1,) the loss at
    ``weights``; ``lost``: (steps,) the share of the step's nonzero updates that a bf16 weight
    rounding to nearest loses, ``(w.float() + u).to(bfloat16) == w`` with w the step's weights in
    bf16 (the ½-ulp rule); ``unchanged``: the share of nonzero updates after which the run's
    stored state was bit for bit what it was before the step (the weights, and the master copy or
    the compensation buffer where the run keeps one). For the bf16 run the two are the same; the
    fixes keep what the weight alone would lose (for stochastic rounding a step that leaves a
    weight unchanged drew "down", and the draws that go up make up for it on average).
    """

    method: str
    weights: np.ndarray
    updates: np.ndarray
    loss: np.ndarray
    lost: np.ndarray
    unchanged: np.ndarray

    @property
    def label(self) -> str:
        return METHODS[self.method]

    @property
    def final_loss(self) -> float:
        return float(self.loss[-1])

    @property
    def final_weights(self) -> np.ndarray:
        return self.weights[-1]


@dataclass(frozen=True, eq=False)
class LostUpdateRuns:
    """``lost_update_runs``'s five runs (``runs``: method key -> ``UpdateRun``) on one problem:
    ``target`` (the weights that generated the data, the optimum), the settings, and
    ``floor_loss``: the loss at the fp32 run's final weights rounded to bf16 (the best any bf16
    weights come to near there)."""

    seed: int
    steps: int
    lr: float
    features: int
    samples: int
    target: np.ndarray
    runs: dict
    floor_loss: float
    floor_distance: float

    def distance(self, method: str) -> float:
        """‖w - w_fp32‖ / ‖w_fp32‖ for the final weights of ``method``'s run and of the fp32 run."""
        if method not in self.runs:
            raise ValueError(f"method must be one of {', '.join(map(repr, self.runs))}, not {_shown(method)}")
        return _relative_distance(self.runs[method].final_weights, self.runs["fp32"].final_weights)

    @property
    def stalled_at(self) -> int | None:
        """The step from which the bf16 run lost every update to the end (None if it never did)."""
        lost = self.runs["bf16"].unchanged
        if lost.size == 0 or lost[-1] < 1:
            return None
        moving = np.flatnonzero(lost < 1)
        return int(moving[-1] + 1) if moving.size else 0


def _relative_distance(w: np.ndarray, ref: np.ndarray) -> float:
    """‖w - ref‖ / ‖ref‖ (‖w - ref‖ where ref is 0); NaN or inf once a run has diverged."""
    with np.errstate(all="ignore"):  # a diverged run's inf - inf is NaN, quietly
        norm = float(np.linalg.norm(ref))
        d = float(np.linalg.norm(w - ref))
        return d / norm if norm else d


def _run_sizes(steps, lr, features, samples):
    steps = _whole("steps", steps, 0, MAX_STEPS)
    lr = _real("lr", lr)
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number such as 0.05, not {_shown(lr)}")
    features = _whole("features", features, 1, MAX_FEATURES)
    samples = _whole("samples", samples, 1, MAX_ROWS)
    if steps * features > MAX_TRACE:
        raise ValueError(f"steps={steps:,} x features={features} is {steps * features:,} weights to keep per run; "
                         f"at most {MAX_TRACE:,}")
    if steps * features * samples > MAX_RUN_WORK:
        raise ValueError(f"steps x samples x features is {steps * features * samples:,}; at most {MAX_RUN_WORK:,}")
    return steps, lr, features, samples


def _problem(seed: int, features: int, samples: int):
    """(X, y, target): standard normal inputs (samples, features), targets y = X @ target, and
    target weights of magnitude 0.5 to 2 with random signs, all float64 from one generator."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(samples, features, generator=gen, dtype=torch.float64)
    size = 0.5 + 1.5 * torch.rand(features, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(features, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
    target = size * sign
    return X, X @ target, target


def _share(mask: torch.Tensor, moving: torch.Tensor) -> float:
    n = int(moving.sum())
    return float((mask & moving).sum()) / n if n else 0.0


def _one_run(method: str, X, y, lr: float, steps: int, seed: int) -> UpdateRun:
    n, d = X.shape
    gen = torch.Generator().manual_seed(seed)
    w32 = torch.zeros(d)  # the fp32 weights, or the master copy
    w = torch.zeros(d, dtype=torch.bfloat16)
    comp = torch.zeros(d, dtype=torch.bfloat16)
    weights = np.empty((steps + 1, d))
    updates = np.empty((steps, d), dtype=np.float32)
    loss = np.empty(steps + 1)
    lost = np.empty(steps)
    unchanged = np.empty(steps)

    def forward_weights():
        return w32 if method == "fp32" else w

    for k in range(steps + 1):
        fw = forward_weights()
        residual = X @ fw.double() - y
        loss[k] = 0.5 * float((residual * residual).mean())
        weights[k] = fw.double().numpy()
        if k == steps:
            break
        u = (X.T @ residual / n).float() * -lr  # the gradient, rounded once to fp32, times -lr in fp32
        updates[k] = u.numpy()
        moving = u != 0
        as_bf16 = fw.to(torch.bfloat16)
        lost[k] = _share((as_bf16.float() + u).to(torch.bfloat16) == as_bf16, moving)
        state = (w32.clone(), w.clone(), comp.clone())
        if method == "fp32":
            w32.add_(u)
        elif method == "bf16":
            w.add_(u)  # torch adds in fp32 and rounds the sum to nearest into bf16
        elif method == "master":
            w32.add_(u)
            w = w32.to(torch.bfloat16)
        elif method == "kahan":
            kahan_add_(w, comp, u)
        else:
            w = stochastic_round_bf16(w.float() + u, gen)
        same = ((w32.view(torch.int32) == state[0].view(torch.int32))
                & (w.view(torch.int16) == state[1].view(torch.int16))
                & (comp.view(torch.int16) == state[2].view(torch.int16)))
        unchanged[k] = _share(same, moving)
    return UpdateRun(method, weights, updates, loss, lost, unchanged)


def lost_update_runs(seed: int = 0, *, steps: int = 400, lr=0.05, features: int = 16, samples: int = 256,
                     methods=tuple(METHODS)) -> LostUpdateRuns:
    """Gradient descent on one seeded linear regression, the weights kept in each of ``methods``.

    The problem: ``samples`` standard normal inputs of ``features`` values, targets ``X @ target``
    with target weights of magnitude 0.5 to 2 (random signs), loss ½ · mean squared error, weights
    starting at 0 (data from a generator seeded with ``seed``). Each step computes the gradient at
    the weights the forward pass uses (in float64, rounded once to float32), and adds the update
    u = -lr · gradient (float32) to the weights as the method says:

    * "fp32": ``w.add_(u)`` on fp32 weights (the reference);
    * "bf16": ``w.add_(u)`` on bf16 weights: torch adds in fp32 and rounds into bf16, so an update
      within half a bf16 step of the weight (2^-9 to 2^-8 of it) is lost;
    * "master": fp32 master weights take the update, the forward pass uses their bf16 copy;
    * "kahan": bf16 weights and a bf16 compensation buffer (``kahan_add_``);
    * "stochastic": ``w = stochastic_round_bf16(w.float() + u, generator)`` with a generator
      seeded with ``seed + 1``.

    With the defaults the fp32 run converges (the loss falls from about 18 to about 1e-11); the
    bf16 run stops moving once every update is lost, far from the optimum; the three fixes come
    near the best bf16 weights can do there. ``methods`` must include "fp32" and "bf16" (the
    reference and the run the fixes are compared with).
    """
    seed = _seed(seed, spare=1)
    steps, lr, features, samples = _run_sizes(steps, lr, features, samples)
    if isinstance(methods, str) or not isinstance(methods, (list, tuple)) \
            or not all(isinstance(m, str) and m in METHODS for m in methods) \
            or not {"fp32", "bf16"} <= set(methods):
        raise ValueError(f"methods must be a list of keys of METHODS ({', '.join(map(repr, METHODS))}) that "
                         f"includes 'fp32' and 'bf16', not {_shown(methods)}")
    X, y, target = _problem(seed, features, samples)
    runs = {m: _one_run(m, X, y, lr, steps, seed + 1) for m in METHODS if m in methods}
    ref = torch.from_numpy(runs["fp32"].final_weights).to(torch.bfloat16).double()
    residual = X @ ref - y
    floor = 0.5 * float((residual * residual).mean())
    return LostUpdateRuns(seed, steps, lr, features, samples, target.numpy(), runs, floor,
                          _relative_distance(ref.numpy(), runs["fp32"].final_weights))


def lost_update_table(result) -> Table:
    """One row per run of a ``LostUpdateRuns``: final loss, distance of the final weights to the
    fp32 run's, the share of all the run's nonzero updates that a bf16 weight rounding to nearest
    would lose (below ½ ulp) and the share after which the run's state did not change (over all
    steps, and at the last step); then the floor row (the fp32 run's final weights rounded to bf16)."""
    result = _stats("result", result, LostUpdateRuns)
    rows = []
    pct = lambda a: f"{100 * float(a):.1f}%"  # noqa: E731
    mean = lambda a: pct(a.mean()) if a.size else "-"  # noqa: E731
    last = lambda a: pct(a[-1]) if a.size else "-"  # noqa: E731
    for key, run in result.runs.items():
        rows.append((run.label, measured(run.final_loss, 3), measured(result.distance(key), 3),
                     mean(run.lost), mean(run.unchanged), last(run.unchanged)))
    rows.append(("fp32 run's weights rounded to bf16", measured(result.floor_loss, 3),
                 measured(result.floor_distance, 3), "", "", ""))
    stalled = result.stalled_at
    return Table(("weights", "final loss", "distance to fp32", "updates below ½ ulp", "state unchanged",
                  "state unchanged (last step)"), rows,
                 title=f"{result.steps:,} steps, lr {number(result.lr)}, {result.features} weights; bf16 stalled "
                       + (f"from step {stalled:,}" if stalled is not None else "never"))


def lost_update_steps_table(result, steps=None) -> Table:
    """The loss of each run of a ``LostUpdateRuns`` at a few ``steps`` (default: 0, 25, 50, the step
    from which the bf16 run stalled, 100, 200 and the last), to three digits: the bf16 run stops
    where every update is lost, the fp32 run and the three fixes go on."""
    result = _stats("result", result, LostUpdateRuns)
    if steps is None:
        steps = sorted({0, 25, 50, 100, 200, result.steps} | ({result.stalled_at} if result.stalled_at else set()))
        steps = [k for k in steps if k <= result.steps]
    elif isinstance(steps, (str, bytes)) or not isinstance(steps, (list, tuple, range)) or not steps:
        raise TypeError(f"steps must be a list of whole numbers from 0 to {result.steps}, not {_shown(steps)}")
    steps = [_whole("steps", k, 0, result.steps) for k in steps]
    stalled = result.stalled_at
    rows = [(run.label, *(measured(run.loss[k], 3) for k in steps)) for run in result.runs.values()]
    return Table(("weights", *(f"step {k:,}" + (" (stall)" if k == stalled else "") for k in steps)), rows,
                 title=f"loss (½ · mean squared error) by step, lr {number(result.lr)}")


_MAKER.update({LostUpdateRuns: "lost_update_runs"})
