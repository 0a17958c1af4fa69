"""BrowserBlockExplorer: BlockExplorer computed in the browser, with no kernel round trip per move.

The page gets the rows of values (float32, base64) from Python, and at every move quantizes the
row with MX or NVFP4 block scaling (``js/blocks.mjs``, bit for bit with ``ampviz.formats.blocks``),
applies the random Hadamard transform when asked (exactly rounded, as the package's), and writes
the readout and draws the figure BlockExplorer shows (``js/blockplot.mjs``: ``plot_blocks`` and
BlockExplorer's title and readout). A drag of the outlier slider repaints at every position.

The rows come from Python because they are numpy's random draws: the page receives, per seed, the
normal row (the outlier's place holds 1; the page writes 2^k there, as ``make_row`` does) and the
log-normal row. Seeds 0 to 15 and the seed given are shipped at once, so that a page with no
kernel can step through them; any other seed's rows are shipped when the seed is set (from the
page, or from Python), before the setting itself.

Python holds the settings as synced state (``scheme``, ``block_size``, ``rounding``,
``per_tensor_scale``, ``data``, ``log2_outlier``, ``hadamard``, ``seed``); ``data_row``, ``x``,
``result``, ``readout_html()`` and ``figure()`` compute, with the package and the functions
BlockExplorer draws with (``block_explorer``'s ``acting_settings``, ``quantize_row``,
``outlier_ends``, ``blocks_figure``, ``readout_html``), what the page shows for them.
"""

from __future__ import annotations

import numpy as np
import traitlets

from ampviz.formats.blocks import MX_ROUNDING, TE_RHT_SIGNS, hadamard_matrix
from ampviz.widgets.base import _in_column, _shown, _whole
from ampviz.widgets.block_explorer import (DATA, SCHEMES, BlockExplorer, acting_settings, blocks_figure, make_row,
                                           outlier_ends, quantize_row, readout_html)
from ampviz.widgets.browser_base import _Setting, _TemplatedPageExplorer, b64

__all__ = ["BrowserBlockExplorer"]

#: The seeds whose rows every page carries from the start (with the seed given).
SHIPPED_SEEDS = tuple(range(16))


def _check(name: str, value):
    """One setting, checked and made plain as BlockExplorer checks its argument (its words, its
    ValueError or TypeError)."""
    if name == "scheme":
        schemes = [s for _, s in SCHEMES]
        if not isinstance(value, str) or value not in schemes:
            raise ValueError(f"scheme must be one of {', '.join(map(repr, schemes))}, got {_shown(value)}")
        return value
    if name == "block_size":
        if isinstance(value, bool) or value not in BlockExplorer.BLOCK_SIZES or not isinstance(
                value, (int, np.integer)):
            raise ValueError(f"block_size must be 16 or 32, got {_shown(value)}")
        return int(value)
    if name == "rounding":
        if not isinstance(value, str) or value not in MX_ROUNDING:
            raise ValueError(f"rounding must be one of {', '.join(map(repr, MX_ROUNDING))}, got {_shown(value)}")
        return value
    if name in ("per_tensor_scale", "hadamard"):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {_shown(value)}")
        return bool(value)
    if name == "data":
        datas = [d for _, d in DATA]
        if not isinstance(value, str) or value not in datas:
            raise ValueError(f"data must be one of {', '.join(map(repr, datas))}, got {_shown(value)}")
        return value
    if name == "log2_outlier":
        return _whole("log2_outlier", value, *BlockExplorer.LOG2_OUTLIER_RANGE)
    if name == "seed":
        return _whole("seed", value, 0, BlockExplorer.MAX_SEED)
    raise KeyError(name)  # pragma: no cover - the names are this module's own


#: The settings, in the order BlockExplorer checks its arguments.
SETTINGS = ("scheme", "block_size", "rounding", "per_tensor_scale", "hadamard", "data", "log2_outlier", "seed")


class BrowserBlockExplorer(_TemplatedPageExplorer):
    """BlockExplorer's controls, readout and figure, computed by the page (see the module's docstring).

    ``BrowserBlockExplorer(scheme="fp8_e4m3", block_size=32, rounding="floor", per_tensor_scale=True,
    data="normal", log2_outlier=8, hadamard=False, seed=0, n=128, outlier_at=37)`` takes
    BlockExplorer's arguments (and raises its errors). The page has its controls: the scheme, the
    MX block size and scale rounding (disabled under NVFP4), NVFP4's per-tensor scale (shown under
    NVFP4 only), the data, the outlier's log2 (disabled for the log-normal data), the seed and the
    random Hadamard transform. Assigning ``explorer.log2_outlier = 12`` (or any setting) moves the
    page's control and redraws there; a bad value is refused in BlockExplorer's words.
    """

    FRONT_END = "block_explorer_view"

    scheme = _Setting("fp8_e4m3").tag(sync=True)
    block_size = _Setting(32).tag(sync=True)
    rounding = _Setting("floor").tag(sync=True)
    per_tensor_scale = _Setting(True).tag(sync=True)
    data = _Setting("normal").tag(sync=True)
    log2_outlier = _Setting(8).tag(sync=True)
    hadamard = _Setting(False).tag(sync=True)
    seed = _Setting(0).tag(sync=True)

    n = traitlets.Int(128, read_only=True).tag(sync=True)
    outlier_at = traitlets.Int(37, read_only=True).tag(sync=True)
    #: Per seed (its decimal text): {"normal": the normal row with 1 at ``outlier_at``, "lognormal":
    #: the log-normal row}, float32 little-endian in base64.
    rows = traitlets.Dict(read_only=True).tag(sync=True)
    #: The transform's matrix (``hadamard_matrix(TE_RHT_SIGNS)``, 16 × 16, row by row).
    hadamard_matrix = traitlets.List(read_only=True).tag(sync=True)
    #: The dropdowns' choices: [label, value] pairs (schemes, data) and values (block sizes, roundings).
    schemes = traitlets.List(read_only=True).tag(sync=True)
    datas = traitlets.List(read_only=True).tag(sync=True)
    block_sizes = traitlets.List(read_only=True).tag(sync=True)
    roundings = traitlets.List(read_only=True).tag(sync=True)
    log2_outlier_min = traitlets.Int(read_only=True).tag(sync=True)
    log2_outlier_max = traitlets.Int(read_only=True).tag(sync=True)
    max_seed = traitlets.Int(read_only=True).tag(sync=True)

    SCHEMES = SCHEMES
    DATA = DATA
    SETTINGS = SETTINGS

    def __init__(self, scheme="fp8_e4m3", *, block_size=32, rounding="floor", per_tensor_scale=True,
                 data="normal", log2_outlier=8, hadamard=False, seed=0, n=128, outlier_at=37):
        # BlockExplorer's own checks, in its order and words: the same arguments give the same errors
        given = dict(scheme=scheme, block_size=block_size, rounding=rounding, per_tensor_scale=per_tensor_scale,
                     hadamard=hadamard, data=data, log2_outlier=log2_outlier, seed=seed)
        settings = {name: _check(name, given[name]) for name in SETTINGS}
        n = _whole("n", n, *BlockExplorer.N_RANGE)
        if n % 32:
            raise ValueError(f"n must be a multiple of 32 (whole blocks of 16 and of 32), got {n:,}")
        outlier_at = _whole("outlier_at", outlier_at, 0, n - 1)
        super().__init__()
        lo, hi = BlockExplorer.LOG2_OUTLIER_RANGE
        with self.hold_trait_notifications():
            self.set_trait("n", n)
            self.set_trait("outlier_at", outlier_at)
            self.set_trait("rows", {str(s): self._rows_of(s, n, outlier_at)
                                    for s in dict.fromkeys((*SHIPPED_SEEDS, settings["seed"]))})
            self.set_trait("hadamard_matrix", hadamard_matrix(TE_RHT_SIGNS).ravel().tolist())
            self.set_trait("schemes", [list(p) for p in SCHEMES])
            self.set_trait("datas", [list(p) for p in DATA])
            self.set_trait("block_sizes", list(BlockExplorer.BLOCK_SIZES))
            self.set_trait("roundings", list(MX_ROUNDING))
            self.set_trait("log2_outlier_min", lo)
            self.set_trait("log2_outlier_max", hi)
            self.set_trait("max_seed", BlockExplorer.MAX_SEED)
            self._set_figure_style()  # plot_blocks names no template: plotly's default
            for name, value in settings.items():
                setattr(self, name, value)

    @staticmethod
    def _rows_of(seed: int, n: int, outlier_at: int) -> dict:
        """The rows the page needs for ``seed``: ``make_row``'s, the normal one with 2^0 placed."""
        return {d: b64(make_row(d, n, seed, 0, outlier_at), "<f4") for _, d in DATA}

    # ----- every setting checked, in BlockExplorer's words -----
    @traitlets.validate(*SETTINGS)
    def _valid(self, proposal):
        name = proposal["trait"].name
        try:
            value = _check(name, proposal["value"])
        except (TypeError, ValueError) as e:
            raise traitlets.TraitError(str(e)) from None
        if name == "seed" and str(value) not in self.rows:  # its rows reach the page before the seed
            self.set_trait("rows", {**self.rows, str(value): self._rows_of(value, self.n, self.outlier_at)})
        return value

    # ----- what the page shows, computed by the package -----
    def _at(self) -> tuple:
        """(row before any transform, row quantized, result, readout, figure) at the settings, as
        BlockExplorer draws them (kept for reuse)."""
        s = acting_settings(scheme=self.scheme, block=self.block_size, rounding=self.rounding,
                            pts=self.per_tensor_scale, data=self.data, log2_outlier=self.log2_outlier, seed=self.seed,
                            hadamard=self.hadamard)
        key = tuple(s.items())
        return self._kept(("drawn", key), lambda: self._drawn(s, key))

    def _drawn(self, s: dict, key: tuple) -> tuple:
        data, x, result = quantize_row(s, self.n, self.outlier_at)
        lo, hi = BlockExplorer.LOG2_OUTLIER_RANGE
        ends = self._kept(("ends", tuple((k, v) for k, v in key if k != "log2_outlier")),
                          lambda: outlier_ends(s, self.n, self.outlier_at, lo, hi))
        fig = blocks_figure(x, result, s, hold=ends)
        return data, x, result, _in_column(readout_html(data, x, result, fig, s["hadamard"])), fig

    @property
    def data_row(self) -> np.ndarray:
        """The row before any transform: ``make_row(data, n, seed, log2_outlier, outlier_at)``."""
        return self._at()[0]

    @property
    def x(self) -> np.ndarray:
        """The row quantized: the data, transformed when ``hadamard`` is set."""
        return self._at()[1]

    @property
    def result(self):
        """``MXBlocks`` or ``NVFP4Blocks`` of ``x``, as BlockExplorer quantizes it."""
        return self._at()[2]

    def readout_html(self) -> str:
        """The readout, as BlockExplorer writes it."""
        return self._at()[3]

    def figure(self):
        """The figure the page draws, as BlockExplorer draws it (its value axis held over the
        outlier slider's ends)."""
        return self._at()[4]
