"""What ``torch.set_float32_matmul_precision`` asks a GPU to do to a float32 matmul, emulated
exactly in numpy: ``emulated_matmul(a, b, mode)`` and ``matmul_errors(a, b)``.

The modes (``MATMUL_MODES``):

* ``"fp32"``: the float32 inputs as they are ("highest").
* ``"tf32"``: each input rounded to TF32 first (8 exponent bits, 10 mantissa bits), as NVIDIA's
  tensor cores read float32 under "high" or ``torch.backends.cuda.matmul.allow_tf32 = True``.
* ``"bf16x3"``: each input split into two bf16 numbers, ``hi = bf16(x)`` and
  ``lo = bf16(x - hi)`` (``x - hi`` in float32, where it is exact), and the product taken as
  ``hi·hi + hi·lo + lo·hi``: the bfloat16 approach torch's documentation describes for "high" (a
  float32 number as the sum of two bfloat16 numbers). The ``lo·lo`` term is left out.
* ``"bf16"``: each input rounded to bf16 first ("medium", where a bf16 kernel exists).

Every mode then sums the products of its rounded inputs exactly and rounds the sum once to float32
(nearest, ties to even). This is the error the rounding of the inputs causes, and nothing else:
a real kernel accumulates in float32 in an order of its own (tensor cores, BLAS blocking), which
moves the last bits of the result and is promised by no library. The products are exact in
float64 (at most 24 + 24 bits), and the sum is made exact where float64 is not enough: where a
float64 sum's error bound straddles a float32 rounding boundary, that element is summed again with
``math.fsum`` and rounded to odd, so the float32 result is the correctly rounded exact sum. With
``mode="fp32"`` this is the float64 product of the float32 inputs, rounded to float32: the
reference the other modes are measured against (``matmul_errors`` measures against the float64
product itself).

The roundings, bit for bit:

* bf16: round to nearest, ties to even, as torch's cast ``x.to(torch.bfloat16)`` does (and CUDA's
  ``__float2bfloat16``). Subnormals are kept; a value that rounds past bf16's largest becomes inf.
* TF32: round to nearest, ties to even, by default (``tf32_rounding="even"``), the same cast as
  ``ampviz.formats.TF32.quantize``. NVIDIA does not document which rounding cuBLAS applies when it
  feeds float32 to TF32 tensor cores. NVIDIA's own conversions break ties away from zero: PTX's
  ``cvt.rna.tf32.f32`` (round to nearest, ties away) and CUTLASS's ``tfloat32_t`` constructor
  (``round_half_ulp_truncate``: add half a TF32 ulp, drop 13 bits); ``tf32_rounding="away"``
  models them. The two differ only on an exact tie (the 13 dropped bits a 1 and twelve 0s: one
  float32 value in 8192). Truncation, which PyTorch's numerical-accuracy notes suggest ("only the
  first 10 bits of the input mantissa are read"), is not modelled: it moves every input towards
  zero and more than doubles a matmul's error (the tests measure it).

Inputs are read as float32 (float64 rounded to float32 first, as torch casts); any real numbers,
lists, numpy arrays or tensors of at least one dimension, with numpy's matmul rules for shapes
(1-D vectors, stacks of matrices broadcast). Results are float32 arrays. Inf and NaN propagate as
float arithmetic makes them (a magnitude of (2 - 2^-8)·2^127, about 3.396e38, or more rounds to
inf in bf16, so in the bf16x3 split ``hi`` is inf, ``lo`` -inf, and the product NaN).

This module needs numpy only.
"""

from __future__ import annotations

import math

import numpy as np

from ampviz._args import _real_array, _shown

__all__ = ["MATMUL_MODES", "TF32_ROUNDINGS", "round_to_tf32", "round_to_bf16", "split_bf16",
           "emulated_matmul", "relative_error", "matmul_errors"]

#: The modes ``emulated_matmul`` knows, with what each stands for.
MATMUL_MODES = {
    "fp32": 'float32 inputs ("highest")',
    "tf32": 'inputs rounded to TF32 ("high" on tensor cores)',
    "bf16x3": 'inputs split into bf16 hi + lo, three bf16 products ("high", the bf16 approach)',
    "bf16": 'inputs rounded to bf16 ("medium")',
}
#: How ``round_to_tf32`` breaks a tie: "even" (IEEE's default) or "away" from zero (PTX ``cvt.rna``).
TF32_ROUNDINGS = ("even", "away")

_WHAT = "real numbers (a list, an array or a tensor of at least one dimension)"


def _float32(name: str, values) -> np.ndarray:
    arr = _real_array(name, values, _WHAT, dtype=np.float32)
    if arr.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension (matmul needs a vector or a matrix), "
                         f"not {_shown(values)}")
    return arr


def _round_bits(x32: np.ndarray, drop: int, away: bool) -> np.ndarray:
    """float32 values with their lowest ``drop`` mantissa bits rounded off (to nearest; ties to
    even, or away from zero): the cast to a format with float32's exponent and fewer mantissa bits.
    A carry out of the mantissa moves the exponent (the largest values become inf); inf stays,
    NaN stays NaN."""
    u = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    half = np.uint64(1 << (drop - 1))
    if away:
        rounded = u + half
    else:
        rounded = u + (half - np.uint64(1)) + ((u >> np.uint64(drop)) & np.uint64(1))
    rounded &= ~np.uint64((1 << drop) - 1)
    finite = np.isfinite(x32)
    out = np.where(finite, rounded, u).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x32), np.float32(np.nan), out).reshape(np.shape(x32))


def round_to_tf32(x, rounding: str = "even") -> np.ndarray:
    """``x`` (read as float32) rounded to TF32, as float32: 10 mantissa bits kept, ties to even
    (``rounding="even"``) or away from zero (``"away"``, PTX ``cvt.rna.tf32.f32``)."""
    if not isinstance(rounding, str) or rounding not in TF32_ROUNDINGS:
        raise ValueError(f"tf32_rounding must be one of {', '.join(map(repr, TF32_ROUNDINGS))}, not {_shown(rounding)}")
    return _round_bits(_real_array("x", x, "real numbers", dtype=np.float32), 13, rounding == "away")


def round_to_bf16(x) -> np.ndarray:
    """``x`` (read as float32) rounded to bf16 as torch's cast does (nearest, ties to even), as float32."""
    return _round_bits(_real_array("x", x, "real numbers", dtype=np.float32), 16, False)


def split_bf16(x) -> tuple[np.ndarray, np.ndarray]:
    """The bf16x3 split of ``x`` (read as float32): ``hi = bf16(x)`` and ``lo = bf16(x - hi)``,
    both as float32 arrays; ``x - hi`` is computed in float32, as ``x - hi.float()`` in torch."""
    x32 = _real_array("x", x, "real numbers", dtype=np.float32)
    hi = _round_bits(x32, 16, False)
    with np.errstate(invalid="ignore", over="ignore"):
        lo = _round_bits((x32 - hi).astype(np.float32), 16, False)
    return hi, lo


def _check_shapes(a: np.ndarray, b: np.ndarray) -> None:
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise ValueError(f"a's last dimension ({k_a}) must equal b's {'length' if b.ndim == 1 else 'second-to-last dimension'} "
                         f"({k_b}) for a @ b; got shapes {a.shape} and {b.shape}")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"a's and b's leading (batch) dimensions must broadcast; got shapes {a.shape} and {b.shape}") from None


def _exact_to_float32(a64: np.ndarray, b64: np.ndarray) -> np.ndarray:
    """float32(a64 @ b64), with the sum of each element's products (exact in float64) rounded once,
    correctly, to float32. Operands are float64 arrays of at least 2 dimensions (vectors padded)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.matmul(a64, b64)
        bound = np.matmul(np.abs(a64), np.abs(b64))
    k = a64.shape[-1]
    # Any order of float64 sums of k exact products is within (k-1)u·Σ|p| of the exact sum (u = 2^-53);
    # doubled, it covers the rounding of ``bound`` and of s ± bound themselves.
    bound *= 2.0 * max(k, 1) * 2.0 ** -53
    with np.errstate(invalid="ignore", over="ignore"):
        out = s.astype(np.float32)
        # one float64 step further out, so that a boundary the float64 rounding of s ± bound lands on counts
        low = np.nextafter(s - bound, -np.inf).astype(np.float32)
        high = np.nextafter(s + bound, np.inf).astype(np.float32)
    # Uncertain: finite, and the interval [s - bound, s + bound] holds a float32 rounding boundary.
    doubt = np.isfinite(s) & np.isfinite(bound) & (low != high)
    if np.any(doubt):
        a_b, b_b = np.broadcast_arrays(a64[..., :, None, :], np.swapaxes(b64, -1, -2)[..., None, :, :])
        for index in zip(*np.nonzero(doubt)):
            products = (a_b[index] * b_b[index]).tolist()  # exact in float64
            total = math.fsum(products)  # the exact sum, rounded to nearest float64
            residual = math.fsum(products + [-total])  # its sign is the sign of (exact - total)
            if residual != 0 and (np.float64(total).view(np.uint64) & np.uint64(1)) == 0:
                total = math.nextafter(total, math.copysign(math.inf, residual))  # round to odd
            out[index] = np.float32(total)  # from round-to-odd, one rounding is the correct one
    return out


def emulated_matmul(a, b, mode: str = "fp32", *, tf32_rounding: str = "even") -> np.ndarray:
    """``a @ b`` as float32 under ``mode`` (one of ``MATMUL_MODES``): the inputs rounded as the mode
    rounds them, their products summed exactly, the sum rounded once to float32 (see the module's
    docstring). ``tf32_rounding``: how "tf32" breaks ties, "even" or "away"."""
    if not isinstance(mode, str) or mode not in MATMUL_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MATMUL_MODES))}, not {_shown(mode)}")
    if not isinstance(tf32_rounding, str) or tf32_rounding not in TF32_ROUNDINGS:
        raise ValueError(f"tf32_rounding must be one of {', '.join(map(repr, TF32_ROUNDINGS))}, not {_shown(tf32_rounding)}")
    a32, b32 = _float32("a", a), _float32("b", b)
    _check_shapes(a32, b32)
    vector_a, vector_b = a32.ndim == 1, b32.ndim == 1
    a2 = a32[None, :] if vector_a else a32
    b2 = b32[:, None] if vector_b else b32
    if mode == "fp32":
        left, right = a2, b2
    elif mode == "tf32":
        away = tf32_rounding == "away"
        left, right = _round_bits(a2, 13, away), _round_bits(b2, 13, away)
    elif mode == "bf16":
        left, right = _round_bits(a2, 16, False), _round_bits(b2, 16, False)
    else:  # bf16x3: [hi_a, hi_a, lo_a] @ [hi_b; lo_b; hi_b] = hi·hi + hi·lo + lo·hi, one exact sum
        hi_a, lo_a = split_bf16(a2)
        hi_b, lo_b = split_bf16(b2)
        left = np.concatenate([hi_a, hi_a, lo_a], axis=-1)
        right = np.concatenate([hi_b, lo_b, hi_b], axis=-2)
    out = _exact_to_float32(left.astype(np.float64), right.astype(np.float64))
    if vector_b:
        out = out[..., 0]
    if vector_a:
        out = out[..., 0, :] if not vector_b else out[..., 0]
    return out


def relative_error(result, reference) -> float:
    """‖result − reference‖ / ‖reference‖ (Frobenius norms, in float64): one number per matmul."""
    r = np.asarray(result, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if r.shape != ref.shape:
        raise ValueError(f"result and reference must have one shape, got {r.shape} and {ref.shape}")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return float(np.sqrt(np.sum((r - ref) ** 2) / np.sum(ref ** 2)))


def matmul_errors(a, b, *, tf32_rounding: str = "even") -> dict[str, float]:
    """The relative error (``relative_error``) of each mode's ``emulated_matmul(a, b, mode)``
    against the float64 product of the float32 inputs, as ``{mode: error}`` in ``MATMUL_MODES``'s
    order. "fp32" is the error of rounding the product to float32 alone."""
    a32, b32 = _float32("a", a), _float32("b", b)
    _check_shapes(a32, b32)
    reference = np.matmul(a32.astype(np.float64), b32.astype(np.float64))
    return {mode: relative_error(emulated_matmul(a32, b32, mode, tf32_rounding=tf32_rounding), reference)
            for mode in MATMUL_MODES}
