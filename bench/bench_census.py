"""Census speed on 10 million float32 gradient-like values.

Prints times and ratios against the plain torch approach (multiply, cast, compare) run in the same
process, since this machine is shared and noisy. Targets (on a 2-core machine): census of 10M values
<= 30 ms; re-evaluating a profile at another power-of-two scale <= 1 ms.

    .venv/bin/python bench/bench_census.py
"""

import time

import numpy as np
import torch

from ampviz.formats.census import census, census_reference, profile

N = 10_000_000


def best_ms(fn, repeat=7):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def torch_census(x: torch.Tensor, scale: float):
    """The plain way: multiply, cast to fp16, compare."""
    p = x * scale
    y = p.to(torch.float16).abs()
    zero = (x == 0).sum()
    return [zero, (y == 0).sum() - zero, ((y > 0) & (y < 2**-14)).sum(), torch.isinf(y).sum(), torch.isnan(y).sum()]


def main():
    rng = np.random.default_rng(0)
    v = (rng.standard_normal(N) * np.exp2(rng.normal(-16, 4, N))).astype(np.float32)
    v[rng.random(N) < 0.3] = 0  # many exact zeros, as in real gradients
    x = torch.from_numpy(v)

    # exactness first: the fast paths agree with the brute-force reference and with torch
    prof = profile(v)
    ref = census_reference(v, "fp16", 1024.0)
    assert census(v, "fp16", 1024.0) == ref == census(prof, "fp16", 1024.0)
    t = [int(c) for c in torch_census(x, 1024.0)]
    assert t == [ref.counts[k] for k in ("zero", "underflow", "subnormal", "overflow", "nan")]

    threads = torch.get_num_threads()
    base = best_ms(lambda: torch_census(x, 1024.0))
    rows = [(f"plain torch ({threads} threads): multiply, cast, compare (baseline)", base)]
    torch.set_num_threads(1)
    rows.append(("plain torch (1 thread)", best_ms(lambda: torch_census(x, 1024.0))))
    torch.set_num_threads(threads)
    rows.append(("plain numpy: census_reference (classify every value)", best_ms(lambda: census_reference(v, "fp16", 1024.0), 2)))
    rows.append(("census(values, fp16, scale=2**10)", best_ms(lambda: census(v, "fp16", 1024.0))))
    rows.append(("census(values, fp16, scale=1000.0)", best_ms(lambda: census(v, "fp16", 1000.0))))
    rows.append(("census(values, fp8_e4m3, scale=2**20)", best_ms(lambda: census(v, "fp8_e4m3", 2.0**20))))
    rows.append(("profile(values)  (one pass, once)", best_ms(lambda: profile(v))))
    scales = [2.0**k for k in range(-8, 33)]
    for fmt in ("fp16", "bf16", "fp8_e5m2"):
        per = best_ms(lambda: [census(prof, fmt, s) for s in scales], 5) / len(scales)
        rows.append((f"census(profile, {fmt}, 2**k), per scale", per))
    print(f"{N:,} float32 values, torch {torch.__version__}; ampviz.formats.census runs on one thread\n")
    print(f"{'':60s} {'ms':>9s} {'x faster than torch':>20s}")
    for name, ms in rows:
        print(f"{name:60s} {ms:9.3f} {base / ms:20.1f}")


if __name__ == "__main__":
    main()
