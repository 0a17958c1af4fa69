"""Block-scaling speed: ``mx_quantize`` and ``nvfp4_quantize`` on 16,777,216 float32 values.

The data is one flat row of standard-normal float32 values (seed 0), blocks along it. Each case
prints our time, torchao 0.18's time on the same values and the ratio ours / torchao (the target
is <= 1.0): MX as torchao's ``to_mx(t, dtype, 32, mode)`` for the five element formats and the four
scale roundings, NVFP4 as ``per_tensor_amax_to_scale`` + ``nvfp4_quantize`` on rows of 1024.
torchao's calls return scales and packed elements only; ours also return the dequantized values.

Times are medians of a few repeats, ours and torchao's taken in turns, since the machine is
shared and noisy: 5 for floor and NVFP4, 3 for the other roundings, cut to 3 and 1 once a case
has run for 2 s (so that the script stays near a minute on a busy machine). Both use every
processor (torch its intra-op threads, printed; ours one thread per processor). Each function
runs once first on a small slice (our element tables are built then), and before timing the
scales and element patterns of both are checked equal on the first 2**20 values.
Without torchao, one line says so and the script exits 0.

    .venv/bin/python bench/bench_blocks.py
"""

import os
import statistics
import sys
import time

import numpy as np

from ampviz.formats.blocks import MX_ELEMENT_FORMATS, MX_ROUNDING, mx_quantize, nvfp4_quantize

N = 1 << 24
CHECK = 1 << 20
BUDGET = 2.0  # seconds per case before the repeats are cut to the least number


def load_torchao():
    """torchao's MX and NVFP4 entry points, or None when torchao does not import."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # its CUDA kernels: not needed
    try:
        import torch
        from torchao.prototype.mx_formats import config, kernels, mx_tensor, nvfp4_tensor
    except Exception as exc:  # ImportError, or a torch too old for torchao
        print(f"bench_blocks: torchao is not importable ({type(exc).__name__}: {exc}); nothing to compare")
        return None
    dtypes = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "fp6_e3m2": "fp6_e3m2",
              "fp6_e2m3": "fp6_e2m3", "fp4_e2m1": torch.float4_e2m1fn_x2}

    def to_mx(t, name, mode):
        return mx_tensor.to_mx(t, dtypes[name], 32, config.ScaleCalculationMode(mode))

    def nvfp4(t):
        scale = nvfp4_tensor.per_tensor_amax_to_scale(t.abs().max())
        return nvfp4_tensor.nvfp4_quantize(t.reshape(-1, 1024), 16, scale)

    return torch, kernels, to_mx, nvfp4


def check_equal(torch, kernels, to_mx, nvfp4, x):
    """Both give the same scale and element patterns (floor rounding, and NVFP4)."""
    part = x[:CHECK]
    t = torch.from_numpy(part)
    for name in MX_ELEMENT_FORMATS:
        scale, data = to_mx(t, name, "floor")
        data = kernels.unpack_uint4(data) if name == "fp4_e2m1" else data.view(torch.uint8)
        ours = mx_quantize(part, name)
        assert np.array_equal(ours.scales, scale.view(torch.uint8).numpy().reshape(-1)), name
        assert np.array_equal(ours.codes, data.numpy().reshape(-1)), name
    scales, data = nvfp4(t)
    ours = nvfp4_quantize(part.reshape(-1, 1024))
    assert np.array_equal(ours.scales.reshape(-1), scales.view(torch.uint8).numpy().reshape(-1))
    assert np.array_equal(ours.codes.reshape(-1), kernels.unpack_uint4(data).numpy().reshape(-1))


def medians(ours, theirs, repeat, least):
    """Median seconds of each function, run in turns: ``repeat`` times, or ``least`` times once a
    case has taken ``BUDGET`` seconds (on a busy machine torchao's slow cases take seconds each)."""
    a, b = [], []
    start = time.perf_counter()
    while len(a) < repeat and (len(a) < least or time.perf_counter() - start < BUDGET):
        for fn, times in ((ours, a), (theirs, b)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def main():
    loaded = load_torchao()
    if loaded is None:
        return 0
    torch, kernels, to_mx, nvfp4 = loaded
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    t = torch.from_numpy(x)
    check_equal(torch, kernels, to_mx, nvfp4, x)  # also the first (untimed) call of each
    for name in MX_ELEMENT_FORMATS:
        for mode in MX_ROUNDING:
            mx_quantize(x[:4096], name, 32, mode), to_mx(t[:4096], name, mode)

    print(f"{N:,} standard-normal float32 values, one row; torch threads: {torch.get_num_threads()}")
    print(f"{'case':<34} {'ours ms':>9} {'torchao ms':>11} {'ratio':>7}")
    worst = 0.0
    cases = [(name, mode) for mode in MX_ROUNDING for name in MX_ELEMENT_FORMATS]
    for name, mode in cases:
        ours, theirs = medians(lambda: mx_quantize(x, name, 32, mode), lambda: to_mx(t, name, mode),
                               *((5, 3) if mode == "floor" else (3, 1)))
        worst = max(worst, ours / theirs) if mode == "floor" else worst
        print(f"{f'mx_quantize {name} {mode}':<34} {1e3 * ours:9.1f} {1e3 * theirs:11.1f} {ours / theirs:7.2f}")
    ours, theirs = medians(lambda: nvfp4_quantize(x), lambda: nvfp4(t), 5, 3)
    worst = max(worst, ours / theirs)
    print(f"{'nvfp4_quantize (torchao convention)':<34} {1e3 * ours:9.1f} {1e3 * theirs:11.1f} {ours / theirs:7.2f}")
    print(f"largest ratio over the floor and NVFP4 cases: {worst:.2f} (target <= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
