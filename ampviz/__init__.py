"""ampviz: mixed-precision training, made visible.

The core (``formats``, ``census``) needs numpy only; torch, plotly and ipywidgets are imported by
the modules that need them (``training``, ``plots``, ``widgets``), so ``import ampviz`` stays light.
"""

from ampviz.formats import (
    BF16,
    CATEGORIES,
    FORMATS,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    TF32,
    FloatFormat,
    get_format,
)

__version__ = "0.1.0"

__all__ = [
    "BF16", "CATEGORIES", "FORMATS", "FP8_E4M3", "FP8_E5M2", "FP16", "FP32", "TF32",
    "FloatFormat", "get_format", "__version__",
]
