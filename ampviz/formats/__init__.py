"""Float formats, bit for bit: fp32, tf32, fp16, bf16 and the two fp8 formats (``FORMATS``, the
course's six), and the low-precision formats behind block scaling (``ALL_FORMATS`` adds them):
fp8 E4M3/E5M2 "fnuz", OCP MX's fp6 E3M2/E2M3 and fp4 E2M1, and the scale format E8M0.

Every format here is described by three numbers (exponent bits, mantissa bits, bias) and one
choice about its top exponent:

* ``"ieee"``: the all-ones exponent is reserved for inf and NaN, and a cast that overflows gives
  inf (fp32, tf32, fp16, bf16, fp8 E5M2);
* ``"fn"`` ("finite, NaN"): no inf; only the all-ones pattern S.1111.111 is NaN. What a cast does
  past the largest value is the cast's choice, not the format's: ``quantize`` saturates to it, as
  torch's CPU cast to ``float8_e4m3fn`` does since torch 2.12 (500, 1e6 and even inf all become
  448); ``quantize(x, overflow="nan")`` gives ml_dtypes' NaN instead.

``quantize`` reproduces ``torch``'s casts exactly: float64 input is first rounded to float32 (torch
casts float64 to float16 through float32 too, so 65519.99999 becomes inf), then rounded to nearest,
ties to even, into the format. Results are float64, which holds every value of every format here
exactly.

Values may be Python numbers, (nested) lists of them, numpy arrays (ml_dtypes' bfloat16, fp8,
fp6, fp4 and e8m0 arrays too, read as their values in float32, exactly) or torch tensors of any
real dtype, on any device, with or without grad: a tensor is read detached, on the CPU, its bf16,
fp16 or fp8 values upcast to float32 (exact), float64 kept (then rounded through float32 as
above), integers kept (cast directly, as torch does). Bools count as 0 and 1, as in numpy and
torch. Python ints beyond 64 bits and other numbers numpy keeps as objects go through float64
(inf beyond its range). Anything else (None, text, bytes, complex numbers, datetimes) is one TypeError that says
what to pass. The module recognises tensors without importing torch.

The new formats lay their bits out differently, so each kind is a subclass with the same
interface: ``FnuzFormat`` (no inf, no -0, NaN is the -0 pattern; overflow gives NaN, as torch and
ml_dtypes do, or saturates), ``FiniteFormat`` (every pattern a number; saturating; NaN, which it
cannot hold, written as ml_dtypes or as torchao does) and ``E8M0Format`` (unsigned powers of two;
0 and negative numbers as torch or as ml_dtypes cast them). Their docstrings state each library's
convention and the keyword that selects it.

A ``FloatFormat`` checks its fields when it is made: 1 to 23 mantissa bits, 2 to 8 exponent bits
("ieee") or 1 to 8 ("fn"), and a bias that keeps every value a float32 value (the arithmetic goes
through float32); anything else is a one-line ValueError or TypeError.

This module needs numpy only.
"""

from __future__ import annotations

import math
import numbers
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
    "FP8_E4M3FNUZ",
    "FP8_E5M2FNUZ",
    "FP6_E3M2",
    "FP6_E2M3",
    "FP4_E2M1",
    "E8M0",
    "FnuzFormat",
    "FiniteFormat",
    "E8M0Format",
    "FORMATS",
    "ALL_FORMATS",
    "CATEGORIES",
    "get_format",
]

#: The categories ``classify`` (and ``ampviz.formats.census``) sort values into, in this order.
CATEGORIES = ("zero", "underflow", "subnormal", "normal", "overflow", "nan")
#: What ``FloatFormat.quantize(x, overflow=...)`` can make of a value beyond the range (None: torch's cast).
OVERFLOW_RULES = (None, "saturate", "nan", "inf")
ZERO, UNDERFLOW, SUBNORMAL, NORMAL, OVERFLOW, NAN = range(6)
_CATEGORY_NAMES = np.array(CATEGORIES)


def _describe(x) -> str:
    """A short, one-line description of x for an error message."""
    if isinstance(x, np.ndarray):
        return f"an array of {x.dtype} with shape {x.shape}"
    try:
        text = repr(x)
    except Exception:  # a broken __repr__ must not hide the real message
        text = ""
    if text and len(text) <= 60 and "\n" not in text:
        return text
    name = type(x).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _first_line(exc: BaseException) -> str:
    try:
        lines = str(exc).strip().splitlines()
    except Exception:
        lines = []
    return lines[0] if lines else type(exc).__name__


def _is_tensor(x) -> bool:
    """Whether x is a torch tensor (or a subclass, e.g. a Parameter), told without importing torch."""
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in type(x).__mro__)


def _tensor_values(t, what: str) -> np.ndarray:
    """A torch tensor's values as numpy: detached, on the CPU, and bf16/fp16/fp8 upcast to float32
    (exact: float32 holds every value of those formats); float64 stays float64, integers and bools
    stay as they are, sparse and quantized tensors give the values they stand for."""
    if t.is_complex():
        raise TypeError(f"{what} must be real numbers, got a complex tensor ({t.dtype}); "
                        "pass its real part (t.real) or its magnitude (t.abs())")
    try:
        t = t.detach()
        if str(t.layout) != "torch.strided":  # sparse
            t = t.to_dense()
        if t.is_quantized:
            t = t.dequantize()
        t = t.cpu()
        if t.is_floating_point() and str(t.dtype) not in ("torch.float32", "torch.float64"):
            t = t.float()
        return t.numpy()
    except Exception as exc:  # meta tensors (no data), nested tensors, dtypes numpy cannot hold
        problem = _first_line(exc)
    raise TypeError(f"{what}: cannot read the values of this {t.dtype} tensor on {t.device} ({problem}); "
                    "pass a tensor that holds real numbers")


def _object_values(arr: np.ndarray, what: str) -> np.ndarray:
    """An object array of real Python numbers (ints too long for 64 bits, fractions, a mix) as
    float64; an int beyond float64's range becomes inf of its sign, as its cast would."""
    out = np.empty(arr.shape, np.float64)
    flat = out.reshape(-1)
    for i, v in enumerate(arr.reshape(-1)):
        if not isinstance(v, (numbers.Real, np.bool_)):
            raise TypeError(f"{what} must be real numbers (a number, a list of numbers, a numpy array or "
                            f"a torch tensor), got {_describe(v)}")
        try:
            flat[i] = float(v)
        except OverflowError:
            flat[i] = math.inf if v > 0 else -math.inf
    return out


#: The NaN torch 2.13's ``max`` over a whole CPU tensor of two or more elements writes when one
#: is NaN: 0xFFFFFFFF, negative (its vectorized max ORs an all-ones mask in); ``amax`` writes
#: the positive quiet NaN 0x7FC00000 instead.
_TORCH_MAX_NAN = np.uint32(0xFFFFFFFF).view(np.float32)

_REFUSED_KINDS = {
    "c": "complex numbers; pass the real part (x.real) or the magnitude (abs(x))",
    "M": "datetimes; pass numbers",
    "m": "time spans; pass numbers (e.g. x / np.timedelta64(1, 's'))",
    "U": "strings; pass numbers (e.g. float(text))",
    "S": "bytes; pass numbers",
    "V": "raw records; pass numbers",
}


def _real_array(x, what: str = "values") -> np.ndarray:
    """x as a numpy array of real numbers (dtype kind b, i, u or f), with one clear TypeError for
    anything else.

    Accepted: Python numbers and bools, (nested) lists of them, numpy arrays and scalars, arrays of
    ml_dtypes' types (bfloat16, float8_*, float6_*, float4_e2m1fn, float8_e8m0fnu, int4, ...: read
    as their values in float32, which holds each exactly; told by the dtype, without importing
    ml_dtypes), and torch tensors of any real dtype, device and grad state. Bools count as 0 and 1
    (as numpy and torch cast them). Refused: None, text, bytes, complex numbers, datetimes and other objects.
    """
    if x is None:
        raise TypeError(f"{what} must be numbers (a number, a list of numbers, a numpy array or a torch "
                        "tensor), got None")
    if isinstance(x, (str, bytes, bytearray)):
        raise TypeError(f"{what} must be numbers, not text: got {_describe(x)}; pass e.g. float(text)")
    if _is_tensor(x):
        return _tensor_values(x, what)
    if isinstance(x, (list, tuple)) and any(_is_tensor(v) for v in x):  # e.g. a list of 0-d losses
        x = [_tensor_values(v, what) if _is_tensor(v) else v for v in x]
    try:
        arr = np.asarray(x)
    except MemoryError:
        raise
    except Exception as exc:  # ragged lists, objects whose __array__ fails
        raise TypeError(f"{what} must be numbers or an array of them, got {_describe(x)} "
                        f"({_first_line(exc)})") from None
    if getattr(arr.dtype.type, "__module__", "").partition(".")[0] == "ml_dtypes":  # bfloat16, float8_*, int4, ...
        return arr.astype(np.float32)  # exact: float32 holds every value of ml_dtypes' types
    kind = arr.dtype.kind
    if kind in "biuf":
        return arr
    if kind == "O":
        return _object_values(arr, what)
    raise TypeError(f"{what} must be numbers, not {_REFUSED_KINDS.get(kind, str(arr.dtype))}")


def _as_float32_values(x) -> tuple[np.ndarray, np.ndarray]:
    """(x as an array, x rounded to float32 as float64): torch casts float64 through float32."""
    arr = _real_array(x)
    # Overflow to inf is the point; signalling NaNs (any NaN payload) are quietly NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        return arr, arr.astype(np.float32).astype(np.float64)


def _scalar_or_array(result: np.ndarray):
    """A Python scalar for a 0-d result (the input was one number), else the array."""
    if np.ndim(result) == 0:
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


# ---------------------------------------------------------------- formats beyond IEEE's layout
# Three kinds of 8-bit-and-smaller format lay their bits out differently from "ieee" and "fn" ones,
# so each is a subclass that keeps FloatFormat's interface (constants, decode, encode, quantize,
# classify, neighbours, ulp) and states, per method, which library's cast it reproduces.


def _check_choice(value, what: str, choices: tuple, fmt_name: str, why: str = ""):
    """value must be one of choices (None or strings); one-line ValueError otherwise."""
    if not (value is None or isinstance(value, str)) or value not in choices:
        shown = ", ".join("None" if c is None else repr(c) for c in choices)
        raise ValueError(f"{what} for {fmt_name} must be one of {shown}, not {_describe(value)}{why}")


def _float32_bits(x32: np.ndarray) -> np.ndarray:
    """The float32 bit patterns (uint32) of float64 values that are float32 values, any shape."""
    arr = np.asarray(x32)
    return arr.reshape(-1).astype(np.float32).view(np.uint32).reshape(arr.shape)


@dataclass(frozen=True, repr=False)
class _AllNumbersFormat(FloatFormat):
    """A sign bit, and every exponent field holds numbers: no pattern is reserved for inf.

    Shared by FnuzFormat and FiniteFormat (they differ in NaN and -0 only).
    """

    def _check_layout(self):
        want = type(self).specials  # the class's default: its only kind
        if self.specials != want:
            raise ValueError(f"specials of a {type(self).__name__} must be {want!r}, not {_describe(self.specials)}")
        e, m = self.exponent_bits, self.mantissa_bits
        if not 1 <= e <= 8:
            raise ValueError(f"exponent_bits must be 1 to 8 for a {want!r} format, got {e}")
        if not 1 <= m <= 23:
            raise ValueError(f"mantissa_bits must be 1 to 23, got {m}")
        low, high = (1 << e) - 1 - 127, 150 - m
        if not low <= self.bias <= high:
            raise ValueError(f"bias must be {low} to {high} for {e} exponent and {m} mantissa bits (every "
                             f"value must fit in float32), got {self.bias}")

    @property
    def emax(self) -> int:
        return (1 << self.exponent_bits) - 1 - self.bias

    @property
    def max(self) -> float:
        """Largest value: every exponent and mantissa bit set (there is no inf or NaN above it)."""
        return float(np.ldexp(2.0 - 2.0 ** (-self.mantissa_bits), self.emax))

    @property
    def overflow_boundary(self) -> float:
        """max + half an ulp: max's mantissa is odd, so this tie and everything above it overflows."""
        return self.max + float(np.ldexp(1.0, self.emax - self.mantissa_bits - 1))

    def _magnitude_bits(self, a: np.ndarray) -> np.ndarray:
        """Bit patterns (int64, sign bit clear) of finite magnitudes a >= 0 already on the grid."""
        m = self.mantissa_bits
        a = np.where(np.isfinite(a), a, 0.0)
        e = np.frexp(a)[1] - 1
        normal = a >= self.smallest_normal
        exp_field = np.where(normal, e + self.bias, 0).astype(np.int64)
        man = np.where(normal, np.ldexp(a, m - e) - (1 << m), np.ldexp(a, m - self.emin)).astype(np.int64)
        return (exp_field << m) | man

    def _decode_magnitudes(self, bits) -> tuple[np.ndarray, np.ndarray]:
        """(bit patterns as int64, signed values of the patterns, every exponent field a number)."""
        arr = self._check_bits(bits)
        m, e = self.mantissa_bits, self.exponent_bits
        exp = (arr >> m) & ((1 << e) - 1)
        man = arr & ((1 << m) - 1)
        normal = np.ldexp((man + (1 << m)).astype(np.float64), exp - self.bias - m)
        val = np.where(exp == 0, np.ldexp(man.astype(np.float64), self.emin - m), normal)
        return arr, np.where(arr >> (m + e) == 1, -val, val)


@dataclass(frozen=True, repr=False)
class FnuzFormat(_AllNumbersFormat):
    """"fnuz" ("finite, NaN, unsigned zero"): no inf, no -0, and the pattern -0 would have (1000...0)
    is the only NaN (float8_e4m3fnuz, float8_e5m2fnuz, as in AMD's MI300 and Graphcore's hardware).

    The casts of torch 2.13 and ml_dtypes 0.6 agree on every float32 value: round to nearest even,
    a result of -0 becomes +0, and a value past the range (rounding above ``max``, ±inf) becomes NaN.
    ``quantize(x, overflow="saturate")`` gives ±max instead (a saturating hardware cast).
    """

    specials: str = "fnuz"

    @property
    def nan_bits(self) -> int:
        """The one NaN pattern: the sign bit alone (0x80)."""
        return 1 << (self.bits - 1)

    def decode(self, bits):
        """Value of each bit pattern, as float64 (the -0 pattern is NaN)."""
        arr, val = self._decode_magnitudes(bits)
        return _scalar_or_array(np.where(arr == self.nan_bits, np.nan, val))

    def encode(self, x, overflow=None):
        """Bit pattern of each value of x once cast.

        ``overflow``: None or "nan" (both libraries: NaN, ``nan_bits``) or "saturate" (±max).
        NaN is always ``nan_bits``; a value that rounds to zero is +0 whatever its sign.
        """
        _check_choice(overflow, "overflow", (None, "nan", "saturate"), self.name, " (it has no inf)")
        q, codes = self._quantize_with_codes(x)
        bits = self._magnitude_bits(np.abs(q))
        bits = np.where(codes == OVERFLOW, self._magnitude_bits(np.float64(self.max)), bits)
        bits = bits | ((np.signbit(q) & (bits != 0)).astype(np.int64) << (self.bits - 1))
        nan = (codes == NAN) | ((codes == OVERFLOW) & (overflow != "saturate"))
        return _scalar_or_array(np.where(nan, self.nan_bits, bits))

    def quantize(self, x, overflow=None):
        """x rounded into this format as ``encode(x, overflow)`` gives it, as float64 (NaN for NaN)."""
        return self.decode(self.encode(x, overflow))


@dataclass(frozen=True, repr=False)
class FiniteFormat(_AllNumbersFormat):
    """"finite": every bit pattern is a number, with no inf and no NaN (OCP MX's FP6 E3M2, FP6 E2M3
    and FP4 E2M1; ml_dtypes' float6_e3m2fn, float6_e2m3fn, float4_e2m1fn; torch has no such dtype).

    Rounding is to nearest even and a value past the range (or ±inf) saturates to ±max, as in
    ml_dtypes and torchao's ``f32_to_f4_unpacked``/``f32_to_f6_*_unpacked`` (they agree on every
    number). They differ on NaN, which the format cannot hold: ``nan=None`` follows ml_dtypes (a
    NaN becomes the zero of the opposite sign: +NaN gives -0, -NaN gives +0); ``nan="torchao"``
    follows torchao's bit arithmetic (a quiet +NaN gives 1.5 in FP4, 0x3; the pattern depends on
    the NaN's payload). ``classify`` calls a NaN "nan" either way.
    """

    specials: str = "finite"

    @property
    def nan_bits(self):
        """None: no pattern means NaN."""
        return None

    def decode(self, bits):
        """Value of each bit pattern, as float64 (every pattern is a number)."""
        return _scalar_or_array(self._decode_magnitudes(bits)[1])

    def _torchao_nan_bits(self, u: np.ndarray) -> np.ndarray:
        """What torchao's ``_f32_to_floatx_unpacked`` makes of float32 NaN patterns u: its
        normal-range branch (NaN fails both range tests) applied to the NaN's bits, wrapped to uint8."""
        e, m = self.exponent_bits, self.mantissa_bits
        shift = 23 - m
        a = (u & 0x7FFFFFFF).astype(np.int64)
        add = ((self.bias - 127) << 23) + (1 << (shift - 1)) - 1
        code = ((a + add + ((a >> shift) & 1)) >> shift) & 0xFF
        return code | ((u.astype(np.int64) >> 31) << (e + m))

    def encode(self, x, overflow=None, nan=None):
        """Bit pattern of each value of x once cast (see the class for ``nan``).

        ``overflow``: None or "saturate" (the only choice: ±max); -0 keeps its sign bit.
        """
        _check_choice(overflow, "overflow", (None, "saturate"), self.name, " (it has no inf or NaN: it saturates)")
        _check_choice(nan, "nan", (None, "torchao"), self.name, " (None: as ml_dtypes)")
        if nan == "torchao" and self.bits > 8:
            raise ValueError(f"nan='torchao' reproduces torchao's cast to formats of at most 8 bits; {self.name} "
                             f"has {self.bits}: use nan=None")
        q, codes = self._quantize_with_codes(x)
        a = np.where(codes == OVERFLOW, self.max, np.abs(q))
        bits = self._magnitude_bits(a) | (np.signbit(q).astype(np.int64) << (self.bits - 1))
        isnan = codes == NAN
        if isnan.any():  # the NaN's own float32 bits: its sign, and for torchao its payload
            arr = _real_array(x)
            if arr.dtype == np.float32:  # as given (float64 would quiet a signalling NaN)
                u = np.where(isnan, arr.view(np.uint32), 0)
            else:
                u = _float32_bits(np.where(isnan, _as_float32_values(arr)[1], 0.0))
            if nan is None:
                fill = (1 - (u.astype(np.int64) >> 31)) << (self.bits - 1)
            else:
                fill = self._torchao_nan_bits(u)
            bits = np.where(isnan, fill, bits)
        return _scalar_or_array(bits)

    def quantize(self, x, overflow=None, nan=None):
        """x rounded into this format as ``encode(x, overflow, nan)`` gives it, as float64 (a NaN
        becomes the value of the pattern the NaN rule picks)."""
        return self.decode(self.encode(x, overflow, nan))


@dataclass(frozen=True, repr=False)
class E8M0Format(FloatFormat):
    """OCP MX's block-scale format E8M0 (torch's float8_e8m0fnu): 8 exponent bits and nothing
    else. Pattern c is 2**(c - 127) for c = 0..254 (2**-127 to 2**127); 255 is NaN. No sign, no
    zero, no inf.

    The cast (torch 2.13 and ml_dtypes 0.6 agree on every positive float32 value) rounds to the
    nearest power of two with ties up: the float32 exponent, plus one when the mantissa's top bit
    is set (1.5 -> 2, 1.4999999 -> 1, 3 -> 4). A float32 subnormal rounds up to 2**-126 only above
    2**-127 with more bits set than the top one (the implicit bit counts as 0); everything at or
    below 2**-127 gives pattern 0. ±inf, NaN and values from 1.5 * 2**127 up give NaN (255).
    The libraries differ on 0 and negative numbers: torch drops the sign and makes 0 pattern 0
    (2**-127), the default here; ``nonpositive="nan"`` gives ml_dtypes' NaN. ``overflow="saturate"``
    gives 2**127 (254) for values past the range and ±inf, as Transformer Engine's ``float_to_e8m0``
    does for inf.

    Never derive an MX block scale with this cast (it rounds to nearest): ``ampviz.formats.blocks`` builds
    scale patterns from the exponent bits, as the MX rules say.
    """

    specials: str = "fnu"

    def _check_layout(self):
        if self.specials != "fnu":
            raise ValueError(f"specials of an E8M0Format must be 'fnu', not {_describe(self.specials)}")
        if (self.exponent_bits, self.mantissa_bits, self.bias) != (8, 0, 127):
            raise ValueError(f"an E8M0Format has 8 exponent bits, 0 mantissa bits and bias 127, got "
                             f"{self.exponent_bits}, {self.mantissa_bits} and {self.bias}")

    @property
    def bits(self) -> int:
        return 8  # no sign bit

    @property
    def emin(self) -> int:
        """Exponent of the smallest value, 2**-127 (pattern 0 is a value, not a zero)."""
        return -self.bias

    @property
    def emax(self) -> int:
        return 254 - self.bias

    @property
    def max(self) -> float:
        return float(np.ldexp(1.0, self.emax))

    @property
    def smallest_normal(self) -> float:
        return float(np.ldexp(1.0, self.emin))

    @property
    def smallest_subnormal(self) -> float:
        """No subnormals: the smallest value (as ``ml_dtypes.finfo`` says)."""
        return self.smallest_normal

    @property
    def overflow_boundary(self) -> float:
        """1.5 * 2**127: ties round up, so this value and everything above it overflows to NaN."""
        return 1.5 * self.max

    @property
    def underflow_boundary(self) -> float:
        """2**-128, half the smallest value: where a format with a zero would give 0. E8M0 has none:
        ``classify`` calls 0 < |x| <= this "underflow", and the cast gives 2**-127."""
        return float(np.ldexp(1.0, self.emin - 1))

    @property
    def nan_bits(self) -> int:
        return 0xFF

    def decode(self, bits):
        """Value of each pattern, as float64: 2**(c - 127), NaN for 255."""
        arr = self._check_bits(bits)
        val = np.where(arr == 0xFF, np.nan, np.ldexp(1.0, np.minimum(arr, 254) - self.bias))
        return _scalar_or_array(val)

    def _encode_with_codes(self, x, overflow=None, nonpositive=None):
        _check_choice(overflow, "overflow", (None, "nan", "saturate"), self.name, " (it has no inf)")
        _check_choice(nonpositive, "nonpositive", (None, "nan"), self.name,
                      " (None: as torch, |x|, and 0 gives 2**-127)")
        x, x32 = _as_float32_values(x)
        u = _float32_bits(x32).astype(np.int64)
        exp, man = (u >> 23) & 0xFF, u & 0x7FFFFF
        up = ((man & 0x400000) != 0) & (((man & 0x3FFFFF) != 0) | (exp > 0))
        bits = np.where(exp == 0xFF, 0xFF, exp + up)
        isnan = np.isnan(x32)
        over = (bits == 0xFF) & ~isnan
        if overflow == "saturate":
            bits = np.where(over, 0xFE, bits)
        with np.errstate(invalid="ignore"):
            if nonpositive == "nan":
                bits = np.where((x32 <= 0) | np.signbit(x32), 0xFF, bits)
            codes = np.full(bits.shape, NORMAL, dtype=np.int8)
            codes[np.abs(x32) <= self.underflow_boundary] = UNDERFLOW
        codes[x == 0] = ZERO
        codes[over] = OVERFLOW
        codes[isnan] = NAN
        return bits, codes

    def _quantize_with_codes(self, x):
        bits, codes = self._encode_with_codes(x)
        return np.asarray(self.decode(bits), np.float64), codes

    def encode(self, x, overflow=None, nonpositive=None):
        """Pattern of each value of x once cast (see the class for the two conventions)."""
        return _scalar_or_array(self._encode_with_codes(x, overflow, nonpositive)[0])

    def quantize(self, x, overflow=None, nonpositive=None):
        """x rounded to a power of two as ``encode(x, overflow, nonpositive)`` gives it, as float64."""
        return self.decode(self.encode(x, overflow, nonpositive))

    def neighbours(self, x) -> tuple[float, float]:
        """The powers of two just below and above the stored value of scalar x (NaN past the ends)."""
        q = self._one_value(x, "neighbours")
        if np.isnan(q):
            return (float("nan"), float("nan"))
        c = int(self.encode(q))
        down = self.decode(c - 1) if c > 0 else np.nan
        up = self.decode(c + 1) if c < 254 else np.nan
        return float(down), float(up)

    def __repr__(self) -> str:
        return f"E8M0Format({self.name}: powers of two 2^{self.emin} to 2^{self.emax}, NaN 0xFF, no sign, no zero)"


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

FP8_E4M3FNUZ = FnuzFormat(
    "fp8_e4m3fnuz", 4, 3, 8, torch_dtype="float8_e4m3fnuz",
    description="fp8 E4M3 'fnuz' (bias 8, max 240): no inf, no -0, NaN is the -0 pattern 0x80; overflow gives NaN",
)
FP8_E5M2FNUZ = FnuzFormat(
    "fp8_e5m2fnuz", 5, 2, 16, torch_dtype="float8_e5m2fnuz",
    description="fp8 E5M2 'fnuz' (bias 16, max 57344): no inf, no -0, NaN is the -0 pattern 0x80; overflow gives NaN",
)
FP6_E3M2 = FiniteFormat("fp6_e3m2", 3, 2, 3, description="OCP MX FP6 E3M2 (max 28): no inf, no NaN, saturating cast")
FP6_E2M3 = FiniteFormat("fp6_e2m3", 2, 3, 1, description="OCP MX FP6 E2M3 (max 7.5): no inf, no NaN, saturating cast")
FP4_E2M1 = FiniteFormat(
    "fp4_e2m1", 2, 1, 1,
    description="OCP MX / NVFP4 FP4 E2M1: values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; saturating cast",
)
E8M0 = E8M0Format(
    "e8m0", 8, 0, 127, torch_dtype="float8_e8m0fnu",
    description="OCP MX block-scale format E8M0: the powers of two 2^-127..2^127, NaN 0xFF, no sign, no zero",
)

#: The course's formats (the lessons, explorers and census use these).
FORMATS = {f.name: f for f in (FP32, TF32, FP16, BF16, FP8_E4M3, FP8_E5M2)}
#: Every built-in format: ``FORMATS`` and the low-precision ones behind block scaling (``ampviz.formats.blocks``).
ALL_FORMATS = {**FORMATS, **{f.name: f for f in (FP8_E4M3FNUZ, FP8_E5M2FNUZ, FP6_E3M2, FP6_E2M3, FP4_E2M1, E8M0)}}


def get_format(fmt) -> FloatFormat:
    """A FloatFormat from itself, its name ("fp16", "bf16", ...) or a torch/numpy dtype
    (``torch.bfloat16``), with a clear error otherwise."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        key = fmt
    elif type(fmt).__module__.split(".")[0] == "torch" and str(fmt).startswith("torch."):  # torch.float16
        key = str(fmt)[len("torch."):]
    elif isinstance(fmt, np.dtype):
        key = fmt.name
    else:
        raise TypeError(f"fmt must be a FloatFormat or a format name ({', '.join(FORMATS)}), "
                        f"got {_describe(fmt)}")
    key = key.strip().lower().replace("-", "_")
    aliases = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
               "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "fp8_e4m3fn": "fp8_e4m3",
               "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
               # torch and ml_dtypes names of the formats beyond the course's six
               "float8_e4m3fnuz": "fp8_e4m3fnuz", "float8_e5m2fnuz": "fp8_e5m2fnuz",
               "float6_e3m2fn": "fp6_e3m2", "float6_e2m3fn": "fp6_e2m3", "float4_e2m1fn": "fp4_e2m1",
               "float4_e2m1fn_x2": "fp4_e2m1",  # torch's packed pairs (torchao's MX FP4 element dtype)
               "fp8_e8m0": "e8m0", "float8_e8m0fnu": "e8m0", "e8m0fnu": "e8m0"}
    key = aliases.get(key, key)
    if key not in ALL_FORMATS:
        raise ValueError(f"unknown format {_describe(fmt)}; choose one of {', '.join(ALL_FORMATS)}")
    return ALL_FORMATS[key]
