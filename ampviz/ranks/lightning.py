"""Lightning on CPU ranks: ``run_lightning_ranks`` fits a small MLP with
``lightning.Trainer(accelerator="cpu")`` and DDP on the ranks ``run_ranks`` forks (Lightning joins
their gloo group, as under torchrun), with ``precision="16-mixed"`` or the explicit fp16 plugin, and
returns a ``LightningRun``. ``lightning`` is imported only inside the functions.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ampviz._args import _real, _shown, _whole
from ampviz.ranks.launcher import _free_port, _one_line, prewarm, run_ranks
from ampviz.ranks.real import _SPIKE, MLP_MAX_SCALE, _batch
from ampviz.ranks.simulator import _rank_flags
from ampviz.text import number

@dataclass(frozen=True, eq=False)
class LightningRun:
    """A real ``lightning.Trainer(accelerator="cpu", devices=world_size)`` fit with DDP, one forked
    rank per row: ``precision`` (the precision plugin's, as Lightning resolved it),
    ``scaler`` (the plugin holds a GradScaler), ``out_dtype`` (the model's output dtype in
    ``training_step``), ``warnings`` (what constructing the Trainer warned, rank 0), and per rank and
    batch: ``scale`` (after the batch; NaN without a scaler), ``stepped`` (the optimizer's step
    ran: SGD moved the weights), ``global_step`` (``trainer.global_step`` after the batch), ``weights_finite``;
    ``weights_identical``: per batch, every rank's weights bitwise identical (both also before the
    first batch: shape (world_size, steps + 1) and (steps + 1,))."""

    precision: str
    scaler: bool
    out_dtype: str
    warnings: tuple
    scale: np.ndarray
    stepped: np.ndarray
    global_step: np.ndarray
    weights_finite: np.ndarray
    weights_identical: np.ndarray

    def __repr__(self) -> str:
        scale = ", ".join(number(s) for s in self.scale[0]) if self.scaler else "none"
        return (f"LightningRun(plugin precision {self.precision!r}, GradScaler: {self.scaler}, output dtype "
                f"{self.out_dtype}; optimizer steps {self.stepped.sum(axis=1).tolist()} per rank, global_step "
                f"{self.global_step[0, -1]}; scale after each batch: {scale}; weights finite on every rank: "
                f"{bool(self.weights_finite.all())}; identical across ranks: {bool(self.weights_identical.all())})")


def _lightning_rank(rank, world_size, port, precision, init_scale, flags, seed):
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.strategies import DDPStrategy

    class JoinedDDP(DDPStrategy):
        """DDP in processes started by someone else (here ``run_ranks``; torchrun and SLURM do the
        same): no launcher, so Lightning neither starts processes nor refuses to run in a notebook
        kernel, and it joins the gloo group that is already up."""

        def _configure_launcher(self) -> None:
            self._launcher = None

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), NODE_RANK="0")  # the gloo group is already up: Lightning joins it
    steps = flags.shape[1]
    record = {"scale": [], "stepped": [], "global_step": [], "weights": [], "dtype": None}

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def _weights(self):
            return torch.cat([p.detach().reshape(-1) for p in self.parameters()]).numpy().copy()

        def on_train_start(self):
            record["weights"].append(self._weights())

        def training_step(self, batch, i):
            x, y = batch
            if flags[rank, i]:
                x = x * _SPIKE
            out = self.net(x)
            record["dtype"] = str(out.dtype).replace("torch.", "")
            return torch.nn.functional.mse_loss(out.float(), y)

        def on_train_batch_end(self, outputs, batch, i):
            sc = self.trainer.precision_plugin.scaler if hasattr(self.trainer.precision_plugin, "scaler") else None
            record["scale"].append(math.nan if sc is None else float(sc.get_scale()))
            record["global_step"].append(int(self.trainer.global_step))
            record["weights"].append(self._weights())
            before, after = record["weights"][-2:]  # SGD moved the weights: its step ran
            record["stepped"].append(not np.array_equal(before.view(np.uint32), after.view(np.uint32)))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    batches = [_batch(seed, rank, t) for t in range(steps)]
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.cat([b[0] for b in batches]),
                                                                      torch.cat([b[1] for b in batches])),
                                       batch_size=16)
    kwargs = {"precision": precision} if init_scale is None else \
        {"plugins": [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=init_scale))]}
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning")]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as root:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = L.Trainer(accelerator="cpu", devices=world_size, strategy=JoinedDDP(), max_steps=steps,
                                use_distributed_sampler=False, enable_progress_bar=False,
                                enable_model_summary=False, logger=False, enable_checkpointing=False,
                                default_root_dir=root, **kwargs)
        said = tuple(_one_line(w.message) for w in caught if "precision" in str(w.message))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Net(), data)
    plugin = trainer.precision_plugin
    return {"precision": str(getattr(plugin, "precision", type(plugin).__name__)),
            "scaler": getattr(plugin, "scaler", None) is not None, "dtype": record["dtype"], "warnings": said,
            "scale": record["scale"], "stepped": record["stepped"], "global_step": record["global_step"],
            "weights": np.stack(record["weights"])}


def run_lightning_ranks(precision="16-mixed", *, found_inf=("x...", "...."), init_scale=None, seed=0,
                        timeout=60.0) -> LightningRun:
    """Fit a small MLP (8-16-1, SGD) with ``lightning.Trainer(accelerator="cpu", devices=world_size,
    precision=precision)`` on forked gloo ranks, one per row of ``found_inf`` (patterns as in
    ``run_scaler_ranks``: ``x`` blows up that rank's batch so an fp16 forward overflows), one batch
    per step. Its ``DDPStrategy`` joins the ranks ``run_ranks`` started, as under torchrun: no
    Lightning launcher, so it runs in a notebook kernel too. ``init_scale``: instead of ``precision``, pass
    ``plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale))]``,
    the explicit fp16 plugin. Needs ``lightning``. Returns a ``LightningRun``."""
    flags = _rank_flags(found_inf)
    if not 1 <= flags.shape[0] <= 4 or not 1 <= flags.shape[1] <= 20:
        raise ValueError(f"give 1 to 4 ranks (rows) and 1 to 20 steps, not shape {flags.shape}")
    if init_scale is not None:
        init_scale = _real("init_scale", init_scale)
        if not (0 < init_scale <= MLP_MAX_SCALE):
            raise ValueError(f"init_scale must be above 0 and at most 2^14, not {_shown(init_scale)}")
    seed = _whole("seed", seed, 0, 2**31)
    prewarm()
    import lightning  # noqa: F401 - once here, not in every rank

    out = run_ranks(_lightning_rank, flags.shape[0], _free_port(), precision, init_scale, flags, seed,
                    timeout=timeout)
    weights = np.stack([o["weights"] for o in out])
    bits = weights.view(np.uint32)
    return LightningRun(out[0]["precision"], out[0]["scaler"], out[0]["dtype"], out[0]["warnings"],
                        np.array([o["scale"] for o in out]), np.array([o["stepped"] for o in out]),
                        np.array([o["global_step"] for o in out]), np.isfinite(weights).all(axis=2),
                        (bits == bits[:1]).all(axis=(0, 2)))
