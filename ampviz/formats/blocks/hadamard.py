"""The NVFP4 recipe's random Hadamard transform: ``hadamard_matrix`` (diag(signs) @ H / sqrt(n),
by default with Transformer Engine's fixed signs ``TE_RHT_SIGNS``) and
``random_hadamard_transform``, which applies it to x in chunks of 16 along the last axis, each
output the exact sum rounded once to float32.
"""

from __future__ import annotations

import numpy as np

from ampviz.formats.blocks.common import _float32_blocks
from ampviz.formats.inputs import _describe, _real_array

#: The fixed signs of Transformer Engine's NVFP4 Hadamard transform (``get_wgrad_sign_vector``).
TE_RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


# ---------------------------------------------------------------- random Hadamard transform
def hadamard_matrix(signs=TE_RHT_SIGNS) -> np.ndarray:
    """The NVFP4 recipe's transform matrix diag(signs) @ H / sqrt(n), float64 (orthogonal).

    H is Sylvester's Hadamard matrix of size n = len(signs); ``signs``: n values ±1, by default
    Transformer Engine's fixed vector ``TE_RHT_SIGNS`` (n = 16). n must be a power of four (1, 4,
    16, 64, ...), so that 1/sqrt(n) is a power of two and the transform's products are exact.
    """
    s = _real_array(signs, "hadamard_matrix: signs")
    n = s.size
    if s.ndim != 1 or n < 1 or n & (n - 1) or (n.bit_length() - 1) % 2 or not np.all(np.abs(s) == 1):
        raise ValueError(f"signs must be a power-of-four count (16 for NVFP4) of ±1 values, got {_describe(signs)}")
    h = np.ones((1, 1))
    while h.shape[0] < s.size:
        h = np.block([[h, h], [h, -h]])
    return (s.astype(np.float64)[:, None] * h) / np.sqrt(n)


def random_hadamard_transform(x, signs=TE_RHT_SIGNS, *, inverse=False) -> np.ndarray:
    """The NVFP4 recipe's random Hadamard transform of x along its last axis, in chunks of
    len(signs) (16): each chunk c becomes c @ M, M = ``hadamard_matrix(signs)``, as Transformer
    Engine's reference ``x.view(-1, 16) @ (diag(s) @ H / 4)``. ``inverse``: c @ M.T (M is
    orthogonal, so this undoes the transform).

    Each output is the exact sum rounded once to float32 (M's entries are ±1/4 for 16, so every
    product is exact; a float32 matmul may differ in the last bit by its summation order).
    """
    m = hadamard_matrix(signs)
    n = m.shape[0]
    xb = _float32_blocks(x, n, "random_hadamard_transform").astype(np.float64)
    if not isinstance(inverse, (bool, np.bool_)):
        raise TypeError(f"inverse must be True or False, got {_describe(inverse)}")
    mat = m.T if inverse else m
    with np.errstate(over="ignore", invalid="ignore"):
        y = _exact_matmul_f32(xb, mat)
    return y.reshape(*xb.shape[:-2], xb.shape[-2] * n)


def _exact_matmul_f32(xb: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """xb @ mat with each output the exact sum rounded once to float32 (xb: float32 values as
    float64; mat: entries ±2**-j, so every product is exact in float64; inf and NaN as IEEE sums).

    Where a row's terms span few enough binades, float64 adds them exactly and one cast rounds.
    Elsewhere (rare: values 2**29 apart in one chunk) ``math.fsum`` gives the float64 nearest to
    the exact sum, nudged to round-to-odd so that the cast to float32 rounds it once.
    """
    terms = xb[..., :, None] * mat  # (..., n_in, n_out)
    y = terms.sum(axis=-2)
    a = np.abs(xb)
    nz = a > 0
    low = np.where(nz, np.maximum(np.frexp(np.where(nz, a, 1.0))[1] - 24, -149), 10_000).min(axis=-1)
    low = low + int(np.frexp(np.abs(mat[mat != 0]).min())[1]) - 1  # the products' lowest bit
    bound = np.abs(terms).sum(axis=-2).max(axis=-1, initial=0.0)
    exact = (bound < np.ldexp(1.0, np.minimum(low + 53, 1023))) | ~nz.any(axis=-1)
    if not exact.all():
        import math

        flat_terms = terms.reshape(-1, *terms.shape[-2:])
        flat_y = y.reshape(-1, y.shape[-1])
        for r in np.flatnonzero(~exact.reshape(-1)):
            for j in range(flat_y.shape[1]):
                col = flat_terms[r, :, j].tolist()
                if not all(map(math.isfinite, col)):
                    continue  # inf or NaN: the plain sum is what IEEE arithmetic gives
                near = math.fsum(col)
                rest = math.fsum(col + [-near])
                bits = np.float64(near).view(np.int64)
                if rest != 0 and bits % 2 == 0:  # round to odd: step toward the exact sum
                    near = float(np.nextafter(near, np.inf if rest > 0 else -np.inf))
                flat_y[r, j] = near
        y = flat_y.reshape(y.shape)
    return y.astype(np.float32)
