"""The formats whose bits are laid out differently from "ieee" and "fn" ones, each a subclass of
``FloatFormat`` with the same interface: ``FnuzFormat`` (no inf, no -0, NaN at the -0 pattern:
fp8 E4M3/E5M2 "fnuz"), ``FiniteFormat`` (every pattern a number: OCP MX's fp6 and fp4) and
``E8M0Format`` (unsigned powers of two: the MX block-scale format). Each docstring says which
library's cast it reproduces and the keyword that picks another library's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampviz.formats.inputs import _as_float32_values, _describe, _real_array, _scalar_or_array
from ampviz.formats.spec import NAN, NORMAL, OVERFLOW, UNDERFLOW, ZERO, FloatFormat


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
