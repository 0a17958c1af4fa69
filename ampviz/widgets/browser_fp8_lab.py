"""BrowserFp8ScalingLab: Fp8ScalingLab computed in the browser, with no kernel round trip per move.

The page gets each stream seed's tensor stream once (``lab_stream``'s pieces: the sorted |base|,
the magnitude per step, the spike steps' magnitudes at every spike size the slider reaches, and
the steps made inf or NaN), runs the recipe over it (``js/fp8.mjs``, bit for bit with
``ampviz.formats.fp8.simulate_fp8_scaling``), and draws the figure and the readout Fp8ScalingLab
draws (``js/fp8plot.mjs``: ``plot_fp8_scaling`` and the lab's readout). A drag repaints at every
position. Python holds the settings: each control's value is synced state, and ``stream``,
``trace``, ``readout_html()`` and ``figure()`` compute, with the functions Fp8ScalingLab draws with
(``fp8_lab``'s ``acting_settings``, ``simulate_lab``, ``spike_ends``, ``lab_figure``,
``readout_html``), what the page shows for them.

A seed whose stream was not shipped is shipped when the setting reaches Python (a seed typed in
the page, with a kernel, arrives a moment later); the same front end runs on a static page with no
kernel, where the seeds shipped are the ones it has.
"""

from __future__ import annotations

import numpy as np
import traitlets

from ampviz.formats.fp8 import ALGOS
from ampviz.widgets.base import _in_column, _shown, _whole
from ampviz.widgets.browser_base import _Setting, _TemplatedPageExplorer, b64
from ampviz.widgets.fp8_lab import (FORMATS, HISTORY_LENGTHS, NONFINITE, RECIPES, Fp8ScalingLab, acting_settings,
                                    lab_figure, lab_stream, readout_html, simulate_lab, spike_ends)

__all__ = ["BrowserFp8ScalingLab"]

#: The settings, in the order Fp8ScalingLab checks its arguments.
SETTINGS = ("recipe", "fmt", "nonfinite", "algo", "history_len", "margin", "spike_log2", "seed")


def _checked(name: str, value):
    """``value`` for the setting ``name``, checked as Fp8ScalingLab checks its argument (its
    errors, in its words)."""
    options = {"recipe": RECIPES, "fmt": FORMATS, "nonfinite": NONFINITE}
    if name in options:
        allowed = [v for _, v in options[name]]
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {_shown(value)}")
        return value
    if name == "algo":
        if not isinstance(value, str) or value not in ALGOS:
            raise ValueError(f"algo must be one of {', '.join(map(repr, ALGOS))}, got {_shown(value)}")
        return value
    if name == "history_len":
        value = _whole("history_len", value, 1, HISTORY_LENGTHS[-1])
        if value not in HISTORY_LENGTHS:
            raise ValueError(f"history_len must be a power of two from 1 to 1,024, got {value:,}")
        return value
    bounds = {"margin": Fp8ScalingLab.MARGIN_RANGE, "spike_log2": Fp8ScalingLab.SPIKE_RANGE,
              "seed": (0, Fp8ScalingLab.MAX_SEED)}
    return _whole(name, value, *bounds[name])


def shipped_stream(seed: int) -> dict:
    """What the page needs to rebuild ``lab_stream(seed, k, nonfinite)`` for every spike size k and
    non-finite choice: |base| sorted (float32), the magnitude per step at spike size 0 (float32;
    the steps without a spike have it at every size), the spike steps and their magnitudes at each
    size (float32, a row per size), and the steps made inf and NaN. Each from ``lab_stream`` itself."""
    lo, hi = Fp8ScalingLab.SPIKE_RANGE
    steps, size = Fp8ScalingLab.STEPS, Fp8ScalingLab.SIZE
    plain = lab_stream(seed, lo, "none", steps, size)
    at = np.flatnonzero(plain.spike)
    table = np.stack([lab_stream(seed, k, "none", steps, size).magnitude[at] for k in range(lo, hi + 1)])
    return {"sorted_abs": b64(plain.sorted_abs), "magnitude": b64(plain.magnitude),
            "spikes": at.tolist(), "spike_magnitudes": b64(table.astype(np.float32)),
            "inf_steps": np.flatnonzero(lab_stream(seed, lo, "inf", steps, size).nonfinite).tolist(),
            "nan_steps": np.flatnonzero(lab_stream(seed, lo, "nan", steps, size).nonfinite).tolist()}


class BrowserFp8ScalingLab(_TemplatedPageExplorer):
    """Fp8ScalingLab's controls, figure and readout, computed by the page (see the module's docstring).

    ``BrowserFp8ScalingLab(recipe="delayed", *, history_len=1024, algo="max", margin=0,
    fmt="fp8_e4m3", spike_log2=8, nonfinite="none", seed=0)`` takes Fp8ScalingLab's arguments (and
    raises its errors). Assigning ``lab.margin = 2`` (or any setting) moves the page's control and
    redraws there; a value Fp8ScalingLab would refuse is refused in its words.
    """

    FRONT_END = "fp8_lab_view"

    recipe = _Setting("delayed").tag(sync=True)
    history_len = _Setting(1024).tag(sync=True)
    algo = _Setting("max").tag(sync=True)
    margin = _Setting(0).tag(sync=True)
    fmt = _Setting("fp8_e4m3").tag(sync=True)
    spike_log2 = _Setting(8).tag(sync=True)
    nonfinite = _Setting("none").tag(sync=True)
    seed = _Setting(0).tag(sync=True)

    #: Each shipped seed's stream (``shipped_stream``), by the seed written in decimal.
    streams = traitlets.Dict(read_only=True).tag(sync=True)
    #: The controls' choices and ranges, and the stream's shape, as Fp8ScalingLab has them.
    options = traitlets.Dict(read_only=True).tag(sync=True)

    RECIPES, FORMATS, NONFINITE = RECIPES, FORMATS, NONFINITE
    HISTORY_LENGTHS = HISTORY_LENGTHS
    MARGIN_RANGE, SPIKE_RANGE, MAX_SEED = Fp8ScalingLab.MARGIN_RANGE, Fp8ScalingLab.SPIKE_RANGE, Fp8ScalingLab.MAX_SEED
    #: The seeds shipped with every lab (beside the one asked for): a page with no kernel offers these.
    SHIPPED_SEEDS = (0, 1, 2, 3)

    def __init__(self, recipe="delayed", *, history_len=1024, algo="max", margin=0, fmt="fp8_e4m3", spike_log2=8,
                 nonfinite="none", seed=0):
        given = {"recipe": recipe, "history_len": history_len, "algo": algo, "margin": margin, "fmt": fmt,
                 "spike_log2": spike_log2, "nonfinite": nonfinite, "seed": seed}
        # Fp8ScalingLab's own checks, in its order and words: the same arguments give the same errors
        checked = {name: _checked(name, given[name]) for name in SETTINGS}
        super().__init__()
        with self.hold_trait_notifications():
            self.set_trait("streams", {str(s): shipped_stream(s) for s in dict.fromkeys((*self.SHIPPED_SEEDS, checked["seed"]))})
            self.set_trait("options", {
                "recipes": [list(o) for o in RECIPES], "formats": [list(o) for o in FORMATS],
                "nonfinite": [list(o) for o in NONFINITE], "algos": list(ALGOS),
                "history_lengths": list(HISTORY_LENGTHS), "margin_range": list(self.MARGIN_RANGE),
                "spike_range": list(self.SPIKE_RANGE), "max_seed": self.MAX_SEED,
                "steps": Fp8ScalingLab.STEPS, "size": Fp8ScalingLab.SIZE})
            self._set_figure_style()  # plot_fp8_scaling names no template: plotly's default, as _figure fills it in
            for name in SETTINGS:
                setattr(self, name, checked[name])

    # ----- every setting checked, in Fp8ScalingLab's words -----
    @traitlets.validate(*SETTINGS)
    def _valid_setting(self, proposal):
        name = proposal["trait"].name
        try:
            value = _checked(name, proposal["value"])
        except (TypeError, ValueError) as e:  # the same one line, as the error Fp8ScalingLab raises
            raise traitlets.TraitError(str(e)) from None
        if name == "seed" and str(value) not in self.streams:
            # shipped before the setting itself: the page then finds the stream when the seed arrives
            self.set_trait("streams", {**self.streams, str(value): shipped_stream(value)})
        return value

    # ----- what the page shows, computed by fp8_lab's functions -----
    def settings(self) -> dict:
        """The settings as ``simulate_fp8_scaling``'s and ``lab_stream``'s arguments (as
        ``Fp8ScalingLab.settings()``: history, algo and margin left out for current scaling)."""
        return acting_settings(**{name: getattr(self, name) for name in SETTINGS})

    def _at(self) -> tuple:
        """(stream, trace, readout, figure) at the settings, as Fp8ScalingLab draws them (kept for reuse)."""
        s = self.settings()
        return self._kept(("drawn", tuple(sorted(s.items()))), lambda: self._drawn(s))

    def _drawn(self, s: dict) -> tuple:
        steps, size = Fp8ScalingLab.STEPS, Fp8ScalingLab.SIZE
        stream, trace = simulate_lab(s, steps, size)
        ends = self._kept(("ends", tuple(sorted((k, v) for k, v in s.items() if k != "spike_log2"))),
                          lambda: spike_ends(s, *self.SPIKE_RANGE, steps, size))
        return stream, trace, _in_column(readout_html(trace)), lab_figure(trace, hold=ends)

    @property
    def stream(self):
        """The ``TensorStream`` at the settings (``lab_stream``)."""
        s = self.settings()
        return lab_stream(s["seed"], s["spike_log2"], s["nonfinite"], Fp8ScalingLab.STEPS, Fp8ScalingLab.SIZE)

    @property
    def trace(self):
        """The ``Fp8ScalingTrace`` at the settings, as Fp8ScalingLab simulates it."""
        return self.simulate()[1]

    def simulate(self) -> tuple:
        """(stream, trace) at the settings, in one run (as Fp8ScalingLab.simulate)."""
        return simulate_lab(self.settings(), Fp8ScalingLab.STEPS, Fp8ScalingLab.SIZE)

    def readout_html(self) -> str:
        """The readout, as Fp8ScalingLab writes it."""
        return self._at()[2]

    def figure(self):
        """The figure the page draws, as Fp8ScalingLab draws it."""
        return self._at()[3]
