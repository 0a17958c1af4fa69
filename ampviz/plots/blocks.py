"""Block scaling (MX and NVFP4) as a figure: ``plot_blocks`` draws a row of values and its block
quantization element by element: originals and dequantized values on a log2 axis, each block's
range and scale, the elements saturated or flushed to 0, and each element's relative error."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ampviz.plots.arguments import _shown, _title
from ampviz.plots.axes import _finite_log2, _log2_ticks
from ampviz.plots.style import _LINEAR, _WHITE, _WHITE_AXIS, _figure
from ampviz.plots.text import _pow2_short, format_number


#: Colours of ``plot_blocks``: the original values, the dequantized ones, an element held at its
#: block's largest value (vermillion, as overflow) and one that became 0 (blue, as underflow).
BLOCK_COLORS = {"original": "#000000", "dequantized": "#009E73", "saturated": "#D55E00", "flushed": "#0072B2",
                "range": "#999999", "error": "#56B4E9"}


def _block_element_format(result, codes: np.ndarray, values: np.ndarray, step: np.ndarray):
    """The element format of an ``MXBlocks`` (it does not store one): the MX format whose decoded
    codes times the block scales give ``values`` exactly (the first of ``MX_ELEMENT_FORMATS`` when
    several do, as in a row of zeros, where nothing saturates whichever it is)."""
    from ampviz.formats.blocks import MX_ELEMENT_FORMATS

    ok = np.isfinite(step) & np.isfinite(values)
    for f in MX_ELEMENT_FORMATS.values():
        if codes.size and int(codes.max()) >= 1 << f.bits:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            got = (np.asarray(f.decode(codes.astype(np.int64))).astype(np.float32) * step).astype(np.float32)
        if np.array_equal(got[ok], values[ok]):
            return f
    raise ValueError("result's codes and values match no MX element format: pass the MXBlocks that "
                     "mx_quantize returned for x")


def _block_parts(x, result, what: str = "x") -> dict:
    """``plot_blocks``' per-element arrays for a row ``x`` and its quantization ``result``,
    checked: the row, the dequantized values, the codes, the block scales and the element format,
    each block's largest and smallest nonzero value, and which elements saturated or flushed."""
    from ampviz.formats.blocks import MXBlocks, NVFP4Blocks
    from ampviz.formats import FP4_E2M1, FP8_E4M3

    if not isinstance(result, (MXBlocks, NVFP4Blocks)):
        raise TypeError(f"result must be MXBlocks or NVFP4Blocks (from ampviz.formats.blocks), "
                        f"got {type(result).__name__}")
    try:
        xs = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a row of numbers, got {_shown(x)}") from None
    with np.errstate(over="ignore"):
        xs = xs.astype(np.float32)
    values = np.asarray(result.values, np.float32)
    codes = np.asarray(result.codes)
    scales = np.asarray(result.scales)
    if xs.ndim != 1 or values.shape != xs.shape or scales.ndim != 1 or not scales.size \
            or xs.size % scales.size:
        raise ValueError(f"{what} must be one row and result its quantization: {what} has shape {xs.shape}, "
                         f"result's values {values.shape} and scales {scales.shape}")
    n, blocks = xs.size, scales.size
    bs = n // blocks
    nvfp4 = isinstance(result, NVFP4Blocks)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if nvfp4:
            fmt = FP4_E2M1
            block_scale = np.asarray(FP8_E4M3.decode(scales.astype(np.int64)), np.float64)
            ts = None if result.tensor_scale is None else float(result.tensor_scale)
            step = (block_scale if ts is None else np.float32(ts) * block_scale.astype(np.float32)).astype(np.float32)
        else:
            ts = None
            block_scale = np.where(scales == 255, np.nan, np.ldexp(1.0, scales.astype(np.int64) - 127))
            step = block_scale.astype(np.float32)
        elem_step = np.repeat(step, bs)
        fmt = fmt if nvfp4 else _block_element_format(result, codes, values, elem_step)
        top = fmt.max * step.astype(np.float64)  # each block's largest value
        least = fmt.smallest_subnormal * step.astype(np.float64)  # and its smallest nonzero one
        ax = np.abs(xs.astype(np.float64))
        saturated = np.isfinite(np.repeat(top, bs)) & (ax > np.repeat(top, bs))
        flushed = (xs != 0) & np.isfinite(xs) & (values == 0)
        err = np.where(xs != 0, np.abs(values.astype(np.float64) - xs) / ax, np.abs(values.astype(np.float64)))
    return {"xs": xs, "values": values, "scales": scales, "n": n, "blocks": blocks, "bs": bs, "nvfp4": nvfp4,
            "fmt": fmt, "block_scale": block_scale, "ts": ts, "step": step, "top": top, "least": least,
            "saturated": saturated, "flushed": flushed, "err": err}


def block_scale_words(parts: dict, label: str, b: int) -> str:
    """Block ``b``'s scale in words, from its label above the block (``label``): for NVFP4 "E4M3
    scale 448 × tensor scale 0.000866 = 0.388" (the E4M3 block scale alone without a tensor
    scale), for MX "scale 2^8 (E8M0)"."""
    if not parts["nvfp4"]:
        return f"scale {label} (E8M0)"
    step = parts["step"][b]
    total = format_number(float(step)) if np.isfinite(step) else "NaN"
    if parts["ts"] is None:
        return f"E4M3 scale {label} (no tensor scale)"
    return f"E4M3 scale {label} × tensor scale {format_number(parts['ts'])} = {total}"


def scale_hover(parts: dict, labels) -> list:
    """What hovering each block's scale label shows: the block and its scale in words."""
    return [f"block {b}: {block_scale_words(parts, label, b)}" for b, label in enumerate(labels)]


def _block_extents(parts: dict) -> np.ndarray:
    """The finite log2 magnitudes ``plot_blocks`` draws on its value axis for ``parts``: the
    row's, the dequantized values' and each block's largest and smallest nonzero value."""
    logs = np.concatenate([_finite_log2(parts[k]) for k in ("xs", "values", "top", "least")])
    return logs[np.isfinite(logs)]


def plot_blocks(x, result, *, title=None, legend_counts: bool = True, hold=()) -> go.Figure:
    """A row of values ``x`` and its block quantization ``result`` (``ampviz.formats.blocks.mx_quantize``'s
    ``MXBlocks`` or ``nvfp4_quantize``'s ``NVFP4Blocks`` of the same row), element by element.

    Top panel, magnitudes on a log2 axis (block scaling keeps the sign; what it loses is size):
    each original |value| (a thin black level across the element) and its dequantized one (a
    shorter, thicker green level over it: where the two agree only the black level's ends show
    beside the green), the blocks delimited by dotted lines, each block's range as two grey steps, its
    largest value (element max × block scale, solid) and its smallest nonzero one (the element
    format's smallest subnormal × block scale, dotted), and its scale written above it (2^k for
    MX's E8M0 scale; for NVFP4 the E4M3 block scale, which the tensor scale, given in the default
    title, multiplies). A value of 0 sits on a row of its own, labelled 0, under the axis's
    powers of two. An element beyond its block's range is held at it (saturated: a thick orange
    level at the block's largest value); a nonzero element that dequantizes to 0 is flushed (a
    thick blue level on the 0 row): an outlier lifts its
    block's range, and the neighbours that fall below the range's floor are flushed. Bottom
    panel: each element's relative error |q - x| / |x| (0 where x is 0) as a filled step one
    element wide.

    Every per-element row is a single path, not a mark per element: the dequantized row's points
    are ``(i - 0.35, log2|q_i|), (i + 0.35, log2|q_i|), gap`` for each element i (its
    ``customdata`` holds, per point, the block scale's text and q); the originals', the saturated
    and the flushed elements' are the same with ``i ± 0.45`` (the originals' ``customdata`` holds,
    per point, the element's block and value; NaN at the gaps); the error row's are
    ``(-0.5, e_0)``, then ``(i, e_i)`` for each element, then ``(n - 0.5, e_{n-1})``, drawn as a
    centred step (its ``customdata`` holds the element). The scale texts are a text trace (kind
    "scale") above the value panel.

    The value axis's range is fixed, out to whole ticks, over this row and the ``(x, result)``
    pairs given in ``hold`` (BlockExplorer passes the rows at its outlier slider's ends, so that
    the outlier moves against a still axis and a move only moves the marks). The saturated and
    flushed traces are there even when empty (an empty trace has no legend entry). With
    ``legend_counts=False`` the legend names them without their counts.

    Every trace carries ``meta["kind"]`` (range, least, original, dequantized, saturated,
    flushed, error, scale); ``layout.meta`` holds the scheme, element format, block size, each
    block's scale (its pattern and value, the text written above the block in ``scale_labels``, and
    in ``scale_words`` that text explained: "E4M3 scale 448 × tensor scale 0.000866 = 0.388"; the
    scale labels' hover says the same), the tensor scale, the counts saturated and flushed,
    each block's worst relative error and the zero row's place on the value axis (``zero_y``).
    """
    _title(title)
    if not isinstance(legend_counts, (bool, np.bool_)):
        raise TypeError(f"legend_counts must be True or False, got {_shown(legend_counts)}")
    if not isinstance(hold, (list, tuple)):
        raise TypeError(f"hold must be a list of (x, result) pairs, got {type(hold).__name__}")
    p = _block_parts(x, result)
    held = [_block_extents(p)]
    for pair in hold:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"hold must be a list of (x, result) pairs, got an item {_shown(pair)}")
        held.append(_block_extents(_block_parts(*pair, what="each held x")))
    xs, values, n, blocks, bs, fmt, step = p["xs"], p["values"], p["n"], p["blocks"], p["bs"], p["fmt"], p["step"]
    nvfp4, ts, err = p["nvfp4"], p["ts"], p["err"]
    idx = np.arange(n)
    worst = [float(np.nanmax(err[b * bs:(b + 1) * bs])) if np.isfinite(err[b * bs:(b + 1) * bs]).any() else None
             for b in range(blocks)]

    # the value axis: whole powers of two from below the lowest magnitude to above the highest,
    # and two binades under them the row of zeros
    finite = np.concatenate(held)
    lo, hi = (float(np.floor(finite.min())), float(np.ceil(finite.max()))) if finite.size else (-1.0, 1.0)
    ticks = _log2_ticks([lo, hi])
    dtick = ticks["dtick"]
    zero_y = lo - 2.0
    powers = np.arange(np.ceil(lo / dtick) * dtick, hi + dtick / 2, dtick)
    y_axis = {"range": [zero_y - 1.0, hi + 0.75], "tickmode": "array",
              "tickvals": [zero_y, *powers.tolist()], "ticktext": ["0", *[f"2^{int(v)}" for v in powers]]}

    def on_axis(v):
        """log2 |v|, with 0 on the zero row (inf and NaN: not drawn)."""
        y = _finite_log2(v)
        y[np.asarray(v) == 0] = zero_y
        return y

    def scale_text(b: int) -> str:
        if not np.isfinite(step[b]):
            return "NaN"
        return format_number(p["block_scale"][b]) if nvfp4 else _pow2_short(p["block_scale"][b])

    def levels(at, y, half):
        """Points of one path drawing a level from i - half to i + half at height y_i for each
        element i of ``at``, a gap after each."""
        lx = np.repeat(at.astype(np.float64), 3) + np.tile([-half, half, np.nan], at.size)
        ly = np.repeat(np.asarray(y, np.float64), 3)
        ly[2::3] = np.nan
        return lx, ly

    # the originals and the dequantized values as levels across their elements, one path each
    # (see the docstring): a mark per element costs the browser more to draw at every move
    orig_x, orig_y = levels(idx, on_axis(xs), 0.45)
    orig_data = np.repeat(np.column_stack([idx // bs, xs.astype(np.float64)]), 3, axis=0)
    orig_data[2::3] = np.nan
    tick_x, tick_y = levels(idx, on_axis(values), 0.35)
    scale_texts = [scale_text(b) for b in range(blocks)]
    tick_data = np.empty((3 * n, 2), dtype=object)
    tick_data[:, 0] = np.repeat(np.array(scale_texts, dtype=object)[idx // bs], 3)
    tick_data[:, 1] = np.repeat(values.astype(np.float64), 3)
    tick_data[2::3] = None
    edges = np.full(3 * blocks, np.nan)
    edges[0::3], edges[1::3] = idx[::bs] - 0.5, idx[::bs] + bs - 0.5

    def block_steps(v):
        y = np.full(3 * blocks, np.nan)
        y[0::3] = y[1::3] = _finite_log2(v)
        return y

    data = [
        {"type": "scatter", "x": edges, "y": block_steps(p["top"]), "mode": "lines",
         "name": "block's largest value (max × scale)", "line": {"color": BLOCK_COLORS["range"], "width": 1.5},
         "hoverinfo": "skip", "meta": {"kind": "range"}},
        {"type": "scatter", "x": edges, "y": block_steps(p["least"]), "mode": "lines",
         "name": "smallest nonzero (× scale)", "line": {"color": BLOCK_COLORS["range"], "width": 1.5, "dash": "dot"},
         "hoverinfo": "skip", "meta": {"kind": "least"}},
        # hover texts are templates over numbers (and each element's block scale as text), not a
        # string per element: a slider move sends less than half the bytes
        {"type": "scatter", "x": orig_x, "y": orig_y, "mode": "lines", "name": "original",
         "line": {"color": BLOCK_COLORS["original"], "width": 1.5}, "customdata": orig_data, "hoveron": "points",
         "hovertemplate": "element %{x:.0f} (block %{customdata[0]}) · x = %{customdata[1]:.4~g}<extra></extra>",
         "meta": {"kind": "original"}},
        {"type": "scatter", "x": tick_x, "y": tick_y, "mode": "lines", "name": "dequantized",
         "line": {"color": BLOCK_COLORS["dequantized"], "width": 2.5},
         "customdata": tick_data, "hoveron": "points",
         "hovertemplate": "element %{x:.0f} · q = %{customdata[1]:.4~g} · "
                          + ("E4M3 block scale" if nvfp4 else "block scale") + " %{customdata[0]}<extra></extra>",
         "meta": {"kind": "dequantized"}},
    ]
    for kind, flags, label in (("saturated", p["saturated"], "saturated (held at the block's max)"),
                               ("flushed", p["flushed"], "flushed to 0")):
        at = np.flatnonzero(flags)
        lx, ly = levels(at, on_axis(values[at]), 0.45)
        texts = [f"element {i} {kind}: x = {format_number(xs[i], 4)} → {format_number(values[i], 4)}"
                 for i in at.tolist()]
        data.append({"type": "scatter", "x": lx, "y": ly, "mode": "lines",
                     "name": f"{label}: {at.size}" if legend_counts else label,
                     "line": {"color": BLOCK_COLORS[kind], "width": 5},
                     "hovertext": [s for t in texts for s in (t, t, "")], "hoverinfo": "text", "hoveron": "points",
                     "meta": {"kind": kind}})
    # the relative error as a filled step one element wide around each element (see the docstring)
    data.append({"type": "scatter", "x": np.concatenate([[-0.5], idx, [n - 0.5]]),
                 "y": np.concatenate([err[:1], err, err[-1:]]), "mode": "lines", "name": "relative error",
                 "xaxis": "x2", "yaxis": "y2", "line": {"shape": "hvh", "width": 0, "color": BLOCK_COLORS["error"]},
                 "fill": "tozeroy", "fillcolor": BLOCK_COLORS["error"], "hoveron": "points",
                 "customdata": np.concatenate([[0], idx, [n - 1]]),
                 "hovertemplate": "element %{customdata} · error %{y:.3~%}<extra></extra>",
                 "showlegend": False, "meta": {"kind": "error"}})
    # each block's scale above it, on an axis of its own over the value panel: a trace, so that a
    # new scale moves no layout; hovering one says what it is (NVFP4: the E4M3 block scale, which
    # the tensor scale multiplies into the scale the block's elements take)
    data.append({"type": "scatter", "x": idx[::bs] + (bs - 1) / 2, "y": np.ones(blocks), "yaxis": "y3",
                 "mode": "text", "text": scale_texts, "textposition": "top center", "cliponaxis": False,
                 "textfont": {"size": 10, "color": "#555555"}, "hovertext": scale_hover(p, scale_texts),
                 "hoverinfo": "text", "showlegend": False, "meta": {"kind": "scale"}})
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": b * bs - 0.5, "x1": b * bs - 0.5, "y0": 0, "y1": 1,
               "line": {"color": "#888888", "width": 1, "dash": "dot"}} for b in range(1, blocks)]
    scheme = "NVFP4" if nvfp4 else f"MX {fmt.name}"
    ts_text = "" if not nvfp4 else (", no tensor scale" if ts is None else f", tensor scale {format_number(ts)}")
    finite_err = err[np.isfinite(err)]
    err_top = max(1.05, float(finite_err.max()) * 1.05) if finite_err.size else 1.05
    layout = {
        **_WHITE,
        "title": {"text": title or f"{scheme}: blocks of {bs}{ts_text}", "x": 0.01},
        # the legend at the figure's foot, under the axis title, with room for a second row (it
        # was placed a share of the plot's height under the plot, and drawn in an explorer it lay
        # on the element axis's numbers)
        "height": 600,
        "margin": {"l": 80, "r": 20, "t": 110, "b": 100},
        "legend": {"orientation": "h", "x": 0.01, "y": 0, "yref": "container", "yanchor": "bottom"},
        "xaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 1], "anchor": "y", "range": [-0.5, n - 0.5],
                  "showticklabels": False},
        "yaxis": {**_WHITE_AXIS, **_LINEAR, "domain": [0.4, 1], "title": {"text": "|value|"}, **y_axis},
        "yaxis3": {**_LINEAR, "domain": [0.4, 1], "range": [0, 1], "overlaying": "y", "visible": False,
                   "fixedrange": True},
        "xaxis2": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 1], "anchor": "y2", "matches": "x",
                   "range": [-0.5, n - 0.5], "title": {"text": "element"}},
        "yaxis2": {**_WHITE_AXIS, **_LINEAR, "domain": [0, 0.3], "anchor": "x2", "range": [0, err_top],
                   "title": {"text": "relative error"}, "tickformat": ".0%"},
        "shapes": shapes,
        "meta": {"scheme": "nvfp4" if nvfp4 else "mx", "fmt": fmt.name, "block_size": int(bs),
                 "scale_codes": p["scales"].astype(int).tolist(),
                 "scales": [float(v) if np.isfinite(v) else None for v in step.astype(np.float64)],
                 "scale_labels": list(scale_texts),
                 "scale_words": [block_scale_words(p, label, b) for b, label in enumerate(scale_texts)],
                 "tensor_scale": ts, "saturated": int(p["saturated"].sum()), "flushed": int(p["flushed"].sum()),
                 "block_worst": worst, "zero_y": zero_y},
    }
    return _figure(data, layout)
