"""Block scaling, bit for bit: OCP MX (MXFP8, MXFP6, MXFP4) and NVIDIA's NVFP4.

A block format stores a small number per element and one shared scale per block of elements
along the last axis. Both families here are reproduced exactly as their reference libraries
compute them on the CPU, in float32 arithmetic, and where a reference departs from the format's
own rule the rule is followed and the departure is named.

**MX** (``mx_quantize``): blocks of 32 (``block_size``), an E8M0 scale X = 2**k per block, and
elements ``fmt.encode(clamp(x / X, ±max))`` (round to nearest even, saturating). The exponent k
comes from the block's largest magnitude amax and the element format's largest power of two
``emax`` (``fmt.emax``: 8 for E4M3, 15 for E5M2, 4 for E3M2, 2 for E2M3 and E2M1):

* ``"floor"`` (the OCP MX v1.0 rule): k = floor(log2 amax) - emax. amax/X can exceed ``max``
  (E4M3: 500 -> 448), which the clamp absorbs;
* ``"ceil"``: k = ceil(log2 amax) - emax;
* ``"even"``: k = floor(log2 amax') - emax, amax' being amax rounded to the element's mantissa
  bits (ties to even);
* ``"rceil"`` (NVIDIA's rule, the ``cvt.rp.satfinite.ue8m0x2.f32`` instruction): k =
  ceil(log2(amax / max)), computed exactly.

k is clamped to [-127, 127] (scale pattern k + 127). An all-zero block gets 2**-127 (pattern 0).
A block holding NaN gets the NaN scale 255 and dequantizes to NaN. A block holding ±inf (and no
NaN) gets 255 too under floor/ceil/even (log2 inf is beyond E8M0, as in the OCP reference code
``microxcaling``'s ``_quantize_mx``) and 254 under rceil (the saturating instruction, as in
Transformer Engine). The elements of a NaN-scale block do not matter; they are what torchao's
``to_mx`` computes for them: x / 2**128 under floor/ceil/even (±0, and NaN for NaN and ±inf),
the quiet NaN under rceil.

torchao 0.18's ``to_mx`` (eager, CPU) gives the same scale and element patterns on every block
except three, where it departs from the rule above (the tests show each):

1. floor/ceil/even, a nonzero block whose scale is 2**-127 (pattern 0, e.g. a float32-subnormal
   amax): torchao divides by 2**-126 (``F32_MIN_NORMAL``), half the stored scale;
2. floor/ceil/even, a block with ±inf: torchao stores the finite scale 2**(128 - emax) (pattern
   247 for E4M3) and divides by it: inf saturates to ±max, the rest become (nearly) 0;
3. rceil: torchao's float32 ``ceil(log2(amax / max))`` returns k for amax / max just above 2**k
   (log2 rounds to the integer), one scale too small, so the largest element saturates; and for
   a nonzero block with scale pattern 0 it multiplies by 1.0 instead of 2**127.

**NVFP4** (``nvfp4_quantize``): E2M1 elements in blocks of 16, an E4M3 scale per block and a
float32 scale for the tensor, exactly as torchao's ``nvfp4_quantize`` and
``per_tensor_amax_to_scale`` (decode scale amax / (448 * 6)); ``convention="te"`` follows
Transformer Engine's reference quantizer instead (block scales may go below 2**-6, down to 0;
-0 and NaN give pattern 0).

Also: ``stochastic_round`` (unbiased rounding to a format's grid, as NVFP4 training rounds
gradients) and ``random_hadamard_transform`` (the NVFP4 recipe's 16-point transform).

Inputs are numbers, lists, numpy arrays or torch tensors (read as in ``ampviz.formats``), rounded
to float32 first. Results are immutable: NamedTuples of read-only numpy arrays. This module needs
numpy only.

Speed: without ``rng``, both quantizers round the elements through a lookup table per element
format (built on first use from the exact encoder), in cache-sized chunks, and on large inputs
in one thread per processor (``bench/bench_blocks.py`` times them). Blocks holding NaN or inf, and
stochastic rounding, take the straightforward path (``_mx_reference``, ``_nvfp4_reference``),
which the fast one equals bit for bit (``tests/formats/test_blocks_fast.py``).
"""

from __future__ import annotations

# The code lives in the modules below (each imports its siblings directly): mx (MX), nvfp4 (NVFP4),
# stochastic (stochastic rounding), hadamard (the random Hadamard transform), common (the
# checks and element casts they share) and tables (the fast paths' tables, chunks and
# threads). The public API (``__all__``) and the private names other
# modules and tests use are re-exported.
from ampviz.formats.blocks.common import _element_codes, _element_values
from ampviz.formats.blocks.tables import (_INF_BITS, _PARALLEL_MIN, _abs_max_bits, _element_table,
    _ElementTable, _table_index)
from ampviz.formats.catalog import (  # noqa: F401
    E8M0,
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FP8_E4M3,
    FP8_E5M2,
    get_format,
)
from ampviz.formats.blocks.hadamard import TE_RHT_SIGNS, hadamard_matrix, random_hadamard_transform
from ampviz.formats.inputs import _TORCH_MAX_NAN, _describe, _real_array, _scalar_or_array  # noqa: F401
from ampviz.formats.blocks.mx import (MX_ELEMENT_FORMATS, MX_ROUNDING, MXBlocks, _mx_exponents, _mx_fast,
    _mx_reference, _mx_scale_codes, mx_quantize)
from ampviz.formats.blocks.nvfp4 import (NVFP4_CONVENTIONS, NVFP4Blocks, _e4m3_codes, _e4m3_lookup,
    _nvfp4_fast, _nvfp4_reference, nvfp4_quantize)
from ampviz.formats.spec import FloatFormat  # noqa: F401
from ampviz.formats.blocks.stochastic import stochastic_round

__all__ = [
    "MX_ELEMENT_FORMATS",
    "MX_ROUNDING",
    "NVFP4_CONVENTIONS",
    "TE_RHT_SIGNS",
    "MXBlocks",
    "NVFP4Blocks",
    "mx_quantize",
    "nvfp4_quantize",
    "stochastic_round",
    "hadamard_matrix",
    "random_hadamard_transform",
]
