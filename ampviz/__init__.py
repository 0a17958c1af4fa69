"""ampviz: mixed-precision training, made visible.

Three layers (ARCHITECTURE.md): the numpy core (``formats``, ``scaling``, and ``text``, ``checks``,
``explain``, ``_args``), the torch side (``training``, ``ranks``, ``pitfalls``, ``env``) and the view
(``plots``, ``widgets``). This package loads only ``formats``, so ``import ampviz`` stays light:
numpy, no torch, plotly or ipywidgets.
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
