"""FormatExplorer: one number in a format, bit by bit.

What it shows for a format, a bit pattern and the number typed is computed by this module's
functions, over plain settings: ``category_of``, ``toggled``, ``bits_html``, ``readout_html`` (and
its parts ``category_note`` and ``fields_text``). FormatExplorer and ``BrowserFormatExplorer``
both call them."""

from __future__ import annotations

import html
import math
import operator

import ipywidgets as W

from ampviz.formats import ALL_FORMATS, CATEGORIES, FORMATS, get_format

from ampviz.plots import CATEGORY_COLORS, FIELD_COLORS, format_number, format_pow2, plot_value

from ampviz.widgets.base import _Explorer, _FIELD_TINTS, _parse_bits, _shows_errors, _wait_until_sent, parse_number

#: The explorer; the module's functions compute what it shows for it and its page twin
#: (``BrowserFormatExplorer``), not an API of their own.
__all__ = ["FormatExplorer"]


#: What the dropdown says beside each format beyond the course's six (those show their name alone).
NEW_FORMAT_LABELS = {
    "fp8_e4m3fnuz": "new: fp8 fnuz, NaN at 0x80",
    "fp8_e5m2fnuz": "new: fp8 fnuz, NaN at 0x80",
    "fp6_e3m2": "new: MX FP6 element",
    "fp6_e2m3": "new: MX FP6 element",
    "fp4_e2m1": "new: MX/NVFP4 element",
    "e8m0": "new: MX block scale, no sign",
}


def format_options() -> list:
    """The dropdown's (label, name) pairs: the course's formats by name, then the newer ones
    labelled so that learners see what they are, e.g. "fp4_e2m1 (new: MX/NVFP4 element)"."""
    return [(name if name in FORMATS else f"{name} ({NEW_FORMAT_LABELS.get(name, 'new')})", name)
            for name in ALL_FORMATS]


def _has_sign(fmt) -> bool:
    """Whether the format has a sign bit (E8M0, the MX scale format, has none)."""
    return fmt.specials != "fnu"


# ----- what the explorer shows, over plain settings -----
def category_of(fmt, bits: int, typed: float | None = None) -> str:
    """Category of the number ``typed`` once cast into ``fmt`` (of the stored value, pattern
    ``bits``, when none was typed)."""
    x = float(fmt.decode(bits)) if typed is None else typed
    return CATEGORIES[int(fmt.classify_codes(x))]


def toggled(fmt, bits: int, position: int) -> int:
    """The pattern ``bits`` with bit ``position`` flipped (0 is the last mantissa bit,
    ``fmt.bits - 1`` the sign); ValueError for a position the format does not have."""
    if not 0 <= position < fmt.bits:
        raise ValueError(f"{fmt.name} has bits 0 to {fmt.bits - 1}, not {position}")
    return bits ^ (1 << position)


def bits_html(fmt, bits: int) -> str:
    """The pattern's bits in their field colours, then its hex."""
    text = format(bits, f"0{fmt.bits}b")
    s = 1 if _has_sign(fmt) else 0
    parts = (text[:s], text[s : s + fmt.exponent_bits], text[s + fmt.exponent_bits :])
    spans = [
        f'<span style="color:{FIELD_COLORS[name]}">{part}</span>'
        for name, part in zip(("sign", "exponent", "mantissa"), parts) if part
    ]
    return f'<code style="font-size:1.1em">{" ".join(spans)}</code> &nbsp; = 0x{bits:0{(fmt.bits + 3) // 4}X}'


def readout_html(fmt, bits: int, typed: float | None) -> str:
    """The readout table: the number typed (``typed``, or None when the bits were set directly),
    the stored value, the rounding error, the category, the neighbours, the ulp and the fields."""
    f, stored = fmt, float(fmt.decode(bits))
    sign, exp, man = f.fields(bits)
    cat = category_of(f, bits, typed)
    rows = []
    if typed is not None:
        rows.append(("typed", repr(typed)))
    rows.append(("stored", f"{stored!r} &nbsp; ({html.escape(format_pow2(stored, digits=6))})"))
    if typed is not None:
        rows.append(("rounding error", _error_text(typed, stored)))
    rows.append(
        ("category",
         f'<b style="color:{CATEGORY_COLORS[cat]}">{cat}</b>' + category_note(f, cat, typed, stored))
    )
    below, above = f.neighbours(stored)
    rows.append(("neighbours", f"below {below!r} &nbsp; above {above!r}"))
    rows.append(("ulp here", f"{f.ulp(stored)!r}" + (
        f" &nbsp; ({html.escape(format_pow2(f.ulp(stored)))})" if math.isfinite(f.ulp(stored)) else "")))
    rows.append(("fields", fields_text(f, sign, exp, man, stored)))
    body = "".join(
        f'<tr><td style="padding-right:1em;color:#555">{k}</td><td>{v}</td></tr>' for k, v in rows
    )
    return f"<table>{body}</table>"


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


def category_note(fmt, cat: str, typed, stored: float) -> str:
    """What the readout says after the category ``cat`` (of ``typed``, or of ``stored`` when
    None) in ``fmt``: where an overflow or underflow goes, what a format without a sign or a zero
    does, what a subnormal loses."""
    f = fmt
    if cat == "overflow":
        if f.specials in ("fn", "finite"):
            return f" — beyond max, saturated to {format_number(f.max)} (no inf in {f.name})"
        if f.specials in ("fnuz", "fnu"):
            return (f" — at or beyond {format_number(f.overflow_boundary)}, becomes NaN "
                    f"(no inf in {f.name}; a saturating cast gives max {format_number(f.max)})")
        return f" — at or beyond {format_number(f.overflow_boundary)}, becomes inf"
    if cat == "underflow":
        if not _has_sign(f):
            return (f" — at most {format_pow2(f.underflow_boundary)}: {f.name} has no zero, "
                    f"becomes its smallest value {format_pow2(f.smallest_normal)}")
        return f" — at most {format_pow2(f.underflow_boundary)}, becomes 0"
    if cat == "zero" and not _has_sign(f):
        return f" — {f.name} has no zero: torch's cast gives its smallest value {format_pow2(f.smallest_normal)}"
    if cat == "normal" and not _has_sign(f) and typed is not None and typed < 0:
        return f" — {f.name} has no sign: torch's cast keeps |x|"
    if cat == "subnormal":
        return f" — below the smallest normal {format_pow2(f.smallest_normal)}: fewer significant bits"
    return ""


def fields_text(fmt, sign: int, exp: int, man: int, stored: float) -> str:
    """The readout's fields row: the sign, exponent and mantissa fields of a pattern of ``fmt``
    (``fmt.fields(bits)``) and how they make its value ``stored``."""
    f = fmt
    m, e = f.mantissa_bits, f.exponent_bits
    top = (1 << e) - 1
    exp_bits, man_bits = format(exp, f"0{e}b"), format(man, f"0{m}b") if m else ""
    if not _has_sign(f):  # E8M0: the exponent alone, every code a power of two but the NaN
        if math.isnan(stored):
            return f"exponent {exp_bits} = {exp} (all ones): NaN<br>no sign bit, no mantissa"
        return (f"exponent {exp_bits} = {exp}, {exp} − bias {f.bias} = {exp - f.bias}<br>"
                f"no sign bit, no mantissa: value 2^{exp - f.bias} = {stored!r}")
    parts = [f"sign {sign} ({'−' if sign else '+'})"]
    if math.isnan(stored) and f.specials == "fnuz":
        parts.append(f"exponent {exp_bits} and mantissa {man_bits} with sign 1: the pattern −0 would have "
                     f"is NaN in {f.name} (no −0, no inf)")
        return "<br>".join(parts)
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
    if exp == top:  # only reachable in a format without inf, where the top exponent holds numbers
        parts.append(f"({f.name} has no inf: the top exponent holds numbers)")
    if f.specials == "finite" and exp == top and man == (1 << m) - 1:
        parts.append(f"({f.name} has no NaN either: every pattern is a number)")
    return "<br>".join(parts)


# ----- formats, bit by bit -----
class FormatExplorer(_Explorer):
    """One value in one float format, bit by bit.

    Controls: a format dropdown (``format_dropdown``: every format of ``ALL_FORMATS``, the course's
    six by name and the newer ones labelled, e.g. "fp4_e2m1 (new: MX/NVFP4 element)"; E8M0 shows
    no sign bit and no mantissa), one button per bit (``bit_buttons``, showing
    "1" or "0" and coloured by field; a click flips the bit;
    most significant first: ``bit_buttons[j]`` is bit ``fmt.bits - 1 - j``, CSS class
    ``ampviz-bit-<position>``), a decimal box (``decimal_input``: the learner types 0.1, 1e-8, 65519,
    2^-24, nan ...) and a bit-pattern box (``hex_input``: 0x3C00). The readout (``readout``) shows the
    stored value, the rounding error, the neighbours and ulp, the category and the three fields.

    State: ``fmt`` (the format), ``bits`` (the stored pattern), ``value`` (``fmt.decode(bits)``),
    ``typed`` (the number typed, or None when the bits were set directly), ``category``, ``error``,
    ``figure``. Methods ``set_format``, ``set_value``, ``set_decimal``, ``set_bits``, ``toggle_bit``
    do what the controls do (and raise on bad input instead of showing a message).

    The decimal box, the readout's "typed" row and the bits agree after every change: a number
    typed stays in the box (as it was typed, "2^-24" too) and in the "typed" row, and the bits
    are its cast into the format; a new format keeps it and casts it again, as a learner who
    typed 0.1 expects to see 0.1 in fp16, bf16 and fp8 alike. Bits set directly (a click, the
    hex box) leave no typed number: the box then shows the stored value.
    """

    def __init__(self, fmt="fp16", value=1.0):
        self._init_common()
        self.fmt = get_format(fmt)
        self.typed: float | None = None
        self._typed_text: str | None = None  # the typed number as the learner wrote it
        self.bits = 0
        self._syncing = False
        self.bit_buttons: list[W.Button] = []

        self.format_dropdown = W.Dropdown(options=format_options(), value=self.fmt.name, description="format",
                                          layout=W.Layout(width="400px"))  # the new formats' labels fit
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
        self.view.add_class("ampviz-format-figure")

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
                self.view,
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
        return category_of(self.fmt, self.bits, self.typed)

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
        self.typed, self._typed_text = x, repr(x)
        self.refresh()

    def set_decimal(self, text) -> None:
        """Store the number typed as ``text`` ("0.1", "1e-8", "2^-24", "nan")."""
        x = parse_number(text)
        self.bits = int(self.fmt.encode(x))
        self.typed, self._typed_text = x, str(text).strip()
        self.refresh()

    def set_bits(self, bits) -> None:
        """Store the bit pattern ``bits`` (an integer in 0 .. 2**fmt.bits - 1)."""
        bits = operator.index(bits)  # TypeError for anything but an integer
        self.fmt.fields(bits)  # a clear ValueError when out of range
        self.bits = bits
        self.typed = self._typed_text = None
        self.refresh()

    def toggle_bit(self, position: int) -> None:
        """Flip bit ``position`` (0 is the last mantissa bit, ``fmt.bits - 1`` the sign)."""
        self.set_bits(toggled(self.fmt, self.bits, position))

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
        if position == self.fmt.bits - 1 and _has_sign(self.fmt):
            return "sign"
        return "exponent" if position >= m else "mantissa"

    def _build_bit_buttons(self) -> None:
        for b in self.bit_buttons:
            b.on_click(self._on_bit, remove=True)
            b.close()
        buttons = []
        # 32 buttons of 22 px fit on one line of a notebook (736 px with their gaps); 16 of 32 px
        # buttons shrink down to `least` on a narrow page, so the row stays one line (fp32 at 368 px)
        size, least = ("32px", "20px") if self.fmt.bits <= 16 else ("22px", "10px")
        for j in range(self.fmt.bits):
            position = self.fmt.bits - 1 - j
            field = self._field_of(position)
            b = W.Button(
                description="0",
                tooltip=f"bit {position} ({field})",
                layout=W.Layout(width="auto", flex=f"1 1 {least}", min_width=least, max_width=size, height="30px",
                                padding="0", margin="1px" if size == "32px" else "0 1px 0 0"),
            )
            if self.fmt.bits > 16:
                b.style.font_size = "11px"
            b.add_class(f"ampviz-bit-{position}")
            b.add_class(f"ampviz-bit-{field}")
            b.on_click(self._on_bit)
            buttons.append(b)
        self.bit_buttons = buttons
        self.bits_row.children = tuple(buttons)
        f = self.fmt
        sign = (f'<span style="color:{FIELD_COLORS["sign"]}">■ sign (1 bit)</span>' if _has_sign(f)
                else '<span style="color:#777">no sign bit</span>')
        mantissa = (f'<span style="color:{FIELD_COLORS["mantissa"]}">■ mantissa ({f.mantissa_bits} bits)</span>'
                    if f.mantissa_bits else '<span style="color:#777">no mantissa</span>')
        self.field_legend.value = (
            f"{sign} &nbsp; "
            f'<span style="color:{FIELD_COLORS["exponent"]}">■ exponent ({f.exponent_bits} bits, '
            f"bias {f.bias})</span> &nbsp; {mantissa}"
            f" &nbsp; <i>{html.escape(f.description)}</i>"
        )

    def refresh(self, decimal_text: str | None = None) -> None:
        """Bring every control, the readout and the figure in line with the state. The decimal box
        shows ``decimal_text`` when given, else the typed number as it was typed, else (bits set
        directly) the stored value."""
        f, bits, stored = self.fmt, self.bits, self.value
        # the figure first: its message leaves before the controls' and the readouts', and the
        # browser starts plotly's draw, the slow part of a repaint, while they are on their way;
        # it leaves now, not once the controls are done: the kernel's IOPub thread needs the GIL
        # to send it, which they would hold (5-10 ms in Voila, measured in the kernel)
        self._draw(plot_value(f, stored, typed=self.typed))
        _wait_until_sent()
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
            if decimal_text is None:
                decimal_text = self._typed_text if self.typed is not None else repr(stored)
            self.decimal_input.value = decimal_text
        finally:
            self._syncing = False
        self.bits_readout.value = bits_html(f, bits)
        self.readout.value = readout_html(f, bits, self.typed)
        self._clear_error()
