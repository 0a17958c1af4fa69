"""Numbers as text, as the figures and explorers write them: "65504", "2^-24 ≈ 5.96e-08",
"(2 - 2^-10)·2^15 = 65504", shares as "<0.01%" or ">99.9%", and a census's shares on one line."""

from __future__ import annotations

import math

from ampviz.formats.census import CensusResult
from ampviz.formats import CATEGORIES
from ampviz.plots.arguments import _census_result
from ampviz.plots.style import BAND_CATEGORIES


def format_number(x, digits: int = 3) -> str:
    """x as short text: whole numbers below 10^7 in full ("65504"), others with ``digits``
    significant digits ("5.96e-08"); "inf", "-inf", "nan" for the specials."""
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e7:
        return ("-" if math.copysign(1.0, x) < 0 else "") + str(abs(int(x)))
    return f"{x:.{digits}g}"


def format_pow2(x, digits: int = 3) -> str:
    """x as a power of two and a decimal: "2^-24 ≈ 5.96e-08", "2^0 = 1",
    "(2 - 2^-10)·2^15 = 65504" (the shape of a format's max), otherwise "0.1 ≈ 2^-3.32".

    "=" when the decimal is exact, "≈" when it is rounded to ``digits`` significant digits.
    """
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return format_number(x)
    sign = "-" if x < 0 else ""
    a = abs(x)
    dec = format_number(a, digits)
    rel = "=" if float(dec) == a else "≈"
    frac, e = math.frexp(a)  # a = frac * 2**e, frac in [0.5, 1)
    if frac == 0.5:
        return f"{sign}2^{e - 1} {rel} {sign}{dec}"
    dfrac, de = math.frexp(2.0 - 2.0 * frac)  # 2 - (significand in [1, 2))
    if dfrac == 0.5 and de - 1 <= -2:
        return f"{sign}(2 - 2^{de - 1})·2^{e - 1} {rel} {sign}{dec}"
    log2 = math.log2(a)
    shown = f"{log2:.2f}" if abs(log2) >= 0.005 else f"{log2:.2g}"  # never "2^0.00" for a number that is not 1
    return f"{sign}{dec} ≈ {sign}2^{shown}"


def _power_text(p: float) -> str:
    """A power of two as a tick label: a short exact decimal ("4", "2048", "0.125") when there is
    one, else "2^-7" (never the rounded "0.00781")."""
    text = format_number(p, 17)
    return text if len(text) <= 6 and float(text) == p else _pow2_short(p)


def _pow2_short(x) -> str:
    """"2^-24" for a power of two, else the short decimal ("65504", "3.39e+38")."""
    frac, e = math.frexp(float(x))
    return f"2^{e - 1}" if frac == 0.5 else format_number(x)


def format_share(fraction) -> str:
    """A share as a percentage with 3 significant digits; never rounds a nonzero share to 0% or
    a share below one to 100% ("<0.01%", ">99.9%")."""
    fraction = float(fraction)
    if fraction <= 0:
        return "0%"
    if fraction >= 1:
        return "100%"
    pct = 100.0 * fraction
    if pct < 0.01:
        return "<0.01%"
    text = f"{pct:.3g}"
    return ">99.9%" if float(text) >= 100 else f"{text}%"


def format_shares(result: CensusResult) -> str:
    """The shares of a census as one line: "underflow 31.2% · subnormal 4.1% · normal 64.7% ·
    overflow 0%", with zero and nan added only when the census has some."""
    _census_result(result)
    shown = [k for k in CATEGORIES if k in BAND_CATEGORIES or result.counts[k]]
    return " · ".join(f"{k} {format_share(result.fractions[k])}" for k in shown)
