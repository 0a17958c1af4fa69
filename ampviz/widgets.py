"""Explorers: small ipywidgets classes over the core.

Each explorer keeps its state on the instance (so a notebook or a test can read it), builds its
controls once, and answers every change with a three-step adapter: read the controls, ask the
core (``ampviz.formats``, ``ampviz.census``), redraw (a fresh figure from ``ampviz.plots`` into an
``ipywidgets.Output``). The last figure is also kept as ``.figure``.

An error inside a callback (text that is not a number, a bit pattern out of range) is shown in
the explorer's message line and kept as ``.error``; it never escapes as a traceback.

Show an explorer by making it the last expression of a cell, or with ``display(explorer)``.
"""

from __future__ import annotations

import functools
import html
import math
import operator
import re
import threading
import time

import numpy as np

import ipywidgets as W
from IPython.display import clear_output, display

from ampviz import scaling, synth
from ampviz.figureview import FigureView
from ampviz.census import Profile, census, profile, underflow_fractions
from ampviz.formats import CATEGORIES, FORMATS, get_format
import plotly.graph_objects as go

from ampviz.plots import (
    BAND_CATEGORIES,
    CATEGORY_COLORS,
    FIELD_COLORS,
    LIVE_DATA_KEYS,
    census_x_range,
    format_number,
    format_pow2,
    format_share,
    live_traces,
    plot_census,
    plot_live,
    plot_scale_trace,
    plot_value,
)

__all__ = ["ExplorerApp", "FormatExplorer", "LiveTrainer", "RangeExplorer", "ScalerLab", "parse_number", "running_trainers"]

#: Light tints of ``FIELD_COLORS`` for bits that are 0.
_FIELD_TINTS = {"sign": "#F3DDE9", "exponent": "#DDEFFA", "mantissa": "#FAEBCC"}
_ERROR_STYLE = "color:#B00020;font-weight:600"
_POW2 = re.compile(r"^([+-]?)2\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+)\s*\)?$")


def parse_number(text) -> float:
    """The number a learner typed: a decimal ("0.1", "1e-8", "65519"), a power of two ("2^-24",
    "2**-24"), "inf" or "nan". Raises ValueError with a readable message otherwise."""
    s = str(text).strip().replace("\u2212", "-")
    if not s:
        raise ValueError("type a number, e.g. 0.1, 1e-8, 65519, 2^-24, inf or nan")
    m = _POW2.match(s)
    if m:
        digits = m.group(2).lstrip("+-").lstrip("0")
        negative_k = m.group(2).startswith("-")
        # far beyond any float: no need to read the whole (possibly huge) exponent
        k = int(digits or "0") if len(digits) <= 6 else 10**7
        k = -k if negative_k else k
        try:
            v = math.ldexp(1.0, k)
        except OverflowError:
            v = math.inf
        return -v if m.group(1) == "-" else v
    try:
        return float(s)
    except ValueError:
        raise ValueError(
            f"could not read {_shown(s)} as a number: type a decimal such as 0.1, 1e-8 or 65519, "
            "a power of two such as 2^-24, or inf / nan"
        ) from None


def _shown(value, limit: int = 40) -> str:
    """``value`` as a message shows it: its repr on one line, cut to ``limit`` characters."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else repr(value[:limit]) + f"… ({len(value):,} characters)"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _parse_bits(text) -> int:
    """A bit pattern typed as hex ("0x3C00"), binary ("0b0011110000000000") or decimal."""
    s = str(text).strip().replace("_", "").replace(" ", "")
    if not s:
        raise ValueError("type a bit pattern, e.g. 0x3C00 or 0b0011110000000000")
    try:
        return int(s, 0) if s[:2].lower() in ("0x", "0b", "0o") else int(s, 16)
    except ValueError:
        raise ValueError(f"could not read {_shown(str(text).strip())} as a bit pattern: type hex such as 0x3C00") from None


def _whole(name: str, value, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi], or ValueError/TypeError saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) and not (
            isinstance(value, (float, np.floating)) and float(value).is_integer()):
        raise TypeError(f"{name} must be a whole number, got {_shown(value)}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be between {lo:,} and {hi:,}, got {v:,}" if hi is not None
                         else f"{name} must be at least {lo:,}, got {v:,}")
    return v


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {_shown(value)}")
    return float(value)


def _shows_errors(callback):
    """Run a widget callback; an exception becomes the explorer's message instead of a traceback."""

    @functools.wraps(callback)
    def wrapper(self, *args, **kwargs):
        try:
            return callback(self, *args, **kwargs)
        except Exception as exc:  # shown to the learner, kept on .error
            self._show_error(exc)
            return None

    return wrapper


def _show_in(output: W.Output, obj) -> None:
    """Show ``obj`` in ``output`` instead of what it showed. Outside IPython (a script, a test, a
    benchmark) there is nothing to show it in, and ``display`` would print the whole figure."""
    from IPython import get_ipython

    if get_ipython() is None:
        return
    with output:
        clear_output(wait=True)
        display(obj)


class _Explorer:
    """What every explorer shares: a root widget ``ui``, a message line, a figure output."""

    ui: W.Widget

    def _init_common(self) -> None:
        self.error: str | None = None
        self.figure = None
        self.message = W.HTML(value="")
        self.message.add_class("ampviz-message")
        self.output = W.Output()

    def _show_error(self, exc: BaseException) -> None:
        if isinstance(exc, (ValueError, TypeError, OverflowError)):
            text = str(exc)
        else:  # a bug, not the learner's input: still shown, never hidden
            text = f"internal error ({type(exc).__name__}): {exc}"
        self.error = text
        self.message.value = f'<span style="{_ERROR_STYLE}">⚠ {html.escape(text)}</span>'

    def _clear_error(self) -> None:
        self.error = None
        self.message.value = ""

    def _draw(self, fig) -> None:
        """Keep ``fig`` as ``.figure`` and show it in the output, replacing the previous one."""
        self.figure = fig
        try:
            _show_in(self.output, fig)
        except Exception as exc:  # an exception inside `with output` would print a traceback
            self._show_error(exc)

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)


# ----- formats, bit by bit -----
class FormatExplorer(_Explorer):
    """One value in one float format, bit by bit.

    Controls: a format dropdown (``format_dropdown``), one button per bit (``bit_buttons``, showing
    "1" or "0" and coloured by field; a click flips the bit;
    most significant first: ``bit_buttons[j]`` is bit ``fmt.bits - 1 - j``, CSS class
    ``ampviz-bit-<position>``), a decimal box (``decimal_input``: the learner types 0.1, 1e-8, 65519,
    2^-24, nan ...) and a bit-pattern box (``hex_input``: 0x3C00). The readout (``readout``) shows the
    stored value, the rounding error, the neighbours and ulp, the category and the three fields.

    State: ``fmt`` (the format), ``bits`` (the stored pattern), ``value`` (``fmt.decode(bits)``),
    ``typed`` (the number typed, or None when the bits were set directly), ``category``, ``error``,
    ``figure``. Methods ``set_format``, ``set_value``, ``set_decimal``, ``set_bits``, ``toggle_bit``
    do what the controls do (and raise on bad input instead of showing a message).
    """

    def __init__(self, fmt="fp16", value=1.0):
        self._init_common()
        self.fmt = get_format(fmt)
        self.typed: float | None = None
        self.bits = 0
        self._syncing = False
        self.bit_buttons: list[W.Button] = []

        self.format_dropdown = W.Dropdown(options=list(FORMATS), value=self.fmt.name, description="format")
        self.format_dropdown.add_class("ampviz-format-dropdown")
        self.decimal_input = W.Text(
            value="",
            description="decimal",
            placeholder="0.1, 1e-8, 65519, 2^-24, nan",
            continuous_update=False,
        )
        self.decimal_input.add_class("ampviz-decimal-input")
        self.hex_input = W.Text(value="", description="bits (hex)", continuous_update=False)
        self.hex_input.add_class("ampviz-hex-input")
        self.field_legend = W.HTML()
        self.bits_row = W.HBox(layout=W.Layout(flex_flow="row wrap", align_items="center"))
        self.bits_row.add_class("ampviz-bits-row")
        self.bits_readout = W.HTML()
        self.bits_readout.add_class("ampviz-bits-readout")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-format-readout")
        self.output.add_class("ampviz-format-figure")

        self.format_dropdown.observe(self._on_format, names="value")
        self.decimal_input.observe(self._on_decimal, names="value")
        self.hex_input.observe(self._on_hex, names="value")

        self.ui = W.VBox(
            [
                W.HBox([self.format_dropdown, self.decimal_input, self.hex_input],
                       layout=W.Layout(flex_flow="row wrap")),
                self.field_legend,
                self.bits_row,
                self.bits_readout,
                self.message,
                self.readout,
                self.output,
            ]
        )
        self.ui.add_class("ampviz-format-explorer")
        self._build_bit_buttons()
        self.set_value(value)

    # ----- state -----
    @property
    def value(self) -> float:
        """The stored value: ``fmt.decode(bits)``."""
        return float(self.fmt.decode(self.bits))

    @property
    def category(self) -> str:
        """Category of the typed number once cast (of the stored value when none was typed)."""
        x = self.value if self.typed is None else self.typed
        return CATEGORIES[int(self.fmt.classify_codes(x))]

    # ----- actions (the controls call these) -----
    def set_format(self, fmt) -> None:
        """Switch format, keeping the typed number (or the stored value) and re-encoding it."""
        new = get_format(fmt)
        x = self.value if self.typed is None else self.typed
        self.bits = int(new.encode(x))
        self.fmt = new
        self._build_bit_buttons()
        self.refresh()

    def set_value(self, x) -> None:
        """Store the number ``x`` (rounded into the format as a cast does)."""
        x = float(x)
        self.bits = int(self.fmt.encode(x))
        self.typed = x
        self.refresh(decimal_text=repr(x))

    def set_decimal(self, text) -> None:
        """Store the number typed as ``text`` ("0.1", "1e-8", "2^-24", "nan")."""
        x = parse_number(text)
        self.bits = int(self.fmt.encode(x))
        self.typed = x
        self.refresh(decimal_text=str(text).strip())

    def set_bits(self, bits) -> None:
        """Store the bit pattern ``bits`` (an integer in 0 .. 2**fmt.bits - 1)."""
        bits = operator.index(bits)  # TypeError for anything but an integer
        self.fmt.fields(bits)  # a clear ValueError when out of range
        self.bits = bits
        self.typed = None
        self.refresh()

    def toggle_bit(self, position: int) -> None:
        """Flip bit ``position`` (0 is the last mantissa bit, ``fmt.bits - 1`` the sign)."""
        if not 0 <= position < self.fmt.bits:
            raise ValueError(f"{self.fmt.name} has bits 0 to {self.fmt.bits - 1}, not {position}")
        self.set_bits(self.bits ^ (1 << position))

    # ----- callbacks: read control -> core -> redraw -----
    @_shows_errors
    def _on_format(self, change):
        if not self._syncing:
            self.set_format(change["new"])

    @_shows_errors
    def _on_decimal(self, change):
        if not self._syncing:
            self.set_decimal(change["new"])

    @_shows_errors
    def _on_hex(self, change):
        if not self._syncing:
            self.set_bits(_parse_bits(change["new"]))

    @_shows_errors
    def _on_bit(self, button):
        self.toggle_bit(self.fmt.bits - 1 - self.bit_buttons.index(button))

    # ----- drawing -----
    def _field_of(self, position: int) -> str:
        m = self.fmt.mantissa_bits
        if position == self.fmt.bits - 1:
            return "sign"
        return "exponent" if position >= m else "mantissa"

    def _build_bit_buttons(self) -> None:
        for b in self.bit_buttons:
            b.on_click(self._on_bit, remove=True)
            b.close()
        buttons = []
        for j in range(self.fmt.bits):
            position = self.fmt.bits - 1 - j
            field = self._field_of(position)
            b = W.Button(
                description="0",
                tooltip=f"bit {position} ({field})",
                layout=W.Layout(width="30px", height="30px", padding="0", margin="1px"),
            )
            b.add_class(f"ampviz-bit-{position}")
            b.add_class(f"ampviz-bit-{field}")
            b.on_click(self._on_bit)
            buttons.append(b)
        self.bit_buttons = buttons
        self.bits_row.children = tuple(buttons)
        f = self.fmt
        self.field_legend.value = (
            f'<span style="color:{FIELD_COLORS["sign"]}">■ sign (1 bit)</span> &nbsp; '
            f'<span style="color:{FIELD_COLORS["exponent"]}">■ exponent ({f.exponent_bits} bits, '
            f"bias {f.bias})</span> &nbsp; "
            f'<span style="color:{FIELD_COLORS["mantissa"]}">■ mantissa ({f.mantissa_bits} bits)</span>'
            f" &nbsp; <i>{html.escape(f.description)}</i>"
        )

    def refresh(self, decimal_text: str | None = None) -> None:
        """Bring every control, the readout and the figure in line with the state."""
        f, bits, stored = self.fmt, self.bits, self.value
        self._syncing = True
        try:
            self.format_dropdown.value = f.name
            for j, b in enumerate(self.bit_buttons):
                position = f.bits - 1 - j
                on = bool((bits >> position) & 1)
                field = self._field_of(position)
                b.description = "1" if on else "0"
                b.style.button_color = FIELD_COLORS[field] if on else _FIELD_TINTS[field]
                b.style.font_weight = "bold" if on else "normal"
            self.hex_input.value = f"0x{bits:0{(f.bits + 3) // 4}X}"
            self.decimal_input.value = decimal_text if decimal_text is not None else repr(stored)
        finally:
            self._syncing = False
        self.bits_readout.value = self._bits_html()
        self.readout.value = self._readout_html()
        self._clear_error()
        self._draw(plot_value(f, stored, typed=self.typed))

    def _bits_html(self) -> str:
        f, bits = self.fmt, self.bits
        text = format(bits, f"0{f.bits}b")
        parts = (text[:1], text[1 : 1 + f.exponent_bits], text[1 + f.exponent_bits :])
        spans = [
            f'<span style="color:{FIELD_COLORS[name]}">{part}</span>'
            for name, part in zip(("sign", "exponent", "mantissa"), parts)
        ]
        return f'<code style="font-size:1.1em">{" ".join(spans)}</code> &nbsp; = 0x{bits:0{(f.bits + 3) // 4}X}'

    def _readout_html(self) -> str:
        f, stored, typed = self.fmt, self.value, self.typed
        sign, exp, man = f.fields(self.bits)
        cat = self.category
        rows = []
        if typed is not None:
            rows.append(("typed", repr(typed)))
        rows.append(("stored", f"{stored!r} &nbsp; ({html.escape(format_pow2(stored, digits=6))})"))
        if typed is not None:
            rows.append(("rounding error", self._error_text(typed, stored)))
        rows.append(
            ("category",
             f'<b style="color:{CATEGORY_COLORS[cat]}">{cat}</b>' + self._category_note(cat, typed, stored))
        )
        below, above = f.neighbours(stored)
        rows.append(("neighbours", f"below {below!r} &nbsp; above {above!r}"))
        rows.append(("ulp here", f"{f.ulp(stored)!r}" + (
            f" &nbsp; ({html.escape(format_pow2(f.ulp(stored)))})" if math.isfinite(f.ulp(stored)) else "")))
        rows.append(("fields", self._fields_text(sign, exp, man)))
        body = "".join(
            f'<tr><td style="padding-right:1em;color:#555">{k}</td><td>{v}</td></tr>' for k, v in rows
        )
        return f"<table>{body}</table>"

    @staticmethod
    def _error_text(typed: float, stored: float) -> str:
        if math.isnan(typed) or math.isnan(stored):
            return "— (NaN)"
        if math.isinf(typed) and typed == stored:
            return "0"
        err = typed - stored
        if math.isinf(err):
            return f"{err!r} (the value overflowed)"
        rel = f" &nbsp; relative {abs(err) / abs(typed):.3g}" if typed != 0 and math.isfinite(typed) else ""
        return f"typed − stored = {err!r}{rel}"

    def _category_note(self, cat: str, typed, stored: float) -> str:
        f = self.fmt
        if cat == "overflow":
            if f.specials == "fn":
                return f" — beyond max, saturated to {format_number(f.max)} (no inf in {f.name})"
            return f" — at or beyond {format_number(f.overflow_boundary)}, becomes inf"
        if cat == "underflow":
            return f" — at most {format_pow2(f.underflow_boundary)}, becomes 0"
        if cat == "subnormal":
            return f" — below the smallest normal {format_pow2(f.smallest_normal)}: fewer significant bits"
        return ""

    def _fields_text(self, sign: int, exp: int, man: int) -> str:
        f = self.fmt
        m, e = f.mantissa_bits, f.exponent_bits
        top = (1 << e) - 1
        exp_bits, man_bits = format(exp, f"0{e}b"), format(man, f"0{m}b")
        parts = [f"sign {sign} ({'−' if sign else '+'})"]
        stored = self.value
        if math.isnan(stored):
            parts.append(f"exponent {exp_bits} (all ones) and mantissa {man_bits}: NaN")
            return "<br>".join(parts)
        if math.isinf(stored):
            parts.append(f"exponent {exp_bits} (all ones) and mantissa 0: inf")
            return "<br>".join(parts)
        if exp == 0:
            parts.append(f"exponent {exp_bits} = 0: subnormal, exponent 1 − {f.bias} = {f.emin}")
            parts.append(f"mantissa {man_bits} = {man} → significand 0 + {man}/2^{m}")
            significand = man / (1 << m)
            power = f.emin
        else:
            power = exp - f.bias
            parts.append(f"exponent {exp_bits} = {exp}, {exp} − bias {f.bias} = {power}")
            parts.append(f"mantissa {man_bits} = {man} → significand 1 + {man}/2^{m}")
            significand = 1 + man / (1 << m)
        parts.append(f"value (−1)^{sign} × {significand!r} × 2^{power} = {stored!r}")
        if exp == top:  # only reachable in an "fn" format, where the top exponent holds numbers
            parts.append(f"({f.name} has no inf: the top exponent holds numbers)")
        return "<br>".join(parts)


# ----- a census under a loss scale -----
class RangeExplorer(_Explorer):
    """Where a set of gradients lands in a low-precision format as the loss scale changes.

    Controls: ``scale_slider`` (an IntSlider for log2 of the scale; CSS class
    ``ampviz-scale-slider``) and ``format_dropdown`` (fp16, bf16, fp8_e4m3, fp8_e5m2). On every
    change it takes ``census(profile, fmt, 2**k)``, keeps it as ``.result``, writes the shares into
    ``readout`` and draws ``plot_census`` into ``output`` (kept as ``.figure``). The x axis stays
    fixed while the scale moves (it changes only with the format).
    """

    FORMAT_CHOICES = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
    #: log2 of the scales a census can take: every power of two that float32 holds
    LOG2_LIMITS = (-149, 127)

    def __init__(self, values, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 32)):
        self._init_common()
        name = get_format(fmt).name
        if name not in self.FORMAT_CHOICES:
            raise ValueError(f"RangeExplorer shows {', '.join(self.FORMAT_CHOICES)}; got {name!r}")
        self.profile = values if isinstance(values, Profile) else profile(values)
        self.result = None
        # lowest and highest binade of the unscaled values; the slider shifts them by k
        bins = census(self.profile, name, 1.0).log2_bins
        self._bin_extent = (int(bins.min()), int(bins.max())) if len(bins) else None

        log2_scale = _whole("log2_scale", log2_scale, *self.LOG2_LIMITS)
        try:
            lo_given, hi_given = log2_scale_range
        except (TypeError, ValueError):
            raise TypeError(f"log2_scale_range must be two whole numbers (lowest, highest), got "
                            f"{_shown(log2_scale_range)}") from None
        lo_given = _whole("log2_scale_range[0]", lo_given, *self.LOG2_LIMITS)
        hi_given = _whole("log2_scale_range[1]", hi_given, *self.LOG2_LIMITS)
        if lo_given > hi_given:
            raise ValueError(f"log2_scale_range must be (lowest, highest), got {_shown(log2_scale_range)}")
        lo, hi = min(lo_given, log2_scale), max(hi_given, log2_scale)
        self.scale_slider = W.IntSlider(
            value=int(log2_scale), min=lo, max=hi, step=1, description="log2 scale",
            layout=W.Layout(width="420px"),
        )
        self.scale_slider.add_class("ampviz-scale-slider")
        self.scale_label = W.HTML()
        self.scale_label.add_class("ampviz-scale-label")
        self.format_dropdown = W.Dropdown(options=list(self.FORMAT_CHOICES), value=name, description="format")
        self.format_dropdown.add_class("ampviz-format-dropdown")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-census-readout")
        self.output.add_class("ampviz-census-figure")

        self.scale_slider.observe(self._on_change, names="value")
        self.format_dropdown.observe(self._on_change, names="value")

        self.ui = W.VBox(
            [
                W.HBox([self.scale_slider, self.scale_label], layout=W.Layout(flex_flow="row wrap")),
                self.format_dropdown,
                self.message,
                self.readout,
                self.output,
            ]
        )
        self.ui.add_class("ampviz-range-explorer")
        self.update()

    @property
    def scale(self) -> float:
        return 2.0 ** self.scale_slider.value

    @property
    def fmt(self):
        return get_format(self.format_dropdown.value)

    def x_range(self) -> tuple[int, int]:
        """The figure's x range: the format's window and every bin the slider can reach."""
        if self._bin_extent is None:
            return census_x_range(self.fmt)
        lo, hi = self._bin_extent
        return census_x_range(self.fmt, lo + self.scale_slider.min, hi + self.scale_slider.max)

    @_shows_errors
    def _on_change(self, change):
        self.update()

    def update(self) -> None:
        """Census at the slider's scale and the dropdown's format, then redraw."""
        self.result = census(self.profile, self.fmt, self.scale)
        self.scale_label.value = f"scale = {html.escape(format_pow2(self.scale))}"
        self.readout.value = self._readout_html()
        self._clear_error()
        self._draw(plot_census(self.result, x_range=self.x_range()))

    def _readout_html(self) -> str:
        r = self.result
        shown = [k for k in CATEGORIES if k in BAND_CATEGORIES or r.counts[k]]
        cells = "".join(
            f'<span style="margin-right:1.2em"><b style="color:{CATEGORY_COLORS[k]}">{k}</b> '
            f"{format_share(r.fractions[k])} <small>({r.counts[k]:,})</small></span>"
            for k in shown
        )
        return f"<div>{cells}<small>of {r.total:,} values</small></div>"


# ----- dynamic loss scaling, live -----
class ScalerLab(_Explorer):
    """A dynamic loss scaler on a stream of gradients, re-simulated on every slider move.

    Controls: ``init_slider`` (log2 of init_scale), ``growth_slider``, ``backoff_slider``,
    ``interval_input`` (growth_interval), ``scenario_dropdown`` and ``strength_slider`` (the
    gradient stream, from ``ampviz.synth``), ``loss_dropdown`` (the loss in float32, as autocast
    computes it, or in fp16: ``ampviz.scaling.overflows``), ``overlay`` (other frameworks'
    scalers from ``ampviz.scaling.PRESETS`` to run on the same stream). Your settings run as
    ``torch.amp.GradScaler`` would (``TorchGradScaler``).

    State: ``stream`` (per-step max |gradient|), ``traces`` (``ScalerTrace`` per scaler, yours
    first), ``lost`` (steps and share of ``gradients`` lost to fp16 underflow at your scale),
    ``figure``, ``error``. Invalid settings (growth <= 1, backoff outside (0, 1), interval < 1)
    show a message and keep the last good figure.
    """

    #: The sliders' usual ranges (every position valid; a valid value given beyond them widens them).
    GROWTH_RANGE = (1.001, 4.0)
    BACKOFF_RANGE = (0.005, 0.995)
    #: The loss-dtype choices: (label, loss_dtype for ``scaling.overflows``).
    LOSSES = (("float32 (autocast)", "float32"), ("fp16 (a .half() model)", "float16"))

    def __init__(self, steps=100_000, *, scenario="spikes", strength=0.5, gradients=None, seed=0,
                 init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 overlay=(), loss_dtype="float32"):
        self._init_common()
        self.steps = _whole("steps", steps, 1, 10**8)
        self.seed = _whole("seed", seed, 0)
        self._streams: dict = {}
        self._lost_cache: dict = {}
        self.traces: list = []
        self.lost = None
        if gradients is None:  # a fixed sample spread over ~25 binades below its largest value, as
            rng = np.random.default_rng(self.seed)  # real gradients are (notebook 02's span ~30)
            gradients = np.exp2(-np.abs(rng.normal(0.0, 8.0, 20_000))).astype(np.float32)
        g = np.abs(np.asarray(gradients, dtype=np.float32).ravel())
        self._grad_shape = g / g.max() if g.size and g.max() > 0 else g

        log2_init = self._log2_init(init_scale)
        growth_factor, backoff_factor = _real("growth_factor", growth_factor), _real("backoff_factor", backoff_factor)
        growth_interval = _whole("growth_interval", growth_interval, 1, 10**7)
        strength = _real("strength", strength)
        if not 0 <= strength <= 1:
            raise ValueError(f"strength must be between 0 and 1, got {_shown(strength)}")
        if not isinstance(scenario, str) or scenario not in synth.SCENARIOS:
            raise ValueError(f"unknown scenario {_shown(scenario)}; choose one of {', '.join(synth.SCENARIOS)}")
        if not isinstance(loss_dtype, str) or loss_dtype not in dict(self.LOSSES).values():
            raise ValueError(f"loss_dtype must be 'float32' (the loss autocast computes in fp32) or 'float16' "
                             f"(a loss computed in fp16), got {_shown(loss_dtype)}")
        unknown = [name for name in overlay if name not in scaling.PRESETS or name == "torch"] \
            if not isinstance(overlay, str) else [overlay]
        if unknown:
            raise ValueError(f"cannot compare with {unknown[0]!r}; choose from "
                             f"{', '.join(n for n in scaling.PRESETS if n != 'torch')}")
        if not (math.isfinite(growth_factor) and growth_factor > 1):
            raise ValueError(f"growth_factor must be a finite number above 1 (the scale must be able to grow), "
                             f"got {_shown(growth_factor)}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be between 0 and 1 (both excluded), got {_shown(backoff_factor)}")
        style = {"description_width": "110px"}
        wide = W.Layout(width="420px")
        self.init_slider = W.IntSlider(value=log2_init, min=-10, max=40,
                                       description="log2 init_scale", style=style, layout=wide)
        # Every position of a slider is a valid setting (Home and End included): growth above 1,
        # backoff strictly between 0 and 1. A valid value beyond the usual range widens it: shown
        # as given, never moved.
        g_lo, g_hi = self.GROWTH_RANGE
        b_lo, b_hi = self.BACKOFF_RANGE
        self.growth_slider = W.FloatSlider(value=growth_factor, min=min(g_lo, growth_factor),
                                           max=max(g_hi, growth_factor), step=0.001,
                                           readout_format=".4g", description="growth_factor",
                                           style=style, layout=wide)
        self.backoff_slider = W.FloatSlider(value=backoff_factor, min=min(b_lo, backoff_factor),
                                            max=max(b_hi, backoff_factor), step=0.005,
                                            readout_format=".4g", description="backoff_factor",
                                            style=style, layout=wide)
        self.interval_input = W.BoundedIntText(value=growth_interval, min=1, max=10**7,
                                               description="growth_interval", style=style)
        self.scenario_dropdown = W.Dropdown(options=list(synth.SCENARIOS), value=scenario,
                                            description="scenario", style=style)
        self.strength_slider = W.FloatSlider(value=strength, min=0.0, max=1.0, step=0.05,
                                             description="strength", style=style, layout=wide)
        self.loss_dropdown = W.Dropdown(options=list(self.LOSSES), value=loss_dtype, description="loss",
                                        style=style)
        others = [(f"{name} (legacy)" if name in scaling.LEGACY else name, name)
                  for name in scaling.PRESETS if name != "torch"]
        self.overlay = W.SelectMultiple(options=others, value=tuple(overlay) if not isinstance(overlay, str) else (overlay,), rows=min(6, max(len(others), 1)),
                                        description="compare with", style=style)
        for w, cls in ((self.init_slider, "init"), (self.growth_slider, "growth"),
                       (self.backoff_slider, "backoff"), (self.interval_input, "interval"),
                       (self.scenario_dropdown, "scenario"), (self.strength_slider, "strength"),
                       (self.loss_dropdown, "loss"), (self.overlay, "overlay")):
            w.add_class(f"ampviz-scaler-{cls}")
            w.observe(self._on_change, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-scaler-readout")
        self.output.add_class("ampviz-scaler-figure")
        self.ui = W.VBox([
            W.HBox([W.VBox([self.init_slider, self.growth_slider, self.backoff_slider, self.interval_input]),
                    W.VBox([self.scenario_dropdown, self.strength_slider, self.loss_dropdown, self.overlay])],
                   layout=W.Layout(flex_flow="row wrap")),
            self.message, self.readout, self.output,
        ])
        self.ui.add_class("ampviz-scaler-lab")
        self.update()

    @staticmethod
    def _log2_init(init_scale) -> int:
        """log2 of ``init_scale``: the slider moves in powers of two from 2^-10 to 2^40."""
        x = _real("init_scale", init_scale)
        if x > 0 and math.isfinite(x):
            m, e = math.frexp(x)
            if m == 0.5 and -10 <= e - 1 <= 40:
                return e - 1
        raise ValueError(f"init_scale must be a power of two from 2^-10 to 2^40 (the slider moves in "
                         f"powers of two), got {_shown(init_scale)}")

    # ----- read the controls -----
    def policy(self) -> "scaling.DynamicScaler":
        """Your settings as a scaler, or ValueError with what is wrong."""
        gf, bf, gi = self.growth_slider.value, self.backoff_slider.value, self.interval_input.value
        problems = []
        if not gf > 1:
            problems.append(f"growth_factor must be above 1 (it is {gf:g}: the scale could never grow)")
        if not 0 < bf < 1:
            problems.append(f"backoff_factor must be between 0 and 1 (it is {bf:g})")
        if not gi >= 1:
            problems.append(f"growth_interval must be at least 1 step (it is {gi})")
        if problems:
            raise ValueError("; ".join(problems))
        # torch.amp.GradScaler's rule (TorchGradScaler), under its own name in the figure
        return scaling.DynamicScaler(name="your settings", init_scale=2.0 ** self.init_slider.value,
                                     growth_factor=gf, backoff_factor=bf, growth_interval=int(gi),
                                     arithmetic="torch", source=scaling.TorchGradScaler().source)

    @property
    def stream(self) -> np.ndarray:
        key = (self.scenario_dropdown.value, float(self.strength_slider.value))
        if key not in self._streams:
            self._streams[key] = synth.scenario(key[0], self.steps, key[1], np.random.default_rng(self.seed))
        return self._streams[key]

    # ----- react -----
    @_shows_errors
    def _on_change(self, change):
        self.update()

    def update(self) -> None:
        """Simulate every scaler on the stream and redraw (the last good figure stays on error)."""
        mine = self.policy()
        g = self.stream
        loss = self.loss_dropdown.value
        self.traces = [scaling.simulate(p, grad_max=g, loss_dtype=loss)
                       for p in [mine, *(scaling.PRESETS[name] for name in self.overlay.value)]]
        self.lost = self._lost_share(self.traces[0], self._typical_max(g))
        self.readout.value = self._readout_html()
        self._clear_error()
        self._draw(plot_scale_trace(self.traces, lost={"your settings": self.lost},
                                    title=f"{self.scenario_dropdown.value} gradients "
                                          f"(strength {self.strength_slider.value:g}), {self.steps:,} steps, "
                                          f"{'float32' if loss == 'float32' else 'fp16'} loss"))

    def _typical_max(self, g) -> float:
        """The stream's median largest gradient (computed once per stream)."""
        key = ("median", id(g))
        if key not in self._streams:
            self._streams[key] = float(np.median(g)) if g.size else 1.0
        return self._streams[key]

    def _lost_share(self, trace, level: float):
        """Share of the gradient sample (scaled to the stream's typical max) lost to fp16 underflow
        at the scale in effect, at the steps where the scale changes (at most 200 of them)."""
        s = trace.scale.astype(np.float64)
        if s.size == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        changed = np.flatnonzero(s[1:] != s[:-1]) + 1
        idx = np.concatenate([[0], changed])
        if idx.size > 200:
            idx = idx[np.linspace(0, idx.size - 1, 200).round().astype(np.int64)]
        if self._lost_cache.get("level") != level:
            self._lost_cache = {"level": level, "sample": (self._grad_shape * level).astype(np.float32)}
        scales = s[idx]
        usable = np.isfinite(scales) & (scales > 0) & (scales <= 3e38)
        shares = np.where(scales == 0, 1.0, 0.0)  # a zero scale loses every gradient
        if usable.any():
            shares[usable] = underflow_fractions(self._lost_cache["sample"], "fp16", scales[usable])
        return np.append(idx, s.size - 1), np.append(shares, shares[-1])

    def _readout_html(self) -> str:
        rows = []
        for t in self.traces:
            finite = t.scale[np.isfinite(t.scale)]
            low = format_number(float(finite.min())) if finite.size else "—"
            if t.stopped_at is not None:
                reason = getattr(t, "stop_reason", None)
                end = f"stopped at step {t.stopped_at:,}" + (f" ({html.escape(reason)})" if reason else "")
            else:
                end = format_number(float(t.final.scale))
            rows.append(f"<tr><td>{html.escape(t.policy.name)}</td><td>{t.skipped_count:,}</td>"
                        f"<td>{end}</td><td>{low}</td></tr>")
        head = "<tr><th>scaler</th><th>skipped steps</th><th>final scale</th><th>lowest scale</th></tr>"
        return f"<table>{head}{''.join(rows)}</table>"


# ----- live training -----
_REGISTRY_LOCK = threading.Lock()
_RUNNING: set = set()  # the LiveTrainers whose current run has a live thread
# Held by the one thread that trains: a run started while an older one still finishes its step
# waits here ("waiting for the previous run to end") instead of training beside it.
_TRAINING = threading.Lock()


def running_trainers() -> list:
    """The ``LiveTrainer``s whose training thread is running now (at most one trains; a run just
    started may still wait for an older one to finish its step)."""
    with _REGISTRY_LOCK:
        return list(_RUNNING)


def _stop_running(timeout: float = 5.0) -> None:
    """Ask every running trainer to stop, and wait up to ``timeout`` s for their threads. A run
    that is still inside a long step ends after it; a new run waits for it (``_TRAINING``)."""
    for trainer in running_trainers():
        trainer.stop(wait=True, timeout=timeout)


class _LiveRun:
    """One press of Start: its runs, controls, events and thread. The thread writes only into its
    own ``_LiveRun``, so a run that ends late can never write into the next one."""

    def __init__(self, runs: dict, controls: dict, total: int):
        self.runs, self.controls, self.total = runs, controls, total
        self.stop_event = threading.Event()
        self.resume = threading.Event()
        self.resume.set()
        self.held = threading.Event()  # set while the thread waits in a pause
        self.waiting = False  # waiting for an older run's thread to end
        self.errors: list = []
        self.active_time = 0.0
        self.thread: threading.Thread | None = None
        self.ended = False  # the thread has finished its work (it may still draw a last time)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.ended


class LiveTrainer(_Explorer):
    """Train a tiny model in several AMP modes at once and watch it live.

    The selected modes (``mode_checks``) train side by side in one background thread, one step of
    each mode in turn (``ampviz.live.train_steps``; every mode sees the same seeded model and
    batches), so the kernel stays free while they run. Controls: ``model_dropdown``, ``lr_input``,
    ``steps_input``, and the scaler sliders ``growth_slider``, ``backoff_slider``,
    ``interval_slider`` (growth_factor, backoff_factor, growth_interval of "fp16+scaler"), which
    act on a running training from its next step (``live.ScalerControl``); buttons ``start_button``,
    ``pause_button`` (Pause / Resume, held between steps), ``stop_button`` (the run ends within a
    step); ``progress`` with ``status`` (steps done and steps per second), ``device_line``
    (``live.describe_device``) and the message line.

    The figure (``figure``, a ``FigureView`` built from ``plot_live`` of empty runs) is redrawn
    from the records at most once per ``redraw_interval`` seconds, and no more often than keeps
    drawing under about a tenth of the run's time. Its state is the whole figure,
    so a page reloaded (or shown in Voila) draws the run as it is. A long run stays cheap: each
    mode's ``live.Run`` keeps at most ``max_records`` records (thinned evenly, skipped steps kept
    more densely; ``live.Run.max_records``), so memory and the cost of a redraw do not grow with
    the run. All widget writes of a run happen in ``_refresh`` and ``_sync_controls``.

    Only one training runs at a time: constructing or starting a LiveTrainer stops any other
    running one first; if that one is inside a long step, the new run waits for it to end
    (the status says so) and never trains beside it.

    State: ``runs`` (mode -> ``live.Run``, growing while the thread runs), ``running``, ``paused``,
    ``thread``, ``error`` (what ended a mode, in a sentence, e.g. "fp16 overflowed at step 12: the
    loss is inf", or an internal error), ``figure``.
    Methods ``start()``, ``pause()``, ``resume()``, ``stop(wait=True)``, ``wait(timeout)``.
    """

    GROWTH_RANGE = (1.01, 4.0)
    BACKOFF_RANGE = (0.05, 0.95)

    def __init__(self, modes=("fp32", "fp16", "fp16+scaler"), model="mlp", steps=300, lr=None, *,
                 growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, init_scale=2.0**16,
                 census_every=10, seed=0, batch_size=None, device=None, redraw_interval=0.1,
                 max_records=4000):
        from ampviz import live  # torch: imported when a trainer is made, not with ampviz.widgets

        self._live = live
        if isinstance(modes, str):
            modes = (modes,)
        try:
            modes = tuple(modes)
        except TypeError:
            raise TypeError(f"modes must be a mode or a list of modes from {', '.join(live.MODES)}, "
                            f"got {_shown(modes)}") from None
        unknown = [m for m in modes if m not in live.MODES]
        if unknown:
            raise ValueError(f"unknown mode {unknown[0]!r}; choose from {', '.join(live.MODES)}")
        if model not in live.MODELS:
            raise ValueError(f"unknown model {_shown(model)}; choose one of {', '.join(live.MODELS)}")
        steps = _whole("steps", steps, 1, 10**7)
        if lr is not None:
            lr = _real("lr", lr)
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"lr must be a positive number (or None for the model's default), got {_shown(lr)}")
        growth_factor = _real("growth_factor", growth_factor)
        backoff_factor = _real("backoff_factor", backoff_factor)
        growth_interval = _whole("growth_interval", growth_interval, 1)
        live._check_scaler_settings(growth_factor, backoff_factor, growth_interval)
        if not math.isfinite(growth_factor):
            raise ValueError(f"growth_factor must be a finite number above 1, got {_shown(growth_factor)}")
        init_scale = _real("init_scale", init_scale)
        if not (math.isfinite(init_scale) and init_scale >= 0):
            raise ValueError(f"init_scale must be a finite number >= 0, got {_shown(init_scale)}")
        self.census_every = _whole("census_every", census_every, 0)
        self.seed = _whole("seed", seed, 0)
        self.batch_size = None if batch_size is None else _whole("batch_size", batch_size, 1, 65536)
        self.redraw_interval = _real("redraw_interval", redraw_interval)
        if not (math.isfinite(self.redraw_interval) and self.redraw_interval >= 0):
            raise ValueError(f"redraw_interval must be a number of seconds >= 0, got {_shown(redraw_interval)}")
        self.max_records = None if max_records is None else _whole("max_records", max_records, 16)
        self.init_scale = init_scale
        self.device = None if device is None else str(live.resolve_device(device))
        device_text = live.describe_device(device)  # a bad device name fails here, before anything starts

        _stop_running()
        self._init_common()
        self.runs: dict = {}
        self._run: _LiveRun | None = None
        self._ui_lock = threading.RLock()  # a late thread's last refresh never overwrites the next run's

        style = {"description_width": "110px"}
        wide = W.Layout(width="380px")
        self.mode_checks = {m: W.Checkbox(value=m in modes, description=m, indent=False,
                                          layout=W.Layout(width="auto", margin="0 1em 0 0"))
                            for m in live.MODES}
        for m, box in self.mode_checks.items():
            box.add_class("ampviz-live-mode")
            box.add_class(f"ampviz-live-mode-{m.replace('+', '-')}")
        self.model_dropdown = W.Dropdown(options=list(live.MODELS), value=model, description="model", style=style)
        # another model brings its own learning rate (the classifiers' SGD takes 0.05, the beam's Adam 1e-3)
        self.model_dropdown.observe(
            lambda change: setattr(self.lr_input, "value", live.TrainConfig(model=change["new"]).learning_rate),
            names="value")
        default_lr = live.TrainConfig(model=model).learning_rate if lr is None else lr
        self.lr_input = W.FloatText(value=default_lr, description="learning rate", style=style)
        self.steps_input = W.BoundedIntText(value=steps, min=1, max=10**7, description="steps", style=style)
        # the sliders' ranges reach every valid value given: shown as given, never moved silently
        g_lo, g_hi = self.GROWTH_RANGE
        b_lo, b_hi = self.BACKOFF_RANGE
        self.growth_slider = W.FloatSlider(value=growth_factor, min=min(g_lo, growth_factor),
                                           max=max(g_hi, growth_factor), step=0.01, readout_format=".3g",
                                           description="growth_factor", style=style, layout=wide)
        self.backoff_slider = W.FloatSlider(value=backoff_factor, min=min(b_lo, backoff_factor),
                                            max=max(b_hi, backoff_factor), step=0.05, readout_format=".3g",
                                            description="backoff_factor", style=style, layout=wide)
        self.interval_slider = W.IntSlider(value=growth_interval, min=1, max=max(5000, growth_interval),
                                           description="growth_interval", style=style, layout=wide)
        self.start_button = W.Button(description="Start", button_style="success", icon="play")
        self.pause_button = W.Button(description="Pause", icon="pause")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress", style=style)
        self.status = W.HTML(value="not started")
        self.device_line = W.HTML(value=f"device: {html.escape(device_text)}")
        for w, cls in ((self.model_dropdown, "model"), (self.lr_input, "lr"), (self.steps_input, "steps"),
                       (self.growth_slider, "growth"), (self.backoff_slider, "backoff"),
                       (self.interval_slider, "interval"), (self.start_button, "start"),
                       (self.pause_button, "pause"), (self.stop_button, "stop"),
                       (self.progress, "progress"), (self.status, "status"), (self.device_line, "device")):
            w.add_class(f"ampviz-live-{cls}")
        for slider in (self.growth_slider, self.backoff_slider, self.interval_slider):
            slider.observe(self._on_scaler_setting, names="value")
        self.start_button.on_click(self._on_start)
        self.pause_button.on_click(self._on_pause)
        self.stop_button.on_click(self._on_stop)

        self._figure_key = None
        self.figure_box = W.Box(layout=W.Layout(width="100%"))
        self.figure_box.add_class("ampviz-live-figure")
        self._new_figure([m for m in live.MODES if m in modes], steps)
        self.ui = W.VBox([
            W.HBox(list(self.mode_checks.values()), layout=W.Layout(flex_flow="row wrap")),
            W.HBox([W.VBox([self.model_dropdown, self.lr_input, self.steps_input]),
                    W.VBox([self.growth_slider, self.backoff_slider, self.interval_slider])],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.start_button, self.pause_button, self.stop_button, self.progress, self.status],
                   layout=W.Layout(flex_flow="row wrap", align_items="center")),
            self.device_line, self.message, self.figure_box,
        ])
        self.ui.add_class("ampviz-live-trainer")
        self._sync_controls()

    # ----- read the controls -----
    @property
    def modes(self) -> list:
        """The selected modes, in ``live.MODES`` order."""
        return [m for m, box in self.mode_checks.items() if box.value]

    @property
    def running(self) -> bool:
        """The current run's thread is alive (training, paused, or waiting for an older run)."""
        return self._run is not None and self._run.alive

    @property
    def thread(self) -> threading.Thread | None:
        return None if self._run is None else self._run.thread

    @property
    def paused(self) -> bool:
        return self.running and not self._run.resume.is_set()

    @property
    def _held(self) -> threading.Event:
        return self._run.held

    def scaler_settings(self) -> dict:
        return {"growth_factor": float(self.growth_slider.value),
                "backoff_factor": float(self.backoff_slider.value),
                "growth_interval": int(self.interval_slider.value)}

    def configs(self) -> list:
        """One ``live.TrainConfig`` per selected mode, from the controls (ValueError when they are wrong)."""
        modes = self.modes
        if not modes:
            raise ValueError("select at least one mode to train")
        lr = float(self.lr_input.value)
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"the learning rate must be a positive number, got {lr:g}")
        steps = int(self.steps_input.value)
        if not 1 <= steps <= 10**7:
            raise ValueError(f"steps must be between 1 and 10,000,000, got {steps:,}")
        return [self._live.TrainConfig(model=self.model_dropdown.value, mode=m, steps=steps,
                                       lr=lr, batch_size=self.batch_size, seed=self.seed, device=self.device,
                                       census_every=self.census_every, init_scale=self.init_scale,
                                       **self.scaler_settings())
                for m in modes]

    # ----- actions -----
    def start(self) -> None:
        """Start training the selected modes in a background thread (any running training is
        stopped first; if it is inside a long step, this run waits for it to end)."""
        try:
            configs = self.configs()
        except (ValueError, TypeError):
            if not self.running:  # the status line must not go on describing an earlier run
                self.status.value = "not started: see the message above"
            raise
        _stop_running(timeout=1.0)
        live = self._live
        device_text = live.describe_device(self.device)
        total = sum(c.steps for c in configs)
        run = _LiveRun({c.mode: live.Run(config=c, device=device_text, max_records=self.max_records)
                        for c in configs},
                       {c.mode: live.ScalerControl() for c in configs}, total)
        gens = {c.mode: live.train_steps(c, run.controls[c.mode]) for c in configs}
        run.thread = threading.Thread(target=self._work, args=(run, gens), name="ampviz-live-trainer",
                                      daemon=True)
        with self._ui_lock:
            self._run, self.runs = run, run.runs
            self._clear_error()
            self.progress.max, self.progress.value = max(total, 1), 0
            self._new_figure([c.mode for c in configs], max(c.steps for c in configs))
            self._figure_key = None  # this figure now belongs to a run: the next start builds a fresh one
            self.status.value = f"0 / {total:,} steps · starting"
        with _REGISTRY_LOCK:
            _RUNNING.add(self)
        run.thread.start()
        self._sync_controls()

    def pause(self, wait: bool = True, timeout: float = 2.0) -> None:
        """Hold the run between two steps (``wait``: until the thread holds)."""
        run = self._run
        if run is None or not run.alive:
            return
        run.resume.clear()
        self._sync_controls()
        if wait and threading.current_thread() is not run.thread:
            deadline = time.monotonic() + timeout
            while run.alive and not run.held.is_set() and time.monotonic() < deadline:
                run.held.wait(0.01)

    def resume(self) -> None:
        """Go on after ``pause()``."""
        if self._run is not None:
            self._run.resume.set()
        self._sync_controls()

    def stop(self, wait: bool = True, timeout: float = 5.0) -> bool:
        """Ask the run to end before its next step; ``wait``: join the thread (at most ``timeout``
        seconds). True when it has ended."""
        run = self._run
        if run is None:
            return True
        run.stop_event.set()
        for control in run.controls.values():
            control.stop()
        run.resume.set()
        if wait:
            return self.wait(timeout)
        return not run.alive

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the training thread to end; True when it has."""
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        return t is None or not t.is_alive()

    # ----- callbacks -----
    @_shows_errors
    def _on_start(self, button):
        self.start()

    @_shows_errors
    def _on_pause(self, button):
        if self.paused:
            self.resume()
        else:
            self.pause(wait=False)

    @_shows_errors
    def _on_stop(self, button):
        self.stop(wait=True)

    @_shows_errors
    def _on_scaler_setting(self, change):
        settings = self.scaler_settings()
        if self._run is not None:
            for control in self._run.controls.values():
                control.set(**settings)

    # ----- the training thread -----
    def _work(self, run: _LiveRun, gens: dict) -> None:
        active = dict(gens)
        try:
            if not _TRAINING.acquire(blocking=False):
                run.waiting = True
                self._refresh(run)
                while not _TRAINING.acquire(timeout=0.05):
                    if run.stop_event.is_set():
                        return
                run.waiting = False
            try:
                self._train(run, active)
            finally:
                _TRAINING.release()
        except Exception as exc:  # a bug, not the learner's input: shown, never lost
            run.errors.append(f"internal error ({type(exc).__name__}): {exc}")
        finally:
            for gen in gens.values():
                gen.close()
            run.held.clear()
            run.waiting = False
            run.ended = True
            with _REGISTRY_LOCK:
                if self._run is run or not self.running:
                    _RUNNING.discard(self)
            self._refresh(run, ended=True)

    def _train(self, run: _LiveRun, active: dict) -> None:
        last_draw, draw_cost = time.perf_counter(), 0.0
        while active and not run.stop_event.is_set():
            if not run.resume.is_set():
                if not run.held.is_set():
                    run.held.set()
                    self._refresh(run)
                run.resume.wait(0.05)
                continue
            run.held.clear()
            t0 = time.perf_counter()
            for mode, gen in list(active.items()):
                rec = next(gen, None)
                if rec is None:
                    del active[mode]
                    continue
                run.runs[mode].append(rec)
                if rec.error is not None:
                    run.errors.append(rec.error)
            t1 = time.perf_counter()
            run.active_time += t1 - t0
            # at most one redraw per redraw_interval, and never more than ~10% of the time drawing
            if t1 - last_draw >= max(self.redraw_interval, 10 * draw_cost):
                last_draw = t1
                self._refresh(run)
                draw_cost = time.perf_counter() - t1

    def _state(self, run: _LiveRun, ended: bool) -> str:
        if not ended:
            return "waiting for the previous run to end" if run.waiting else (
                "paused" if not run.resume.is_set() else "running")
        done = sum(r.steps_recorded for r in run.runs.values())
        return ("failed" if run.errors else
                "stopped" if run.stop_event.is_set() and done < run.total else "done")

    def _refresh(self, run: _LiveRun | None = None, ended: bool = False) -> None:
        """Progress, status, message and figure from the records so far (never raises). Only the
        current run draws: a run that ended late leaves the widgets to the newer one."""
        run = self._run if run is None else run
        if run is None:
            return
        with self._ui_lock:
            if run is not self._run:
                return
            try:
                done = sum(r.steps_recorded for r in run.runs.values())
                rate = done / run.active_time if run.active_time > 0 else 0.0
                self.progress.value = min(done, self.progress.max)
                self.status.value = (f"{done:,} / {run.total:,} steps · {rate:,.0f} steps/s · "
                                     f"{self._state(run, ended)}")
                if run.errors:
                    self.error = "; ".join(run.errors)
                    self.message.value = f'<span style="{_ERROR_STYLE}">⚠ {html.escape(self.error)}</span>'
                self._sync_controls()
                self._draw_live()
            except Exception as exc:  # drawing must never end a run or escape the thread
                self._show_error(exc)

    def _draw_live(self) -> None:
        data = live_traces(self.runs, heat_mode=self._heat_mode)
        if [d["meta"] for d in data] != [t["meta"] for t in self.figure.data]:
            raise RuntimeError("the live figure's traces do not match the runs")
        self.figure.set_data(data)

    def _sync_controls(self) -> None:
        running = self.running
        self.start_button.disabled = running
        self.pause_button.disabled = not running
        self.pause_button.description = "Resume" if self.paused else "Pause"
        self.pause_button.icon = "play" if self.paused else "pause"
        self.stop_button.disabled = not running
        for w in (*self.mode_checks.values(), self.model_dropdown, self.lr_input, self.steps_input):
            w.disabled = running

    def _new_figure(self, modes: list, steps: int) -> None:
        """A fresh FigureView from ``plot_live`` of empty runs (every trace present from the start)."""
        key = (tuple(modes), int(steps))
        if key == self._figure_key and self.figure is not None:
            return
        fig = plot_live({m: [] for m in modes}, steps=steps)
        self._heat_mode = fig.layout.meta["heat_mode"]
        view = FigureView(fig)
        view.add_class("ampviz-live-plot")
        old, self.figure, self._figure_key = self.figure, view, key
        self.figure_box.children = (view,)
        if old is not None:
            old.close()


# ----- the explorer app: every explorer on one page -----
class ExplorerApp:
    """The four explorers on one page, a tab each: the explorer app (``notebooks/explorer.ipynb``,
    served as a page by Voila with ``make explorer``).

    Tabs: ``formats`` (a ``FormatExplorer``), ``ranges`` (a ``RangeExplorer`` over ``gradients``),
    ``scaling`` (a ``ScalerLab`` of ``steps`` steps, its lost share measured on the same
    ``gradients``; ``overlay`` names other frameworks' scalers to draw from the start, none by
    default, since each one adds tens of milliseconds to every slider move at a million steps) and ``training`` (a
    ``LiveTrainer``; ``live=False`` leaves it out). ``gradients`` default to the weight
    gradients of the course's seeded 12-layer MLP (``ampviz.training.model_gradients``, as in
    notebook 02). With either of those, the app sets torch to one intra-op thread, as the
    notebooks' setup cells do.

    A figure drawn while its tab is hidden has no width to size itself to, so selecting a tab
    draws its figure again (``refresh_tab``); the live training figure, a streaming FigureWidget,
    keeps plotly's default width of 700 px instead. ``tabs`` is the ``ipywidgets.Tab``; ``explorers``
    lists the explorers in tab order.
    """

    TITLES = ("Formats", "Ranges", "Loss scaling", "Live training")
    INTRO = ("<i>Formats</i>: click bits or type a number and see what fp16, bf16, fp8 or tf32 store. "
             "<i>Ranges</i>: slide the loss scale and watch real gradients leave the underflow band. "
             "<i>Loss scaling</i>: a dynamic loss scaler on a million steps; compare it with other frameworks'. "
             "<i>Live training</i>: train a small model in several precisions at once and steer its scaler.")

    def __init__(self, *, gradients=None, steps=1_000_000, live=True, seed=0, overlay=()):
        if live or gradients is None:
            import torch

            # the app's kernel is its own: one intra-op thread, as in the notebooks' setup cells.
            # The tiny models train several times faster so on a small machine (JupyterLab on 2
            # cores: 45 steps/s with torch's default 2 threads, 220 with 1), and the gradients
            # are notebook 02's to the bit (a float sum depends on the thread count)
            torch.set_num_threads(1)
        if gradients is None:
            from ampviz.beam import gradients as beam_gradients  # torch: only when the app needs real gradients
            gradients = beam_gradients(seed).all
        self.gradients = np.asarray(gradients, dtype=np.float32)
        self.formats = FormatExplorer("fp16", value=0.1)
        # up to 2^36: past the largest safe scale of the default gradients (2^33)
        self.ranges = RangeExplorer(self.gradients, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 36))
        self.scaling = ScalerLab(steps=steps, scenario="spikes", strength=0.5, gradients=self.gradients,
                                 seed=seed, overlay=overlay)
        # the beam model: fp32 and fp16+scaler learn, fp16 alone stalls (ampviz.beam)
        self.training = LiveTrainer(modes=("fp32", "fp16", "fp16+scaler"), model="beam", steps=300,
                                    seed=seed) if live else None
        self.explorers = [e for e in (self.formats, self.ranges, self.scaling, self.training) if e is not None]
        titles = list(self.TITLES[:len(self.explorers)])
        self.tabs = W.Tab(children=[e.ui for e in self.explorers], titles=titles)
        self.tabs.add_class("ampviz-explorer-tabs")
        self.tabs.observe(self._on_tab, names="selected_index")
        self.intro = W.HTML(value=self.INTRO)
        self.intro.add_class("ampviz-explorer-intro")
        self.ui = W.VBox([self.intro, self.tabs])
        self.ui.add_class("ampviz-explorer-app")

    def refresh_tab(self, index: int | None = None) -> None:
        """Draw the figure of tab ``index`` (default: the selected one) again, now that it has a width."""
        index = self.tabs.selected_index if index is None else index
        if index is None or not 0 <= index < len(self.explorers):
            return
        explorer = self.explorers[index]
        # LiveTrainer streams into a FigureWidget, which is not redrawn: its view keeps the width
        # it got when first shown (plotly's 700 px when that happened in a hidden tab)
        if not isinstance(explorer, LiveTrainer) and explorer.figure is not None:
            explorer._draw(explorer.figure)

    def _on_tab(self, change) -> None:
        try:
            self.refresh_tab(change["new"])
        except Exception as exc:  # shown in that explorer's message line, never a traceback
            self.explorers[change["new"]]._show_error(exc)

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)
