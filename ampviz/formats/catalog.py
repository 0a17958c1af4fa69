"""The built-in formats: the course's six (``FP32``, ``TF32``, ``FP16``, ``BF16``, ``FP8_E4M3``,
``FP8_E5M2``, gathered in ``FORMATS``), the low-precision ones behind block scaling (fnuz fp8, fp6,
fp4, E8M0; ``ALL_FORMATS`` holds all twelve), and ``get_format``, which finds one by name, by
torch/numpy dtype or by itself.
"""

from __future__ import annotations

import numpy as np

from ampviz.formats.beyond_ieee import E8M0Format, FiniteFormat, FnuzFormat
from ampviz.formats.inputs import _describe
from ampviz.formats.spec import FloatFormat


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
