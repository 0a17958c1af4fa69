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

import numpy as np

import ipywidgets as W
from IPython.display import clear_output, display

from ampviz import scaling, synth
from ampviz.census import Profile, census, profile, underflow_fractions
from ampviz.formats import CATEGORIES, FORMATS, get_format
from ampviz.plots import (
    BAND_CATEGORIES,
    CATEGORY_COLORS,
    FIELD_COLORS,
    census_x_range,
    format_number,
    format_pow2,
    format_share,
    plot_census,
    plot_scale_trace,
    plot_value,
)

__all__ = ["FormatExplorer", "RangeExplorer", "ScalerLab", "parse_number"]

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
        k = int(m.group(2))
        try:
            v = math.ldexp(1.0, k)
        except OverflowError:
            v = math.inf
        return -v if m.group(1) == "-" else v
    try:
        return float(s)
    except ValueError:
        raise ValueError(
            f"could not read {s!r} as a number: type a decimal such as 0.1, 1e-8 or 65519, "
            "a power of two such as 2^-24, or inf / nan"
        ) from None


def _parse_bits(text) -> int:
    """A bit pattern typed as hex ("0x3C00"), binary ("0b0011110000000000") or decimal."""
    s = str(text).strip().replace("_", "").replace(" ", "")
    if not s:
        raise ValueError("type a bit pattern, e.g. 0x3C00 or 0b0011110000000000")
    try:
        return int(s, 0) if s[:2].lower() in ("0x", "0b", "0o") else int(s, 16)
    except ValueError:
        raise ValueError(f"could not read {str(text).strip()!r} as a bit pattern: type hex such as 0x3C00") from None


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
        with self.output:
            clear_output(wait=True)
            try:
                display(fig)
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

        lo, hi = min(log2_scale_range[0], int(log2_scale)), max(log2_scale_range[1], int(log2_scale))
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
    gradient stream, from ``ampviz.synth``), ``overlay`` (other frameworks' scalers from
    ``ampviz.scaling.PRESETS`` to run on the same stream). Your settings run as
    ``torch.amp.GradScaler`` would (``TorchGradScaler``).

    State: ``stream`` (per-step max |gradient|), ``traces`` (``ScalerTrace`` per scaler, yours
    first), ``lost`` (steps and share of ``gradients`` lost to fp16 underflow at your scale),
    ``figure``, ``error``. Invalid settings (growth <= 1, backoff outside (0, 1), interval < 1)
    show a message and keep the last good figure.
    """

    def __init__(self, steps=100_000, *, scenario="spikes", strength=0.5, gradients=None, seed=0,
                 init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 overlay=()):
        self._init_common()
        self.steps = int(steps)
        self.seed = int(seed)
        self._streams: dict = {}
        self._lost_cache: dict = {}
        self.traces: list = []
        self.lost = None
        if gradients is None:  # a fixed sample spread over ~25 binades below its largest value,
            rng = np.random.default_rng(self.seed)  # as real gradients are (notebook 02)
            gradients = np.exp2(-np.abs(rng.normal(0.0, 8.0, 20_000))).astype(np.float32)
        g = np.abs(np.asarray(gradients, dtype=np.float32).ravel())
        self._grad_shape = g / g.max() if g.size and g.max() > 0 else g

        style = {"description_width": "110px"}
        wide = W.Layout(width="420px")
        self.init_slider = W.IntSlider(value=int(round(math.log2(init_scale))), min=-10, max=40,
                                       description="log2 init_scale", style=style, layout=wide)
        self.growth_slider = W.FloatSlider(value=growth_factor, min=1.0, max=4.0, step=0.001,
                                           readout_format=".3f", description="growth_factor",
                                           style=style, layout=wide)
        self.backoff_slider = W.FloatSlider(value=backoff_factor, min=0.0, max=1.0, step=0.005,
                                            readout_format=".3f", description="backoff_factor",
                                            style=style, layout=wide)
        self.interval_input = W.BoundedIntText(value=growth_interval, min=0, max=10**7,
                                               description="growth_interval", style=style)
        self.scenario_dropdown = W.Dropdown(options=list(synth.SCENARIOS), value=scenario,
                                            description="scenario", style=style)
        self.strength_slider = W.FloatSlider(value=strength, min=0.0, max=1.0, step=0.05,
                                             description="strength", style=style, layout=wide)
        others = [name for name in scaling.PRESETS if name != "torch"]
        self.overlay = W.SelectMultiple(options=others, value=tuple(overlay), rows=min(6, max(len(others), 1)),
                                        description="compare with", style=style)
        for w, cls in ((self.init_slider, "init"), (self.growth_slider, "growth"),
                       (self.backoff_slider, "backoff"), (self.interval_input, "interval"),
                       (self.scenario_dropdown, "scenario"), (self.strength_slider, "strength"),
                       (self.overlay, "overlay")):
            w.add_class(f"ampviz-scaler-{cls}")
            w.observe(self._on_change, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-scaler-readout")
        self.output.add_class("ampviz-scaler-figure")
        self.ui = W.VBox([
            W.HBox([W.VBox([self.init_slider, self.growth_slider, self.backoff_slider, self.interval_input]),
                    W.VBox([self.scenario_dropdown, self.strength_slider, self.overlay])],
                   layout=W.Layout(flex_flow="row wrap")),
            self.message, self.readout, self.output,
        ])
        self.ui.add_class("ampviz-scaler-lab")
        self.update()

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
        self.traces = [scaling.simulate(p, grad_max=g)
                       for p in [mine, *(scaling.PRESETS[name] for name in self.overlay.value)]]
        self.lost = self._lost_share(self.traces[0], self._typical_max(g))
        self.readout.value = self._readout_html()
        self._clear_error()
        self._draw(plot_scale_trace(self.traces, lost={"your settings": self.lost},
                                    title=f"{self.scenario_dropdown.value} gradients "
                                          f"(strength {self.strength_slider.value:g}), {self.steps:,} steps"))

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
            end = "stopped at step {:,}".format(t.stopped_at) if t.stopped_at is not None \
                else format_number(float(t.final.scale))
            rows.append(f"<tr><td>{html.escape(t.policy.name)}</td><td>{t.skipped_count:,}</td>"
                        f"<td>{end}</td><td>{low}</td></tr>")
        head = "<tr><th>scaler</th><th>skipped steps</th><th>final scale</th><th>lowest scale</th></tr>"
        return f"<table>{head}{''.join(rows)}</table>"
