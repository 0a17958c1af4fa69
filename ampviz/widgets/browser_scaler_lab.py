"""BrowserScalerLab: ScalerLab computed in the browser, with no kernel round trip per move.

The page rebuilds the gradient stream (``ampviz.scaling.recipes``: the seed's normal draws, the
scalars of every scenario at every strength position, the few steps shipped as exceptions), runs
your scaler and the frameworks compared (``js/scaling.mjs``, bit for bit with
``ampviz.scaling.simulate``), and draws the figure and the readout ScalerLab draws
(``js/scaleplot.mjs``). A drag repaints at every position. Python holds the settings: each
control's value is synced state, and ``stream``, ``traces``, ``lost``, ``readout_html()`` and
``figure()`` compute, with the package, what the page shows for them.

The same front end runs on a static page with no kernel (``make site``): it needs only the state.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from functools import lru_cache

import numpy as np
import traitlets

from ampviz import scaling
from ampviz._args import _shown
from ampviz.scaling import recipes, synth
from ampviz.plots import plot_scale_trace
from ampviz.widgets.base import _real, _whole
from ampviz.widgets.browser_base import _PageExplorer, b64
from ampviz.widgets.scaler_lab import ScalerLab, lost_share, readout_html

__all__ = ["BrowserScalerLab"]

#: The strength slider's positions (0 to 1 in steps of 0.05), as the page and Python both name them.
STRENGTHS = tuple(round(k * 0.05, 12) for k in range(21))


def _policy_fields(policy) -> dict:
    fields = dataclasses.asdict(policy)
    fields.pop("source")
    return fields


def _key(scenario: str, strength: float) -> str:
    """A recipe's key: the scenario and the strength's float64 bits in hex (the page keys it so)."""
    return f"{scenario}|{struct.pack('>d', float(strength)).hex()}"


def _recipe_entry(scenario: str, strength: float, z: np.ndarray) -> dict:
    rec = recipes.recipe(scenario, strength)
    at, values = recipes.exceptions(rec, z)
    return {"recipe": rec, "steps": at.tolist(), "values": values.astype(np.float64).tolist()}


@lru_cache(maxsize=4)
def _shipped(steps: int, seed: int) -> tuple:
    """(draws as base64, recipes of every scenario at every strength position): the same for every
    lab of these steps and seed, so made once."""
    z = recipes.normals(steps, seed)
    table = {_key(name, s): _recipe_entry(name, s, z) for name in synth.SCENARIOS for s in STRENGTHS}
    return b64(z), table


class BrowserScalerLab(_PageExplorer):
    """ScalerLab's controls, figure and readout, computed by the page (see the module's docstring).

    ``BrowserScalerLab(steps=100_000, scenario="spikes", strength=0.5, seed=0, init_scale=2**16,
    growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, overlay=(), loss_dtype="float32")``
    takes ScalerLab's arguments. Assigning ``lab.strength = 0.3`` (or any setting) moves the
    page's control and redraws there.
    """

    FRONT_END = "scaler_lab_view"

    init_log2 = traitlets.Int(16).tag(sync=True)
    growth_factor = traitlets.Float(2.0).tag(sync=True)
    backoff_factor = traitlets.Float(0.5).tag(sync=True)
    growth_interval = traitlets.Int(2000).tag(sync=True)
    scenario = traitlets.Unicode("spikes").tag(sync=True)
    strength = traitlets.Float(0.5).tag(sync=True)
    loss_dtype = traitlets.Unicode("float32").tag(sync=True)
    overlay = traitlets.List(traitlets.Unicode()).tag(sync=True)

    steps = traitlets.Int(100_000, read_only=True).tag(sync=True)
    seed = traitlets.Int(0, read_only=True).tag(sync=True)
    normals = traitlets.Unicode(read_only=True).tag(sync=True)
    grad_shape = traitlets.Unicode(read_only=True).tag(sync=True)
    recipes = traitlets.Dict(read_only=True).tag(sync=True)
    presets = traitlets.Dict(read_only=True).tag(sync=True)
    torch_policy = traitlets.Dict(read_only=True).tag(sync=True)
    marks = traitlets.Int(ScalerLab.MARKS, read_only=True).tag(sync=True)

    #: The longest stream the page is sent (8 MB of draws).
    MAX_STEPS = 10**6
    GROWTH_RANGE = ScalerLab.GROWTH_RANGE
    BACKOFF_RANGE = ScalerLab.BACKOFF_RANGE
    LOSSES = ScalerLab.LOSSES

    def __init__(self, steps=100_000, *, scenario="spikes", strength=0.5, gradients=None, seed=0,
                 init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 overlay=(), loss_dtype="float32"):
        # ScalerLab's own checks, in its words: the same arguments give the same errors
        steps = _whole("steps", steps, 1)
        if steps > self.MAX_STEPS:
            raise ValueError(f"steps must be at most {self.MAX_STEPS:,} here (the page receives 8 bytes of draws per step); "
                             f"ScalerLab, computed by the kernel, runs longer streams; got {steps:,}")
        seed = _whole("seed", seed, 0)
        log2_init = ScalerLab._log2_init(init_scale)
        super().__init__()
        z64, table = _shipped(steps, seed)
        if gradients is None:  # ScalerLab's sample of gradients, whose underflow the lower panel counts
            rng = np.random.default_rng(seed)
            gradients = np.exp2(-np.abs(rng.normal(0.0, 8.0, 20_000))).astype(np.float32)
        g = np.abs(np.asarray(gradients, dtype=np.float32).ravel())
        shape = g / g.max() if g.size and g.max() > 0 else g
        others = {name: {**_policy_fields(p), "label": f"{name} (legacy)" if name in scaling.LEGACY else name}
                  for name, p in scaling.PRESETS.items() if name != "torch"}
        self.set_trait("steps", steps)
        self.set_trait("seed", seed)
        self.set_trait("normals", z64)
        self.set_trait("grad_shape", b64(shape.astype(np.float32)))
        self.set_trait("recipes", dict(table))
        self.set_trait("presets", others)
        self.set_trait("torch_policy", _policy_fields(scaling.TorchGradScaler()))
        self._z = None
        self._shape = shape.astype(np.float32)
        settings = {"init_log2": log2_init, "growth_factor": _real("growth_factor", growth_factor),
                    "backoff_factor": _real("backoff_factor", backoff_factor),
                    "growth_interval": _whole("growth_interval", growth_interval, 1, 10**7),
                    "scenario": scenario, "strength": _real("strength", strength), "loss_dtype": loss_dtype,
                    "overlay": [overlay] if isinstance(overlay, str) else list(overlay)}
        try:
            for name, value in settings.items():
                setattr(self, name, value)
        except traitlets.TraitError as e:  # the same one line, as the error ScalerLab raises
            raise ValueError(str(e)) from None

    # ----- every setting checked, in ScalerLab's words -----
    @traitlets.validate("init_log2")
    def _valid_init(self, proposal):
        v = proposal["value"]
        if not -10 <= v <= 40:
            raise traitlets.TraitError(f"init_log2 must be a whole number from -10 to 40 (init_scale 2^-10 to 2^40), got {v}")
        return v

    @traitlets.validate("growth_factor")
    def _valid_growth(self, proposal):
        v = proposal["value"]
        if not (math.isfinite(v) and v > 1):
            raise traitlets.TraitError(f"growth_factor must be a finite number above 1 (the scale must be able to grow), "
                                       f"got {_shown(v)}")
        return v

    @traitlets.validate("backoff_factor")
    def _valid_backoff(self, proposal):
        v = proposal["value"]
        if not 0 < v < 1:
            raise traitlets.TraitError(f"backoff_factor must be between 0 and 1 (both excluded), got {_shown(v)}")
        return v

    @traitlets.validate("growth_interval")
    def _valid_interval(self, proposal):
        v = proposal["value"]
        if not 1 <= v <= 10**7:
            raise traitlets.TraitError(f"growth_interval must be a whole number from 1 to 10,000,000, got {v}")
        return v

    @traitlets.validate("scenario")
    def _valid_scenario(self, proposal):
        v = proposal["value"]
        if v not in synth.SCENARIOS:
            raise traitlets.TraitError(f"unknown scenario {_shown(v)}; choose one of {', '.join(synth.SCENARIOS)}")
        self._ship_recipe(v, self.strength)
        return v

    @traitlets.validate("strength")
    def _valid_strength(self, proposal):
        v = proposal["value"]
        if not 0 <= v <= 1:
            raise traitlets.TraitError(f"strength must be between 0 and 1, got {_shown(v)}")
        self._ship_recipe(self.scenario, v)
        return v

    @traitlets.validate("loss_dtype")
    def _valid_loss(self, proposal):
        v = proposal["value"]
        if v not in dict(self.LOSSES).values():
            raise traitlets.TraitError(f"loss_dtype must be 'float32' (the loss autocast computes in fp32) or "
                                       f"'float16' (a loss computed in fp16), got {_shown(v)}")
        return v

    @traitlets.validate("overlay")
    def _valid_overlay(self, proposal):
        v = list(proposal["value"])
        unknown = [n for n in v if n not in scaling.PRESETS or n == "torch"]
        if unknown:
            raise traitlets.TraitError(f"cannot compare with {unknown[0]!r}; choose from "
                                       f"{', '.join(n for n in scaling.PRESETS if n != 'torch')}")
        return v

    def _ship_recipe(self, scenario: str, strength: float) -> None:
        """A strength off the slider's positions (set from Python) gets its recipe shipped too,
        before the setting itself: the page then finds it when the setting arrives."""
        key = _key(scenario, strength)
        if key not in self.recipes:
            if self._z is None:
                self._z = recipes.normals(self.steps, self.seed)
            self.set_trait("recipes", {**self.recipes, key: _recipe_entry(scenario, strength, self._z)})

    # ----- what the page shows, computed by the package -----
    def policy(self) -> "scaling.DynamicScaler":
        """Your settings as torch.amp.GradScaler's rule, as ScalerLab names them."""
        return ScalerLab._policy_of(self.init_log2, self.growth_factor, self.backoff_factor, self.growth_interval)

    @property
    def stream(self) -> np.ndarray:
        """The gradient stream (per-step max |gradient|) of the scenario at the strength."""
        return synth.scenario(self.scenario, self.steps, float(self.strength), np.random.default_rng(self.seed))

    @property
    def traces(self) -> list:
        """``ScalerTrace`` per scaler, yours first, then the frameworks compared."""
        return self._lost_and_traces()[0]

    def _lost_and_traces(self):
        g = self.stream
        traces = [scaling.simulate(p, grad_max=g, loss_dtype=self.loss_dtype)
                  for p in [self.policy()] + [scaling.PRESETS[n] for n in self.overlay]]
        level = float(np.median(g)) if g.size else 1.0  # the stream's typical largest gradient
        return traces, lost_share(traces[0], (self._shape * level).astype(np.float32))

    @property
    def lost(self):
        """(steps, shares) of the gradient sample lost to fp16 underflow at your scale."""
        return self._lost_and_traces()[1]

    def readout_html(self) -> str:
        return readout_html(self.traces, self.marks)

    def figure(self):
        """The figure the page draws, as ScalerLab draws it."""
        traces, lost = self._lost_and_traces()
        loss = "float32" if self.loss_dtype == "float32" else "fp16"
        return plot_scale_trace(traces, lost={"your settings": lost}, legend_counts=False, max_markers=self.marks,
                                title=f"{self.scenario} gradients (strength {self.strength:g}), {self.steps:,} steps, "
                                      f"{loss} loss")
