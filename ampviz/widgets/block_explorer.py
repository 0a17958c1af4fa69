"""BlockExplorer: MX and NVFP4 block scaling of one row of values, and what one outlier costs.

What it shows at a set of settings is computed by this module's functions, over plain settings
(a dict, as ``acting_settings`` makes it): ``make_row``, ``quantize_row``, ``outlier_ends``,
``blocks_figure`` and ``readout_html``. BlockExplorer and ``BrowserBlockExplorer`` both call them."""

from __future__ import annotations

import html
from collections import OrderedDict

import numpy as np

import ipywidgets as W

from ampviz.formats.blocks import MX_ROUNDING, mx_quantize, nvfp4_quantize, random_hadamard_transform
from ampviz.widgets.figureview import FigureView
from ampviz.plots import format_number, format_pow2, format_share, plot_blocks

from ampviz.widgets.base import _Explorer, _beside, _in_column, _shown, _table, _whole

#: The explorer; the module's functions compute what it shows for it and its page twin
#: (``BrowserBlockExplorer``), not an API of their own.
__all__ = ["BlockExplorer"]

#: The schemes: (what the learner reads, the value): MX with an element format, or NVFP4.
SCHEMES = (("MXFP8 (fp8_e4m3)", "fp8_e4m3"), ("MXFP8 (fp8_e5m2)", "fp8_e5m2"), ("MXFP6 (fp6_e3m2)", "fp6_e3m2"),
           ("MXFP6 (fp6_e2m3)", "fp6_e2m3"), ("MXFP4 (fp4_e2m1)", "fp4_e2m1"),
           ("NVFP4 (fp4_e2m1, E4M3 scales)", "nvfp4"))
#: The data: (what the learner reads, the value).
DATA = (("normal, one outlier of 2^k", "normal"), ("log-normal (σ = 2), random signs", "lognormal"))


def make_row(data: str, n: int, seed: int, log2_outlier: int, outlier_at: int) -> np.ndarray:
    """The explorer's row of ``n`` float32 values, from ``np.random.default_rng(seed)``: ``"normal"``
    (N(0, 1) with the value at ``outlier_at`` replaced by 2**log2_outlier) or ``"lognormal"``
    (exp(N(0, 2²)) with random signs; no outlier is placed)."""
    rng = np.random.default_rng(seed)
    if data == "normal":
        x = rng.standard_normal(n)
        x[outlier_at] = 2.0 ** log2_outlier
    elif data == "lognormal":
        x = rng.lognormal(0.0, 2.0, n) * rng.choice([-1.0, 1.0], n)
    else:
        raise ValueError(f"data must be one of {', '.join(repr(d) for _, d in DATA)}, got {_shown(data)}")
    return x.astype(np.float32)


def _relative_error(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """|q - x| / |x| per element, over the nonzero x (float64)."""
    nz = x != 0
    return np.abs(q[nz].astype(np.float64) - x[nz]) / np.abs(x[nz].astype(np.float64))


# ----- what the explorer shows, over plain settings -----
def acting_settings(*, scheme: str, block: int, rounding: str, pts: bool, data: str, log2_outlier: int,
                    seed: int, hadamard: bool) -> dict:
    """The settings (``block``: the MX block size, ``pts``: NVFP4's per-tensor scale) with what
    does not act made plain, so that the same drawing has the same settings: NVFP4's blocks are
    16 and take no scale rounding, MX takes no per-tensor scale (None), and the log-normal data
    place no outlier (None)."""
    values = {"scheme": scheme, "block": block, "rounding": rounding, "pts": pts, "data": data,
              "log2_outlier": log2_outlier, "seed": seed, "hadamard": hadamard}
    if scheme == "nvfp4":
        values["block"], values["rounding"] = 16, None
    else:
        values["pts"] = None
    if data != "normal":
        values["log2_outlier"] = None
    return values


def quantize_row(s: dict, n: int, outlier_at: int) -> tuple:
    """(row before any transform, row quantized, result) at the settings ``s``
    (``acting_settings``'), for a row of ``n`` values with the outlier at ``outlier_at``,
    computed by ``ampviz.formats.blocks``."""
    data = make_row(s["data"], n, s["seed"], s["log2_outlier"] or 0, outlier_at)
    x = random_hadamard_transform(data) if s["hadamard"] else data
    if s["scheme"] == "nvfp4":
        result = nvfp4_quantize(x, per_tensor_scale=s["pts"])
    else:
        result = mx_quantize(x, s["scheme"], block_size=s["block"], rounding=s["rounding"])
    return data, x, result


def outlier_ends(s: dict, n: int, outlier_at: int, log2_lo: int, log2_hi: int) -> tuple:
    """The (row quantized, result) pairs with the outlier at ``2**log2_lo`` and ``2**log2_hi``
    (the outlier slider's ends) and the other settings ``s``; none when the data place no
    outlier. The figure's value axis holds them too, so that the outlier grows against a still
    axis."""
    if s["log2_outlier"] is None:
        return ()
    return tuple(quantize_row({**s, "log2_outlier": v}, n, outlier_at)[1:] for v in (log2_lo, log2_hi))


def blocks_figure(x, result, s: dict, hold=()):
    """The figure of the row ``x`` quantized (``result``) at the settings ``s``, its title naming
    them, its value axis holding ``hold`` (``outlier_ends``)."""
    what = dict((v, k) for k, v in SCHEMES)[s["scheme"]]
    title = f"{what}: blocks of {s['block']}"
    title += (f", scale rounding {s['rounding']}" if s["scheme"] != "nvfp4" else
              f", per-tensor scale {format_number(result.tensor_scale)}" if result.tensor_scale is not None
              else ", no per-tensor scale")
    if s["hadamard"]:
        title += ", after the Hadamard transform"
    return plot_blocks(x, result, title=title, legend_counts=False, hold=hold)


def readout_html(data, x, result, fig, hadamard: bool) -> str:
    """The readout: the mean and largest relative error, the shares saturated and flushed to zero,
    each block's scale and worst relative error (read from the figure's ``meta``), and with the
    transform (``hadamard``) the errors after undoing it, against the row ``data``."""
    q = np.asarray(result.values)
    err = _relative_error(x, q)
    meta = fig.layout.meta
    n = x.size
    line = (f"mean relative error {format_share(err.mean()) if err.size else '0%'} · "
            f"max {format_share(err.max()) if err.size else '0%'} · "
            f"saturated {format_share(meta['saturated'] / n)} ({meta['saturated']:,}) · "
            f"flushed to zero {format_share(meta['flushed'] / n)} ({meta['flushed']:,}) of {n:,} values")
    extra = ""
    if hadamard:
        back = random_hadamard_transform(q, inverse=True)
        e = _relative_error(data, back)
        extra = html.escape(f"After undoing the transform: mean relative error "
                            f"{format_share(e.mean()) if e.size else '0%'} · "
                            f"max {format_share(e.max()) if e.size else '0%'}")
        extra = f"<div>{extra}</div>"
    worst = [html.escape(format_share(w) if w is not None else "nan") for w in meta["block_worst"]]
    if meta["scheme"] == "nvfp4":
        # the figure writes each block's E4M3 scale above it; its elements take that × the
        # tensor scale: both columns, named as the figure names them
        ts = meta["tensor_scale"]
        note = ("NVFP4: above each block the figure writes its E4M3 scale; "
                + (f"its values are multiplied by that × the per-tensor scale {format_number(ts)}."
                   if ts is not None else "with no per-tensor scale, that is the scale its values take."))
        extra += f"<div>{html.escape(note)}</div>"
        scale_head = "scale = E4M3 scale × tensor scale" if ts is not None else "scale"
        times = "" if ts is None else f"{format_number(ts)} = "

        def product(label, s):
            return f"{label} × {times}{format_number(s)}" if ts is not None and s is not None else \
                (format_number(s) if s is not None else "nan")
        rows = ((b, html.escape(label), html.escape(product(label, s)), w)
                for b, (label, s, w) in enumerate(zip(meta["scale_labels"], meta["scales"], worst)))
        table = _table(("block", "E4M3 scale (above the block)", scale_head, "worst relative error"), rows)
    else:
        table = _table(("block", "scale (E8M0, above the block)", "worst relative error"),
                       ((b, html.escape(format_pow2(s) if s is not None else "nan"), w)
                        for b, (s, w) in enumerate(zip(meta["scales"], worst))))
    return f"<div>{html.escape(line)}</div>{extra}{table}"


class BlockExplorer(_Explorer):
    """One row of values quantized with MX or NVFP4 block scaling (``ampviz.formats.blocks``), element by
    element (``plot_blocks``).

    Controls: ``scheme_dropdown`` (MX with an element format, or NVFP4: ``SCHEMES``),
    ``block_dropdown`` (MX block size, 16 or 32; NVFP4's blocks are 16), ``rounding_dropdown`` (MX
    scale rounding: floor, ceil, even, rceil), ``tensor_scale_checkbox`` (NVFP4's per-tensor scale),
    ``data_dropdown`` (``DATA``), ``outlier_slider`` (log2 of the outlier placed in the normal data
    at ``outlier_at``), ``seed_input`` and ``hadamard_checkbox`` (the NVFP4 recipe's random
    Hadamard transform, 16 values at a time, before quantizing; the figure then shows the
    transformed row). Controls that do not apply to the scheme are disabled; the per-tensor scale
    box, NVFP4's alone, is also hidden under MX.

    State: ``x`` (the row quantized: the data, transformed when the Hadamard box is ticked),
    ``data`` (the row before any transform), ``result`` (``MXBlocks`` or ``NVFP4Blocks``),
    ``figure``, ``error``. The readout gives the mean and largest relative error, the shares
    saturated and flushed to zero, each block's scale and worst relative error (for NVFP4 both
    the E4M3 scale written above the block in the figure and the scale it makes with the tensor
    scale), and with the transform the errors after undoing it.
    """

    SCHEMES = SCHEMES
    DATA = DATA
    BLOCK_SIZES = (16, 32)
    LOG2_OUTLIER_RANGE = (0, 24)
    N_RANGE = (64, 256)
    MAX_SEED = 2**32 - 1
    #: How many drawn settings are kept for reuse (recent ones and the slider's next positions).
    KEPT_DRAWN = 8
    #: The width of the controls' column (pixels), beside the figure.
    CONTROLS_WIDTH = 360

    def __init__(self, scheme="fp8_e4m3", *, block_size=32, rounding="floor", per_tensor_scale=True,
                 data="normal", log2_outlier=8, hadamard=False, seed=0, n=128, outlier_at=37):
        self._init_common()
        schemes = [s for _, s in SCHEMES]
        if not isinstance(scheme, str) or scheme not in schemes:
            raise ValueError(f"scheme must be one of {', '.join(map(repr, schemes))}, got {_shown(scheme)}")
        if isinstance(block_size, bool) or block_size not in self.BLOCK_SIZES or not isinstance(
                block_size, (int, np.integer)):
            raise ValueError(f"block_size must be 16 or 32, got {_shown(block_size)}")
        if not isinstance(rounding, str) or rounding not in MX_ROUNDING:
            raise ValueError(f"rounding must be one of {', '.join(map(repr, MX_ROUNDING))}, got {_shown(rounding)}")
        for name, value in (("per_tensor_scale", per_tensor_scale), ("hadamard", hadamard)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {_shown(value)}")
        datas = [d for _, d in DATA]
        if not isinstance(data, str) or data not in datas:
            raise ValueError(f"data must be one of {', '.join(map(repr, datas))}, got {_shown(data)}")
        log2_outlier = _whole("log2_outlier", log2_outlier, *self.LOG2_OUTLIER_RANGE)
        seed = _whole("seed", seed, 0, self.MAX_SEED)
        n = _whole("n", n, *self.N_RANGE)
        if n % 32:
            raise ValueError(f"n must be a multiple of 32 (whole blocks of 16 and of 32), got {n:,}")
        self.outlier_at = _whole("outlier_at", outlier_at, 0, n - 1)
        self.n = n

        self.x = self.data = self.result = None
        self._ends = OrderedDict()  # settings (all but the outlier) -> the rows at the outlier slider's ends
        style = {"description_width": "110px"}
        wide = W.Layout(width="350px")  # within the controls' column, margins included
        self.scheme_dropdown = W.Dropdown(options=list(SCHEMES), value=scheme, description="scheme", style=style,
                                          layout=wide)
        self.block_dropdown = W.Dropdown(options=list(self.BLOCK_SIZES), value=int(block_size),
                                         description="MX block size", style=style)
        self.rounding_dropdown = W.Dropdown(options=list(MX_ROUNDING), value=rounding, description="MX scale",
                                            style=style)
        self.tensor_scale_checkbox = W.Checkbox(value=bool(per_tensor_scale), description="NVFP4 per-tensor scale",
                                                indent=False)
        self.data_dropdown = W.Dropdown(options=list(DATA), value=data, description="data", style=style, layout=wide)
        self.outlier_slider = W.IntSlider(value=log2_outlier, min=self.LOG2_OUTLIER_RANGE[0],
                                          max=self.LOG2_OUTLIER_RANGE[1], description="log2 outlier", style=style,
                                          layout=wide)
        self.seed_input = W.BoundedIntText(value=seed, min=0, max=self.MAX_SEED, description="seed", style=style)
        self.hadamard_checkbox = W.Checkbox(value=bool(hadamard), description="random Hadamard transform (16)",
                                            indent=False)
        for w, cls in ((self.scheme_dropdown, "scheme"), (self.block_dropdown, "block-size"),
                       (self.rounding_dropdown, "rounding"), (self.tensor_scale_checkbox, "tensor-scale"),
                       (self.data_dropdown, "data"), (self.outlier_slider, "outlier"), (self.seed_input, "seed"),
                       (self.hadamard_checkbox, "hadamard")):
            w.add_class(f"ampviz-blocks-{cls}")
            w.observe(self._on_change, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-blocks-readout")
        self.view.add_class("ampviz-blocks-figure")
        # the controls, message and readout in a column, the figure beside them (``_beside``)
        self.ui = _beside([self.scheme_dropdown, self.block_dropdown, self.rounding_dropdown,
                           self.tensor_scale_checkbox, self.data_dropdown, self.outlier_slider, self.seed_input,
                           self.hadamard_checkbox, self.message, self.readout], self.view, self.CONTROLS_WIDTH)
        self.ui.add_class("ampviz-block-explorer")
        self._enable()
        self.update()

    # ----- read the controls -----
    def _settings(self, **changed) -> tuple:
        values = {"scheme": self.scheme_dropdown.value, "block": int(self.block_dropdown.value),
                  "rounding": self.rounding_dropdown.value, "pts": bool(self.tensor_scale_checkbox.value),
                  "data": self.data_dropdown.value, "log2_outlier": int(self.outlier_slider.value),
                  "seed": int(self.seed_input.value), "hadamard": bool(self.hadamard_checkbox.value)}
        values.update(changed)
        return tuple(acting_settings(**values).items())

    def quantize(self, **changed):
        """(row before any transform, row quantized, result) for the controls' settings
        (``changed`` replaces some), computed by ``ampviz.formats.blocks``."""
        return quantize_row(dict(self._settings(**changed)), self.n, self.outlier_at)

    # ----- react -----
    def _enable(self) -> None:
        nvfp4 = self.scheme_dropdown.value == "nvfp4"
        self.block_dropdown.disabled = self.rounding_dropdown.disabled = nvfp4
        # NVFP4's alone: under MX it is hidden (a ticked box there would say it applies)
        self.tensor_scale_checkbox.disabled = not nvfp4
        self.tensor_scale_checkbox.layout.display = None if nvfp4 else "none"
        self.outlier_slider.disabled = self.data_dropdown.value != "normal"

    def _on_change(self, change) -> None:
        self._enable()
        self._note_move(change, ((self.outlier_slider, "log2_outlier"),))
        self._request_update(change)  # at once from Python; coalesced from the browser

    def _drawn(self, **changed) -> tuple:
        """(data, x, result, readout, figure, prepared figure) for the settings, kept for reuse."""
        key = self._settings(**changed)
        if (state := self._kept_state(key)) is not None:
            return state
        s = dict(key)
        data, x, result = quantize_row(s, self.n, self.outlier_at)
        fig = blocks_figure(x, result, s, hold=self._outlier_ends(**changed))
        readout = _in_column(readout_html(data, x, result, fig, s["hadamard"]))
        state = (data, x, result, readout, fig, FigureView.prepare(fig))
        return self._keep_state(key, state, self.KEPT_DRAWN)

    def _outlier_ends(self, **changed) -> tuple:
        """``outlier_ends`` at the settings, at the outlier slider's ends (kept per settings, all
        but the outlier): a move of the slider only moves the marks."""
        s = dict(self._settings(**changed))
        if s["log2_outlier"] is None:
            return ()
        key = tuple((k, v) for k, v in s.items() if k != "log2_outlier")
        return self._recent(self._ends, key, lambda: outlier_ends(s, self.n, self.outlier_at, self.outlier_slider.min,
                                                                  self.outlier_slider.max), self.KEPT_DRAWN)

    def update(self) -> None:
        """Quantize with the controls' settings and redraw."""
        self.data, self.x, self.result, readout, fig, prepared = self._drawn()
        self._draw(fig, prepared)
        self.readout.value = readout
        self._clear_error()
