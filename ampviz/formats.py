"""Float formats, bit for bit: fp32, tf32, fp16, bf16 and the two fp8 formats.

Every format here is described by three numbers (exponent bits, mantissa bits, bias) and one
choice about its top exponent:

* ``"ieee"``: the all-ones exponent is reserved for inf and NaN, and a cast that overflows gives
  inf (fp32, tf32, fp16, bf16, fp8 E5M2);
* ``"fn"`` ("finite, NaN"): no inf; only the all-ones pattern S.1111.111 is NaN, and a cast
  saturates to the largest finite value, as ``torch``'s cast to ``float8_e4m3fn`` does on this stack
  (500, 1e6 and even inf all become 448).

``quantize`` reproduces ``torch``'s casts exactly: float64 input is first rounded to float32 (torch
casts float64 to float16 through float32 too, so 65519.99999 becomes inf), then rounded to nearest,
ties to even, into the format. Results are float64, which holds every value of every format here
exactly.

This module needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "FloatFormat",
    "FP32",
    "TF32",
    "FP16",
    "BF16",
    "FP8_E4M3",
    "FP8_E5M2",
    "FORMATS",
    "CATEGORIES",
    "get_format",
]

#: The categories ``classify`` (and ``ampviz.census``) sort values into, in this order.
CATEGORIES = ("zero", "underflow", "subnormal", "normal", "overflow", "nan")
ZERO, UNDERFLOW, SUBNORMAL, NORMAL, OVERFLOW, NAN = range(6)
_CATEGORY_NAMES = np.array(CATEGORIES)


def _as_float32_values(x) -> tuple[np.ndarray, np.ndarray]:
    """(x as an array, x rounded to float32 as float64): torch casts float64 through float32."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"expected numbers, got {x!r}") from None
    # Overflow to inf is the point; signalling NaNs (any NaN payload) are quietly NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        return arr, arr.astype(np.float32).astype(np.float64)


def _scalar_or_array(result: np.ndarray, like):
    if np.ndim(like) == 0:
        return np.asarray(result)[()].item()
    return result


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
        if self.specials not in ("ieee", "fn"):
            raise ValueError(f"specials must be 'ieee' or 'fn', not {self.specials!r}")

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

    def quantize(self, x):
        """x rounded into this format exactly as torch's cast does, as float64."""
        q, _ = self._quantize_with_codes(x)
        return _scalar_or_array(q, x)

    def classify(self, x):
        """Category of each value of x once cast: one of ``CATEGORIES``.

        ``underflow`` is a nonzero value that becomes 0; ``overflow`` becomes inf (or saturates to
        ``max`` in an "fn" format). Inf itself counts as overflow, as it does for a loss scaler.
        """
        _, codes = self._quantize_with_codes(x)
        return _scalar_or_array(_CATEGORY_NAMES[codes], x)

    def classify_codes(self, x) -> np.ndarray:
        """Like ``classify`` but as int8 indices into ``CATEGORIES``."""
        return self._quantize_with_codes(x)[1]

    # ----- bit patterns -----
    def _check_bits(self, bits) -> np.ndarray:
        arr = np.asarray(bits)
        if arr.dtype.kind == "f":
            if not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)):
                raise ValueError(f"{self.name} bit patterns are whole numbers, got {bits!r}")
            arr = arr.astype(np.int64)
        elif arr.dtype.kind not in "iu":
            raise TypeError(f"{self.name} bit patterns are integers, got {bits!r}")
        arr = arr.astype(np.int64)
        top = (1 << self.bits) - 1
        if np.any((arr < 0) | (arr > top)):
            bad = arr[(arr < 0) | (arr > top)].ravel()[0]
            raise ValueError(
                f"{self.name} bit patterns have {self.bits} bits: 0 to {top} (0x{top:X}); got {bad}"
            )
        return arr

    def fields(self, bits) -> tuple:
        """(sign, exponent field, mantissa field) of bit patterns, as integers."""
        arr = self._check_bits(bits)
        m, e = self.mantissa_bits, self.exponent_bits
        sign = arr >> (m + e)
        exp = (arr >> m) & ((1 << e) - 1)
        man = arr & ((1 << m) - 1)
        if np.ndim(bits) == 0:
            return int(sign), int(exp), int(man)
        return sign, exp, man

    def decode(self, bits):
        """Value of each bit pattern, as float64."""
        sign, exp, man = (np.asarray(f) for f in self.fields(np.asarray(bits)))
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
        return _scalar_or_array(val, bits)

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
        return _scalar_or_array(bits, x)

    # ----- neighbours -----
    def neighbours(self, x) -> tuple[float, float]:
        """The representable values just below and above the stored value of scalar x.

        At the ends of the range the missing neighbour is -inf/inf in an "ieee" format and NaN
        (nothing there) in an "fn" format.
        """
        q = float(self.quantize(x))
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
        a = abs(float(self.quantize(x)))
        if not np.isfinite(a):
            return float("nan")
        e = int(np.frexp(a)[1]) - 1 if a > 0 else self.emin
        return float(np.ldexp(1.0, max(e, self.emin) - self.mantissa_bits))

    def __repr__(self) -> str:
        return (
            f"FloatFormat({self.name}: {self.exponent_bits} exponent bits, "
            f"{self.mantissa_bits} mantissa bits, bias {self.bias}, max {self.max:g})"
        )


FP32 = FloatFormat("fp32", 8, 23, 127, torch_dtype="float32", description="IEEE binary32")
TF32 = FloatFormat(
    "tf32", 8, 10, 127,
    description="NVIDIA TensorFloat-32: a compute format, fp32 range with fp16's 10 mantissa bits "
    "(19 bits; modelled here with round-to-nearest-even and subnormals)",
)
FP16 = FloatFormat("fp16", 5, 10, 15, torch_dtype="float16", description="IEEE binary16 (half)")
BF16 = FloatFormat("bf16", 8, 7, 127, torch_dtype="bfloat16", description="bfloat16: fp32's range, 7 mantissa bits")
FP8_E4M3 = FloatFormat(
    "fp8_e4m3", 4, 3, 7, specials="fn", torch_dtype="float8_e4m3fn",
    description="OCP fp8 E4M3 ('fn': no inf, one NaN per sign, saturating cast)",
)
FP8_E5M2 = FloatFormat("fp8_e5m2", 5, 2, 15, torch_dtype="float8_e5m2", description="OCP fp8 E5M2 (IEEE-like)")

FORMATS = {f.name: f for f in (FP32, TF32, FP16, BF16, FP8_E4M3, FP8_E5M2)}


def get_format(fmt) -> FloatFormat:
    """A FloatFormat from itself or its name ("fp16", "bf16", ...), with a clear error otherwise."""
    if isinstance(fmt, FloatFormat):
        return fmt
    key = str(fmt).lower().replace("-", "_")
    aliases = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
               "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "fp8_e4m3fn": "fp8_e4m3"}
    key = aliases.get(key, key)
    if key not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[key]
