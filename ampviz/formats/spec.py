"""The ``FloatFormat`` dataclass: a binary floating-point format described by its exponent bits,
mantissa bits, bias and the use of its top exponent ("ieee" or "fn"), with its constants (``max``,
``eps``, ``smallest_subnormal``, ...), torch's cast (``quantize``), ``classify`` into
``CATEGORIES``, bit patterns (``fields``, ``encode``, ``decode``), ``neighbours`` and ``ulp``.

A newcomer who wants to know how a value is rounded into a format, or how its bits are laid out,
reads this file; the formats with other layouts (fnuz, finite, E8M0) are in
``ampviz.formats.beyond_ieee``, and the built-in formats (``FP16``, ``BF16``, ...) in
``ampviz.formats.catalog``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from ampviz.formats.inputs import _as_float32_values, _describe, _real_array, _scalar_or_array

#: The categories ``classify`` (and ``ampviz.formats.census``) sort values into, in this order.
CATEGORIES = ("zero", "underflow", "subnormal", "normal", "overflow", "nan")
#: What ``FloatFormat.quantize(x, overflow=...)`` can make of a value beyond the range (None: torch's cast).
OVERFLOW_RULES = (None, "saturate", "nan", "inf")
ZERO, UNDERFLOW, SUBNORMAL, NORMAL, OVERFLOW, NAN = range(6)
_CATEGORY_NAMES = np.array(CATEGORIES)


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exponent_bits``, ``mantissa_bits``."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: str = "ieee"  # "ieee" (inf + NaN, overflow -> inf) or "fn" (no inf, saturating cast)
    torch_dtype: str | None = None  # name of the matching torch dtype, if torch has one
    description: str = ""
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string such as 'fp16', got {_describe(self.name)}")
        if not self.name.strip():
            raise ValueError("name must not be empty: pass a name such as 'fp16'")
        for field_name in ("exponent_bits", "mantissa_bits", "bias"):
            value = getattr(self, field_name)
            if not isinstance(value, (numbers.Integral, np.integer)) or isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{field_name} must be an int, got {_describe(value)}")
            object.__setattr__(self, field_name, int(value))  # numpy ints become plain ints
        if self.torch_dtype is not None and not isinstance(self.torch_dtype, str):
            raise TypeError(f"torch_dtype must be a dtype name such as 'float16', or None; "
                            f"got {_describe(self.torch_dtype)}")
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string, got {_describe(self.description)}")
        self._check_layout()

    def _check_layout(self):
        """Check specials, exponent_bits, mantissa_bits and bias together (a subclass with other
        specials checks its own)."""
        if not isinstance(self.specials, str) or self.specials not in ("ieee", "fn"):
            raise ValueError(f"specials must be 'ieee' or 'fn', not {_describe(self.specials)} (NaN at the -0 "
                             "pattern: FnuzFormat; no NaN: FiniteFormat; unsigned powers of two: E8M0Format)")
        e, m = self.exponent_bits, self.mantissa_bits
        # "ieee" needs one exponent for subnormals, one for inf/NaN and one for normals; "fn" keeps
        # its top exponent for normals (all but the NaN pattern).
        least_e = 2 if self.specials == "ieee" else 1
        if not least_e <= e <= 8:
            raise ValueError(f"exponent_bits must be {least_e} to 8 for a {self.specials!r} format, got {e}")
        # NaN needs a nonzero mantissa ("ieee"), or the all-ones one beside a finite max ("fn");
        # values are computed through float32, so at most its 23 bits.
        if not 1 <= m <= 23:
            raise ValueError(f"mantissa_bits must be 1 to 23, got {m}")
        # Every value must be a float32 value (quantize rounds through float32, as torch does):
        # emax <= 127 and smallest_subnormal = 2**(1 - bias - m) >= 2**-149.
        top = (1 << e) - (2 if self.specials == "ieee" else 1)  # the largest normal exponent field
        low, high = top - 127, 150 - m
        if low > high:
            raise ValueError(f"a {self.specials!r} format with {e} exponent bits and {m} mantissa bits does "
                             f"not fit in float32: use fewer bits")
        if not low <= self.bias <= high:
            raise ValueError(f"bias must be {low} to {high} for {e} exponent and {m} mantissa bits (every "
                             f"value must fit in float32), got {self.bias}")

    # ----- constants (names as in numpy.finfo) -----
    @property
    def bits(self) -> int:
        """Total width of a bit pattern."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = (1 << self.exponent_bits) - 1
        return (top - 1 if self.specials == "ieee" else top) - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        m = self.mantissa_bits
        # "fn" formats lose the all-ones mantissa of the top exponent to NaN.
        frac = 2.0 - 2.0 ** (-m) if self.specials == "ieee" else 2.0 - 2.0 ** (1 - m)
        return float(np.ldexp(frac, self.emax))

    @property
    def smallest_normal(self) -> float:
        return float(np.ldexp(1.0, self.emin))

    @property
    def smallest_subnormal(self) -> float:
        return float(np.ldexp(1.0, self.emin - self.mantissa_bits))

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        return float(np.ldexp(1.0, -self.mantissa_bits))

    @property
    def overflow_boundary(self) -> float:
        """max + half an ulp: where casts start to overflow (65520 for fp16, 464 for fp8 E4M3).

        In an "ieee" format the boundary itself overflows (a tie between max, whose mantissa is odd,
        and 2**(emax+1)); in an "fn" format the tie goes to max (even) and only larger values
        saturate.
        """
        return self.max + float(np.ldexp(1.0, self.emax - self.mantissa_bits - 1))

    @property
    def underflow_boundary(self) -> float:
        """Half the smallest subnormal: this value and anything smaller in magnitude becomes 0."""
        return float(np.ldexp(1.0, self.emin - self.mantissa_bits - 1))

    # ----- rounding -----
    def _round_magnitude(self, a: np.ndarray) -> np.ndarray:
        """Round finite magnitudes a >= 0 to the format's grid, ignoring the top of the range."""
        m = self.mantissa_bits
        _, e = np.frexp(a)  # a = f * 2**e with f in [0.5, 1)
        e = np.maximum(e - 1, self.emin) - m  # exponent of one ulp at a
        return np.ldexp(np.rint(np.ldexp(a, -e)), e)  # np.rint rounds ties to even

    def _quantize_with_codes(self, x) -> tuple[np.ndarray, np.ndarray]:
        """Quantized values and category codes of x."""
        x, x32 = _as_float32_values(x)
        a = np.abs(x32)
        finite = np.isfinite(a)
        q = self._round_magnitude(np.where(finite, a, 0.0))
        over = (q > self.max) | np.isinf(a)
        with np.errstate(invalid="ignore"):
            q = np.where(over, self.max if self.specials == "fn" else np.inf, q)
        isnan = np.isnan(a)
        q = np.where(isnan, np.nan, q)
        codes = np.full(a.shape, NORMAL, dtype=np.int8)
        codes[q < self.smallest_normal] = SUBNORMAL
        codes[q == 0] = UNDERFLOW
        codes[x == 0] = ZERO  # (a tiny float64 that float32 flushes is underflow, not zero)
        codes[over] = OVERFLOW
        codes[isnan] = NAN
        return np.copysign(q, x32), codes

    def quantize(self, x, overflow=None):
        """x rounded into this format exactly as torch's cast does, as float64.

        ``overflow`` says what a value beyond the format's range becomes (a finite value that
        rounds past ``max``, or ±inf; NaN stays NaN in every case). None: what torch 2.13's CPU cast
        does, the course's convention (inf in an "ieee" format; ±max in an "fn" format, torch >= 2.12).
        The casts of other libraries, for comparison: "saturate" gives ±max (for finite values, what
        CUDA's fp8 conversions with ``__NV_SATFINITE`` do, as Transformer Engine's kernels use them,
        in E5M2 too; for ±inf, what torch's E4M3 cast does); "nan" gives NaN (ml_dtypes' E4M3, and
        torch's before 2.12); "inf" gives ±inf (an "ieee" format only).
        """
        if not (overflow is None or isinstance(overflow, str)) or overflow not in OVERFLOW_RULES:
            raise ValueError(f"overflow must be one of None, {', '.join(repr(r) for r in OVERFLOW_RULES if r)}, "
                             f"not {_describe(overflow)}")
        if overflow == "inf" and self.specials != "ieee":
            raise ValueError(f"{self.name} has no inf: overflow='inf' needs an 'ieee' format; use 'saturate' or 'nan'")
        q, codes = self._quantize_with_codes(x)
        if overflow is not None:
            over = codes == OVERFLOW
            fill = {"saturate": self.max, "nan": np.nan, "inf": np.inf}[overflow]
            with np.errstate(invalid="ignore"):
                q = np.where(over, np.copysign(fill, q), q)
        return _scalar_or_array(q)

    def classify(self, x):
        """Category of each value of x once cast: one of ``CATEGORIES``.

        ``underflow`` is a nonzero value that becomes 0; ``overflow`` becomes inf (or saturates to
        ``max`` in an "fn" format). Inf itself counts as overflow, as it does for a loss scaler.
        """
        _, codes = self._quantize_with_codes(x)
        return _scalar_or_array(_CATEGORY_NAMES[codes])

    def classify_codes(self, x) -> np.ndarray:
        """Like ``classify`` but as int8 indices into ``CATEGORIES``."""
        return self._quantize_with_codes(x)[1]

    # ----- bit patterns -----
    def _check_bits(self, bits) -> np.ndarray:
        """Bit patterns as int64, with one clear error for anything that is not one."""
        top = (1 << self.bits) - 1
        need = f"{self.name} bit patterns are whole numbers from 0 to {top} (0x{top:X})"
        try:
            arr = _real_array(bits, f"{self.name} bit patterns")
        except TypeError:
            raise TypeError(f"{need}, got {_describe(bits)}") from None
        if arr.dtype.kind == "b":
            raise TypeError(f"{need}, not booleans")
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float64)  # (float16 cannot hold the top pattern of 16 bits)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 0) | (arr > top)
        else:
            bad = (arr < 0) | (arr > top)
        if np.any(bad):
            first = arr[bad].ravel()[0].item()
            if isinstance(first, float) and first.is_integer() and abs(first) < 2.0**64:
                first = int(first)
            raise ValueError(f"{self.name} bit patterns have {self.bits} bits: 0 to {top} (0x{top:X}); "
                             f"got {first}")
        return arr.astype(np.int64)

    def fields(self, bits) -> tuple:
        """(sign, exponent field, mantissa field) of bit patterns, as integers."""
        arr = self._check_bits(bits)
        m, e = self.mantissa_bits, self.exponent_bits
        sign = arr >> (m + e)
        exp = (arr >> m) & ((1 << e) - 1)
        man = arr & ((1 << m) - 1)
        if arr.ndim == 0:
            return int(sign), int(exp), int(man)
        return sign, exp, man

    def decode(self, bits):
        """Value of each bit pattern, as float64."""
        sign, exp, man = (np.asarray(f) for f in self.fields(self._check_bits(bits)))
        m = self.mantissa_bits
        top = (1 << self.exponent_bits) - 1
        normal = np.ldexp((man + (1 << m)).astype(np.float64), exp - self.bias - m)
        sub = np.ldexp(man.astype(np.float64), self.emin - m)
        val = np.where(exp == 0, sub, normal)
        if self.specials == "ieee":
            val = np.where(exp == top, np.where(man == 0, np.inf, np.nan), val)
        else:
            val = np.where((exp == top) & (man == (1 << m) - 1), np.nan, val)
        val = np.where(sign == 1, -val, val)
        return _scalar_or_array(val)

    @property
    def nan_bits(self) -> int:
        """The (positive) NaN pattern ``encode`` writes: quiet NaN, or S.1111.111 in "fn" formats."""
        m = self.mantissa_bits
        top = (1 << self.exponent_bits) - 1
        if self.specials == "fn":
            return (top << m) | ((1 << m) - 1)
        return (top << m) | (1 << (m - 1))

    def encode(self, x):
        """Bit pattern of each value of x once cast (a NaN becomes ``nan_bits`` with x's sign)."""
        q, codes = self._quantize_with_codes(x)
        m = self.mantissa_bits
        a = np.abs(q)
        finite = np.isfinite(a)
        a0 = np.where(finite, a, 1.0)
        _, e = np.frexp(a0)
        e = e - 1
        normal = a0 >= self.smallest_normal
        exp_field = np.where(normal, e + self.bias, 0)
        man_field = np.where(
            normal,
            np.ldexp(a0, m - e) - (1 << m),
            np.ldexp(a0, m - self.emin),
        ).astype(np.int64)
        top = (1 << self.exponent_bits) - 1
        bits = (exp_field.astype(np.int64) << m) | man_field
        bits = np.where(a == 0, 0, bits)
        bits = np.where(np.isinf(a), top << m, bits)
        bits = np.where(codes == NAN, self.nan_bits, bits)
        bits = bits | (np.signbit(q).astype(np.int64) << (self.bits - 1))
        return _scalar_or_array(bits)

    # ----- neighbours -----
    def _one_value(self, x, what: str) -> float:
        """The stored value of x, which must be one number."""
        arr = _real_array(x)
        if arr.size != 1:
            raise TypeError(f"{what} takes one number, got {arr.size} values (shape {arr.shape}); "
                            f"pass a single number, e.g. {self.name}.{what}(1.0)")
        return float(self.quantize(arr.reshape(())))

    def neighbours(self, x) -> tuple[float, float]:
        """The representable values just below and above the stored value of scalar x.

        At the ends of the range the missing neighbour is -inf/inf in an "ieee" format and NaN
        (nothing there) in an "fn" format.
        """
        q = self._one_value(x, "neighbours")
        if np.isnan(q):
            return (float("nan"), float("nan"))
        if np.isinf(q):
            return (self.max, q) if q > 0 else (q, -self.max)
        mag_bits = int(self.encode(abs(q)))
        beyond = np.inf if self.specials == "ieee" else np.nan
        up = self.decode(mag_bits + 1) if abs(q) < self.max else beyond
        down = self.decode(mag_bits - 1) if mag_bits > 0 else -self.smallest_subnormal
        if q > 0 or (q == 0 and not np.signbit(q)):
            return float(down), float(up)
        return float(-up), float(-down)

    def ulp(self, x) -> float:
        """Spacing of the format's grid at |x| (the rounding step there)."""
        a = abs(self._one_value(x, "ulp"))
        if not np.isfinite(a):
            return float("nan")
        e = int(np.frexp(a)[1]) - 1 if a > 0 else self.emin
        return float(np.ldexp(1.0, max(e, self.emin) - self.mantissa_bits))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name}: {self.exponent_bits} exponent bits, "
            f"{self.mantissa_bits} mantissa bits, bias {self.bias}, max {self.max:g})"
        )
