"""A short run of the beam model in each mode, as notebook 00 opens the course with it: the losses
of ``run_training`` (no census), on one torch thread, and a verdict per mode."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _seed, _shown, _whole
from ampviz.training.live import TrainConfig, run_training

#: The modes ``short_runs`` trains.
SHORT_MODES = ("fp32", "fp16", "fp16+scaler", "bf16")


@dataclass(frozen=True, eq=False)
class ShortRuns:
    """The training losses (m^2, one per step, float64 numpy) of ``short_runs``, by mode.
    ``start(m)`` is the first step's loss, ``end(m)`` the mean of the last 10 steps', and
    ``verdict(m)`` "learns" where the end is below half the start, else "stalls"."""

    losses: dict

    def start(self, mode: str) -> float:
        return float(self.losses[mode][0])

    def end(self, mode: str) -> float:
        return float(np.mean(self.losses[mode][-10:]))

    def verdict(self, mode: str) -> str:
        return "learns" if self.end(mode) < 0.5 * self.start(mode) else "stalls"


def short_runs(steps: int = 100, seed: int = 0, modes=SHORT_MODES) -> ShortRuns:
    """Train the fresh beam model for ``steps`` steps in each of ``modes``: ``run_training(TrainConfig(
    model="beam", mode=m, steps=steps, seed=seed, census_every=0))``, its losses kept. It runs on one
    thread (torch's thread count is restored after): for matrices this small, more threads cost more
    than they save. About a second per 100 steps and mode."""
    steps = _whole("steps", steps, 1, 10**5)
    seed = _seed(seed, spare=2)
    if isinstance(modes, str) or not isinstance(modes, (tuple, list)) or not modes \
            or not all(isinstance(m, str) and m in SHORT_MODES for m in modes):
        raise ValueError(f"modes must be a non-empty tuple of {', '.join(SHORT_MODES)}, not {_shown(modes)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return ShortRuns({m: run_training(TrainConfig(model="beam", mode=m, steps=steps, seed=seed,
                                                      census_every=0))["loss"] for m in modes})
    finally:
        torch.set_num_threads(threads)
