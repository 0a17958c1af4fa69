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

# The code lives in the modules below (each imports its siblings directly, never this package):
# inputs (reading values), spec (FloatFormat), beyond_ieee (fnuz, finite, E8M0), catalog (the
# built-in formats and get_format). The public API (``__all__``) and the private names other
# modules and tests use are re-exported.
from ampviz.formats.beyond_ieee import E8M0Format, FiniteFormat, FnuzFormat
from ampviz.formats.catalog import (ALL_FORMATS, BF16, E8M0, FORMATS, FP4_E2M1, FP6_E2M3, FP6_E3M2, FP8_E4M3,
    FP8_E4M3FNUZ, FP8_E5M2, FP8_E5M2FNUZ, FP16, FP32, TF32, get_format)
from ampviz.formats.inputs import _describe, _real_array
from ampviz.formats.spec import CATEGORIES, UNDERFLOW, ZERO, FloatFormat

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
