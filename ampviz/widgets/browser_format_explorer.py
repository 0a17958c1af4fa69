"""BrowserFormatExplorer: FormatExplorer computed in the browser, with no kernel round trip per move.

The page casts and decodes (``js/formats.mjs``) and writes the readout and draws the figure
FormatExplorer shows (``js/valueplot.mjs``: ``plot_value``, the readout table, ``parse_number``,
bit for bit with the package), so a click on a bit, a number typed or a drag of the slider over
the format's bit patterns repaints at once. Python holds the settings as synced state: ``fmt``
(the format's name), ``bits`` (the stored pattern) and ``typed`` (the number as the learner typed
it, "2^-24" too, or None when the bits were set directly); ``value``, ``category``,
``readout_html()``, ``bits_html()`` and ``figure()`` compute, with the package and the functions
FormatExplorer shows them with (``format_explorer``'s ``category_of``, ``readout_html``,
``bits_html``, ``toggled``), what the page shows for them.

The same front end runs on a static page with no kernel: it needs only the state.
"""

from __future__ import annotations

import math
import operator

import traitlets

from ampviz.formats import ALL_FORMATS, get_format
from ampviz.plots import plot_value
from ampviz.widgets.base import parse_number
from ampviz.widgets.browser_base import _PageExplorer
from ampviz.widgets.format_explorer import bits_html, category_of, format_options, readout_html, toggled

__all__ = ["BrowserFormatExplorer"]


def _builtin(fmt):
    """The built-in format ``fmt`` names (get_format's names, dtypes and errors): the page computes
    those twelve (``js/formats.mjs``), and FormatExplorer's dropdown holds no other."""
    f = get_format(fmt)
    if ALL_FORMATS.get(f.name) != f:
        raise ValueError(f"BrowserFormatExplorer computes the built-in formats only ({', '.join(ALL_FORMATS)}); "
                         f"got {f!r}")
    return ALL_FORMATS[f.name]


def _typed_text(x: float) -> str:
    """A number set from Python as the typed text: its repr, which parse_number reads back exactly
    (a negative NaN as "-nan": its sign bit reaches the bits, as FormatExplorer's cast keeps it)."""
    return "-nan" if math.isnan(x) and math.copysign(1.0, x) < 0 else repr(x)


class BrowserFormatExplorer(_PageExplorer):
    """FormatExplorer's controls, readout and figure, computed by the page (see the module's docstring).

    ``BrowserFormatExplorer(fmt="fp16", value=1.0)`` takes FormatExplorer's arguments (and raises
    its errors). The page has a format dropdown, one button per bit (a click flips it), a decimal
    box, a bit-pattern box and a slider over the bit patterns: 0 to 2^bits - 1 for a format of at
    most 16 bits; for fp32 and tf32 the slider walks the top 16 bits (the low bits 0: in fp32, the
    bf16 values), and the buttons and the boxes reach every pattern.

    The settings keep FormatExplorer's rules, from the page or from Python: a new ``fmt`` keeps the
    typed number (or the stored value) and casts it again; a ``typed`` text sets the bits to its
    cast; ``bits`` set directly leave no typed number. ``set_format``, ``set_value``,
    ``set_decimal``, ``set_bits`` and ``toggle_bit`` do what FormatExplorer's do.
    """

    FRONT_END = "format_explorer_view"

    fmt = traitlets.Unicode("fp16").tag(sync=True)
    bits = traitlets.Int(0).tag(sync=True)
    typed = traitlets.Unicode(None, allow_none=True).tag(sync=True)
    #: The dropdown's formats, in ALL_FORMATS' order: {name, label (as format_options), description}.
    formats = traitlets.List(read_only=True).tag(sync=True)

    _coupling = False  # True while one setting brings the others in line

    def __init__(self, fmt="fp16", value=1.0):
        f = _builtin(fmt)
        x = float(value)  # FormatExplorer's set_value: float()'s errors
        super().__init__()
        self.set_trait("formats", [{"name": name, "label": label, "description": ALL_FORMATS[name].description}
                                   for label, name in format_options()])
        self._coupling = True
        try:
            with self.hold_sync():
                self.fmt = f.name
                self.typed = _typed_text(x)
                self.bits = int(f.encode(x))
        finally:
            self._coupling = False

    # ----- every setting checked, in FormatExplorer's words -----
    @traitlets.validate("fmt")
    def _valid_fmt(self, proposal):
        try:
            return _builtin(proposal["value"]).name
        except (TypeError, ValueError) as e:
            raise traitlets.TraitError(str(e)) from None

    @traitlets.validate("bits")
    def _valid_bits(self, proposal):
        v = proposal["value"]
        try:
            self._format.fields(v)  # FormatExplorer.set_bits's check
        except (TypeError, ValueError) as e:
            raise traitlets.TraitError(str(e)) from None
        return int(v)

    @traitlets.validate("typed")
    def _valid_typed(self, proposal):
        v = proposal["value"]
        if v is None:
            return None
        try:
            parse_number(v)
        except ValueError as e:
            raise traitlets.TraitError(str(e)) from None
        return v.strip()

    def notify_change(self, change):
        """A setting changed from Python: the others follow as FormatExplorer's actions have them,
        and the page receives all of them in one message. The page sends them in line already."""
        name = change.get("name")
        if (name in ("fmt", "bits", "typed") and change.get("type") == "change" and not self._coupling
                and name not in (getattr(self, "_property_lock", None) or {})):
            self._coupling = True
            try:
                with self.hold_sync():
                    self._follow(name, change["old"])
                    super().notify_change(change)
            finally:
                self._coupling = False
            return
        super().notify_change(change)

    def _follow(self, name: str, old) -> None:
        if name == "fmt":  # FormatExplorer.set_format: the typed number, or the stored value, cast again
            x = self.typed_value if self.typed is not None else float(_builtin(old).decode(self.bits))
            self.bits = int(self._format.encode(x))
        elif name == "typed":
            if self.typed is not None:
                self.bits = int(self._format.encode(parse_number(self.typed)))
        else:  # bits set directly leave no typed number
            self.typed = None

    # ----- actions (FormatExplorer's) -----
    def set_format(self, fmt) -> None:
        """Switch format, keeping the typed number (or the stored value) and casting it again."""
        self.fmt = _builtin(fmt).name

    def set_value(self, x) -> None:
        """Store the number ``x`` (rounded into the format as a cast does)."""
        self.typed = _typed_text(float(x))

    def set_decimal(self, text) -> None:
        """Store the number typed as ``text`` ("0.1", "1e-8", "2^-24", "nan")."""
        parse_number(text)
        self.typed = str(text).strip()

    def set_bits(self, bits) -> None:
        """Store the bit pattern ``bits`` (an integer in 0 .. 2**bits - 1)."""
        bits = operator.index(bits)  # TypeError for anything but an integer
        self._format.fields(bits)  # a clear ValueError when out of range
        with self.hold_sync():
            self.typed = None
            self.bits = bits

    def toggle_bit(self, position: int) -> None:
        """Flip bit ``position`` (0 is the last mantissa bit, ``bits - 1`` the sign)."""
        self.set_bits(toggled(self._format, self.bits, position))

    # ----- what the page shows, computed by the package -----
    @property
    def _format(self):
        return ALL_FORMATS[self.fmt]

    @property
    def typed_value(self) -> float | None:
        """The number typed (``parse_number(typed)``), or None."""
        return None if self.typed is None else parse_number(self.typed)

    @property
    def value(self) -> float:
        """The stored value: ``fmt.decode(bits)``."""
        return float(self._format.decode(self.bits))

    @property
    def category(self) -> str:
        """Category of the typed number once cast (of the stored value when none was typed)."""
        return category_of(self._format, self.bits, self.typed_value)

    @property
    def decimal_text(self) -> str:
        """What the decimal box shows: the number as typed, else the stored value's repr."""
        return self.typed if self.typed is not None else repr(self.value)

    @property
    def hex_text(self) -> str:
        """What the bit-pattern box shows: "0x3C00"."""
        return f"0x{self.bits:0{(self._format.bits + 3) // 4}X}"

    def readout_html(self) -> str:
        """The readout table, as FormatExplorer writes it."""
        return readout_html(self._format, self.bits, self.typed_value)

    def bits_html(self) -> str:
        """The bits in their field colours and the hex pattern, as FormatExplorer writes them."""
        return bits_html(self._format, self.bits)

    def figure(self):
        """The figure the page draws, as FormatExplorer draws it."""
        return plot_value(self._format, self.value, typed=self.typed_value)
