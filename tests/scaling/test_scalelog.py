"""ampviz.scaling.scalelog: logs as the frameworks print them (tests/data/scaler_logs, sources in its
SOURCES.md) read exactly, logs written from simulated traces and from recorded scales read back,
and verdicts on real scenarios."""

import math
import re
import time
from itertools import zip_longest
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampviz.scaling import synth
from ampviz.training.gradscaler import run_real_scaler
from ampviz.scaling.scalelog import LOG_FORMATS, diagnose, read_log, scale_lines, write_log
from ampviz.scaling import DynamicScaler, StaticScaler, TorchGradScaler, simulate

CORPUS = Path(__file__).resolve().parents[1] / "data" / "scaler_logs"


def trace_of(scenario, strength, steps=60_000, **kw):
    g = synth.scenario(scenario, steps, strength, np.random.default_rng(0))
    return simulate(TorchGradScaler(**kw), grad_max=g)


@pytest.mark.parametrize("style", list(LOG_FORMATS))
def test_write_then_read_gives_the_scale_after_each_backoff(style):
    t = trace_of("spikes", 0.5)
    text = write_log(t, style)
    backed_off = np.flatnonzero(t.skipped)
    after = np.append(t.scale[1:], t.final.scale)[backed_off]
    assert np.array_equal(read_log(text), after.astype(np.float64))
    assert len(text.splitlines()) == backed_off.size > 0


def test_real_log_lines_are_read():
    text = "\n".join([
        "epoch 1 | loss 2.31",
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768, reducing to 16384",
        "2024 | INFO | NOTE: overflow detected, setting loss scale to: 8192.0",
        "Gradient overflow.  Skipping step, loss scaler 3 reducing loss scale to 4096.0",
    ])
    assert list(read_log(text)) == [32768.0, 16384.0, 8192.0, 4096.0]


def test_verdicts_on_scenarios():
    assert diagnose(read_log(write_log(trace_of("steady", 0.5, growth_interval=200)))).verdict == "sawtooth"
    assert diagnose(read_log(write_log(trace_of("spikes", 0.5)))).verdict == "ratchet"
    collapse = diagnose(read_log(write_log(trace_of("spikes", 1.0))))
    assert collapse.verdict == "collapse" and "no longer protected" in collapse.reason
    assert diagnose([65536.0, 32768.0]).verdict == "unclear"
    assert diagnose([]).verdict == "unclear"
    assert diagnose([4.0, 2.0, np.nan]).verdict == "collapse"


def test_unknown_style():
    with pytest.raises(ValueError, match="unknown log style"):
        write_log(trace_of("steady", 0.0, steps=10), "keras")


# ---------------------------------------------------------------- only what the framework prints
def test_a_stopped_run_prints_nothing_after_it_stopped():
    """A scaler that raises at its minimum stops the run: its scale is NaN from then on and every
    step counts as skipped, but nothing backs off any more (the log used to invent a "reducing loss
    scale to nan" line for each of those steps)."""
    flags = np.ones(1000, bool)
    t = simulate(DynamicScaler(name="raises", init_scale=2.0**17, min_scale=2.0**15, raise_at_min=True),
                 found_inf=flags)
    assert t.stopped_at == 2
    for style in LOG_FORMATS:
        text = write_log(t, style)
        assert read_log(text).tolist() == [65536.0, 32768.0], style
        assert [line.split(":")[0] for line in text.splitlines()] == ["step 0", "step 1"]


@pytest.mark.parametrize("scale", [1024.0, float("nan"), float("inf"), 0.0])
def test_a_static_scale_never_prints_reducing(scale):
    t = simulate(StaticScaler(scale), found_inf=np.ones(50, bool))
    assert t.skipped_count == 50
    assert write_log(t) == "" and write_log(t, "deepspeed") == ""


def test_absorbed_overflows_print_nothing_but_real_backoffs_do():
    flags = np.zeros(100, bool)
    flags[[10, 30, 31]] = True  # hysteresis 2: the lone overflow is absorbed, the pair backs off once
    t = simulate(DynamicScaler(hysteresis=2, refill="clean"), found_inf=flags)
    assert write_log(t).splitlines() == [
        "step 31: Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0"]
    nan_backoff = simulate(TorchGradScaler(backoff_factor=float("nan")), found_inf=[False, True, True])
    assert write_log(nan_backoff, "fairseq") == (
        "step 1: NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: nan")


def test_write_log_refuses_what_is_not_a_trace():
    with pytest.raises(TypeError, match="trace must be a ScalerTrace"):
        write_log([65536.0, 32768.0])
    with pytest.raises(ValueError, match="unknown log style"):
        write_log(trace_of("steady", 0.0, steps=10), ["apex"])


# ---------------------------------------------------------------- read_log in linear time
def crafted_lines(n: int) -> list:
    """Lines that almost match, each about n characters: long runs of digits where a pattern
    expects a number followed by more text (the old number pattern split such a run in every
    possible way: 8,000 digits took 2-6 s, 20,000 took 17 s), and a line's key repeated."""
    digits = "1" * n
    return [
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: " + digits,
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: " + digits + ", reducing to x",
        "[deepspeed] OVERFLOW! Rank " + digits,
        "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1111" * (n // 58),
        "Gradient overflow." + " " * n + "Skipping",
        "Gradient overflow.  Skipping step, loss scaler " + digits,
        "Skipping step. Attempted loss scale: " + digits + ", but hysteresis is " + digits,
        "loss scale fell from " + digits + " to x",
        "loss scale fell from 1111 to" * (n // 28),
        "| loss scale: " + digits + " | number of skipped iterations: " + "0" * n + " |",
        "| loss scale: 1111" * (n // 18) + " number of skipped iterations: 0",
        "number of skipped iterations: " + digits,
        "overflow detected, ignoring gradient, setting loss scale to:" * (n // 60),
        "AMP: overflow detected, setting scale to to" * (n // 43),
    ]


def best_seconds(fn, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_read_log_is_linear_on_crafted_lines():
    for line in crafted_lines(200_000):
        assert read_log(line).size == 0
    # 40 times the input: a linear reader takes 40 to 70 times as long (caches), a quadratic one 1,600 times.
    # The bound sits far from both, so a busy machine's noise cannot cross it.
    small, big = "\n".join(crafted_lines(5_000)), "\n".join(crafted_lines(200_000))
    assert best_seconds(lambda: read_log(big)) < 400 * best_seconds(lambda: read_log(small))
    # a real line with a 200,000-digit scale is still read (as the float it denotes)
    assert read_log("NOTE: overflow detected, setting loss scale to: " + "1" * 200_000).tolist() == [float("inf")]


def test_read_log_reads_the_numbers_the_frameworks_print():
    lines = ["Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.5e-05",
             "[deepspeed] OVERFLOW! Rank 3 Skipping step. Attempted loss scale: 2, reducing to 1",
             "NOTE: overflow detected, setting loss scale to: 0.0001",
             "NOTE: overflow detected, setting loss scale to: -inf",
             "NOTE: overflow detected, setting loss scale to: nan",
             "NOTE: overflow detected, setting loss scale to: 12.",
             "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 3E+38"]
    got = read_log("\n".join(lines))
    assert got[:4].tolist() == [1.5e-05, 1.0, 0.0001, -np.inf] and np.isnan(got[4])
    assert got[5:].tolist() == [12.0, 3e38]
    assert read_log(b"NOTE: overflow detected, setting loss scale to: 8.0").tolist() == [8.0]
    with pytest.raises(TypeError, match="text must be a log's text"):
        read_log(None)


# ---------------------------------------------------------------- diagnose odd input
def test_infinite_scales_are_a_collapse_not_a_ratchet():
    d = diagnose([np.inf] * 5)
    assert d.verdict == "collapse" and "infinite" in d.reason and "inf to inf" not in d.reason
    assert diagnose([65536.0, np.inf]).verdict == "collapse"


def test_odd_scales():
    assert diagnose([-65536.0, 65536.0, -65536.0, 65536.0]).verdict == "sawtooth"  # judged by magnitude
    assert diagnose([-65536.0] * 2 + [-256.0] * 2).verdict == "ratchet"
    assert diagnose([-0.5, 65536.0]).verdict == "collapse"
    assert diagnose(np.array([4096, 2048, 4096, 2048], np.int64)).verdict == "sawtooth"
    assert diagnose(()).verdict == "unclear"


@pytest.mark.parametrize("scales, error, message", [
    ("65536 32768", TypeError, "not text: pass it through read_log first"),
    (["a", "b"], TypeError, "scales must be the scales a log reports"),
    ([[65536.0, 32768.0]], ValueError, "got an array of shape (1, 2)"),
    (65536.0, ValueError, "got a single value 65536.0"),
    (None, TypeError, "not None"),
    ([65536.0, None], TypeError, "scales must be"),
    ([True, False], TypeError, "got bool values"),
    ([10**400], ValueError, "too large for a float"),
])
def test_diagnose_says_what_to_pass(scales, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        diagnose(scales)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- logs as the frameworks print them
NAN = float("nan")
#: every corpus file and the scale after each overflow line, in order (derivations in SOURCES.md)
EXPECTED = {
    "apex_amp.log": [32768.0, 16384.0, 8192.0, 8192.0],
    "apex_fp16_utils.log": [32768.0, 32768.0, 16384.0, 16384.0, 8192.0, 8192.0],
    "deepspeed_zero.log": [32768.0, 16384.0, 16384.0],
    "deepspeed_zero_min_scale.log": [2.0, 1.0, NAN],
    "deepspeed_fused.log": [32768.0, 16384.0, 8192.0, 8192.0],
    "deepspeed_unfused.log": [32768.0, 16384.0, 8192.0],
    "fairseq.log": [64.0, 32.0, 32.0],
    "fairseq_v0.10.log": [64.0, 32.0, 16.0],
    "fairseq_min_scale.log": [0.00048828125, 0.000244140625, 0.0001220703125, NAN],
    "fairseq_amp.log": [64.0, 64.0, 32.0, 16.0],
    "metaseq.log": [2.0, 1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125],
    "megatron.log": [4294967296.0, 8388608.0, 32768.0, 32768.0],
}


def corpus(name: str) -> str:
    return (CORPUS / name).read_text(encoding="utf-8")


def same(got, expected) -> bool:
    return np.array_equal(np.asarray(got, np.float64), np.asarray(expected, np.float64), equal_nan=True)


def test_the_corpus_is_what_sources_md_describes():
    """Every file is in the list above and has its section in SOURCES.md, whose "read_log gives"
    states the same scales as the list."""
    files = sorted(p.name for p in CORPUS.glob("*.log"))
    assert files == sorted(EXPECTED)
    sources = corpus("SOURCES.md")
    sections = dict(re.findall(r"^## (\S+\.log): .*?\n(.*?)(?=^## |\Z)", sources, re.S | re.M))
    assert sorted(sections) == files
    for name, section in sections.items():
        stated = re.search(r"read_log gives `\[([^\]]*)\]`", section).group(1)
        assert same([float(x) for x in stated.split(",")], EXPECTED[name]), name
        # each cites its source: the repository, and the tag or commit read
        assert re.search(r"Repository `[\w.-]+/[\w.-]+`, (tag `[\w.]+`|commit `[0-9a-f]{40}`)", section), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_framework_log_is_read_exactly(name):
    text = corpus(name)
    assert same(read_log(text), EXPECTED[name])
    assert same(read_log(text.encode("utf-8")), EXPECTED[name])
    assert same(read_log(text.replace("\n", "\r\n")), EXPECTED[name])  # a log saved on Windows


def test_the_old_fairseq_pattern_misses_the_current_fairseq_line():
    """The pattern read_log had ("overflow detected, setting loss scale to") reads fairseq 0.10's
    line but not 0.12's, which says "gradient overflow detected, ignoring gradient, ..."."""
    old = re.compile(r"overflow detected, setting loss scale to: ([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
    def old_read(text):
        return [float(m.group(1)) for line in text.splitlines() if (m := old.search(line))]
    assert old_read(corpus("fairseq.log")) == [] and read_log(corpus("fairseq.log")).tolist() == [64.0, 32.0, 32.0]
    assert old_read(corpus("metaseq.log")) == []
    assert old_read(corpus("fairseq_v0.10.log")) == read_log(corpus("fairseq_v0.10.log")).tolist() == [64.0, 32.0, 16.0]


def test_the_old_apex_and_deepspeed_patterns_miss_lines_the_frameworks_print():
    """read_log's old apex pattern wanted "loss scaler N", which apex.fp16_utils does not print;
    its DeepSpeed pattern wanted "OVERFLOW! Rank N", which DeepSpeed without ZeRO does not print."""
    apex = re.compile(r"Gradient overflow\\.\\s+Skipping step, loss scaler \\d+ reducing loss scale to")
    deepspeed = re.compile(r"OVERFLOW! Rank \\d+ Skipping step\\. Attempted loss scale: \\S+, reducing to")
    assert not any(apex.search(line) for line in corpus("apex_fp16_utils.log").splitlines())
    for name in ("deepspeed_fused.log", "deepspeed_unfused.log"):
        assert not any(deepspeed.search(line) for line in corpus(name).splitlines()), name
        assert read_log(corpus(name)).size == 3 + (name == "deepspeed_fused.log")


def test_hysteresis_lines_are_not_backoffs():
    """DeepSpeed's "Attempted loss scale: X, but hysteresis is h. Reducing hysteresis to h-1" skips
    the step and keeps the scale: read_log does not count it (reading X from it, as a looser
    pattern would, adds the scale that overflowed as if it were a scale after a backoff)."""
    text = corpus("deepspeed_zero.log")
    hysteresis = [line for line in text.splitlines() if "Reducing hysteresis to" in line]
    assert len(hysteresis) == 2 and read_log("\n".join(hysteresis)).size == 0
    loose = [float(m.group(1)) for line in text.splitlines()
             if (m := re.search(r"Attempted loss scale: (\d+)", line))]
    assert loose == [65536.0, 65536.0, 32768.0, 32768.0, 32768.0] != EXPECTED["deepspeed_zero.log"]
    # the same in Megatron: a progress line counts skips, and the scale may not have moved
    assert read_log(corpus("megatron.log")).tolist()[-1] == 32768.0


def test_each_deepspeed_overflow_is_counted_once():
    """Without ZeRO, DeepSpeed logs each overflow twice ("Reducing dynamic loss scale from X to Y",
    then "... Attempted loss scale: X, reducing to Y"): read_log counts the second only."""
    for name in ("deepspeed_fused.log", "deepspeed_unfused.log"):
        lines = corpus(name).splitlines()
        echoes = [line for line in lines if "Reducing dynamic loss scale from" in line]
        assert len(echoes) == len(EXPECTED[name]) and read_log("\n".join(echoes)).size == 0
        growth = [line for line in lines if "Increasing dynamic loss scale" in line]
        assert read_log("\n".join(growth)).size == 0


def test_a_line_every_rank_prints_comes_once_per_rank():
    text = corpus("apex_fp16_utils.log")
    rank0 = "\n".join(line for line in text.splitlines() if line.startswith("[default0]:"))
    assert read_log(rank0).tolist() == [32768.0, 16384.0, 8192.0]
    assert read_log(text).tolist() == [32768.0, 32768.0, 16384.0, 16384.0, 8192.0, 8192.0]


def test_the_end_of_a_run_is_nan_once_however_many_ranks_print_it():
    stop = "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
    ov = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1"
    assert same(read_log("\n".join([ov, stop, stop, stop])), [1.0, NAN])
    assert same(read_log("\n".join([ov, stop, ov, stop])), [1.0, NAN, 1.0, NAN])  # a restarted run
    amp = ("FloatingPointError: AMP: Minimum loss scale reached (0.0001). Your loss is probably exploding. "
           "Try restarting training or use fp32. 6.103515625e-05")
    assert same(read_log("AMP: overflow detected, setting scale to to 0.0001220703125\n" + amp),
                [0.0001220703125, NAN])
    for name in ("deepspeed_zero_min_scale.log", "fairseq_min_scale.log"):
        d = diagnose(read_log(corpus(name)))
        assert d.verdict == "collapse" and "stopped at its minimum scale" in d.reason, name


def test_megatron_progress_lines_count_only_without_overflow_lines():
    """Megatron prints no overflow line; its progress lines with skipped iterations give the scale.
    Megatron-DeepSpeed prints DeepSpeed's overflow lines as well: then those are the record, and
    the progress lines (which would count the same overflows again) are not read."""
    megatron, zero = corpus("megatron.log"), corpus("deepspeed_zero.log")
    assert read_log(megatron).tolist() == EXPECTED["megatron.log"]
    both = "\n".join(a + "\n" + b for a, b in zip_longest(megatron.splitlines(), zero.splitlines(), fillvalue=""))
    assert read_log(both).tolist() == EXPECTED["deepspeed_zero.log"]
    quiet = [line for line in megatron.splitlines() if "number of skipped iterations:   0" in line]
    assert len(quiet) == 3 and read_log("\n".join(quiet)).size == 0


def test_verdicts_on_the_framework_logs():
    assert diagnose(read_log(corpus("metaseq.log"))).verdict == "collapse"  # 0.03125, and it stays
    for name in ("deepspeed_zero.log", "fairseq.log", "fairseq_v0.10.log", "deepspeed_unfused.log"):
        assert diagnose(read_log(corpus(name))).verdict == "unclear", name  # three messages
    # the scales alone do not show that apex's first three overflows came in consecutive steps (a
    # calibration): the log reads as a fall, as diagnose's docstring warns; without them it does not
    apex = read_log(corpus("apex_amp.log"))
    assert diagnose(apex).verdict == "ratchet" and diagnose(apex[2:]).verdict == "unclear"


# each style's template filled with a corpus line's numbers is that line (as the framework printed it)
STYLE_SAMPLES = {
    "apex": ("apex_amp.log", None, "32768.0"),
    "apex_fp16_utils": ("apex_fp16_utils.log", None, "32768.0"),
    "deepspeed": ("deepspeed_zero.log", "65536", "32768"),
    "deepspeed_fused": ("deepspeed_fused.log", "65536", "32768.0"),
    "deepspeed_unfused": ("deepspeed_unfused.log", "65536", "32768.0"),
    "fairseq": ("fairseq.log", None, "64.0"),
    "fairseq_amp": ("fairseq_amp.log", None, "64.0"),
}


@pytest.mark.parametrize("style", sorted(STYLE_SAMPLES))
def test_each_style_is_the_frameworks_wording(style):
    name, old, new = STYLE_SAMPLES[style]
    line = LOG_FORMATS[style][0].format(old=old, new=new)
    assert any(printed.endswith(line) for printed in corpus(name).splitlines()), line
    assert read_log(line).tolist() == [float(new)]
    assert set(LOG_FORMATS) == set(STYLE_SAMPLES) | {"ampviz"}


def test_older_wordings_are_read():
    lines = [
        "| WARNING: overflow detected, setting loss scale to: 64.0",  # fairseq 0.9
        "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768.0",
        "[deepspeed] OVERFLOW! Skipping step. Attempted loss scale: 2048.0, reducing to 1024.0 ",  # 0.3
        "[deepspeed] fp16 dynamic loss scale overflow! Rank 1 Skipping step. Attempted loss scale: 512, "
        "reducing to 256",  # ZeRO 2 in 0.5.0
        "OVERFLOW within closure! Skipping step, reducing loss scale to 128.0",  # apex fp16_utils
        "Gradient overflow, skipping update",  # apex's old amp.init() API: no scale, not counted
        "Consecutive hysteresis is enabled. Restoring hysteresis to 2",
        "AMP: skipping this batch.",
    ]
    assert read_log("\n".join(lines)).tolist() == [64.0, 32768.0, 1024.0, 256.0, 128.0]


# ---------------------------------------------------------------- scale_lines: a log from recorded scales
def test_scale_lines_matches_write_log_of_the_same_run():
    for scenario, strength in (("spikes", 0.5), ("steady", 0.5), ("spikes", 1.0)):
        t = trace_of(scenario, strength, steps=20_000)
        history = np.append(t.scale, t.final.scale)
        assert scale_lines(history) == write_log(t, "ampviz") != ""


def test_scale_lines_on_the_real_gradscaler():
    """The docstring's recipe on the real torch.amp.GradScaler("cpu"): the scale before training,
    then get_scale() after each update(); every line is a step GradScaler really skipped."""
    flags = np.zeros(300, bool)
    flags[[0, 1, 40, 41, 42, 250]] = True
    run = run_real_scaler(flags, growth_interval=100)
    text = scale_lines(np.append(run.scale, run.final_scale))
    steps = [int(line.split(":")[0].split()[1]) for line in text.splitlines()]
    assert steps == np.flatnonzero(run.skipped).tolist() == [0, 1, 40, 41, 42, 250]
    assert read_log(text).tolist() == run.scale_after[run.skipped].astype(np.float64).tolist()
    assert read_log(text).tolist() == [32768.0, 16384.0, 8192.0, 4096.0, 2048.0, 4096.0]
    # what a growth looks like is no line: the scale rose at steps 142 and 242
    assert run.scale_after[142] == 2 * run.scale[142] and "step 142:" not in text


def test_scale_lines_edges():
    assert scale_lines([]) == "" and scale_lines([65536.0]) == "" and scale_lines(np.array([4.0, 8.0])) == ""
    assert scale_lines([4, 2]) == "step 0: skipped, loss scale fell from 4.0 to 2.0"
    assert scale_lines([4.0, NAN, NAN, 2.0]) == "step 0: skipped, loss scale fell from 4.0 to nan"
    assert scale_lines([math.inf, 65536.0, -math.inf]).splitlines() == [
        "step 0: skipped, loss scale fell from inf to 65536.0",
        "step 1: skipped, loss scale fell from 65536.0 to -inf"]


@pytest.mark.parametrize("scales, error, message", [
    ("65536 32768", TypeError, "scales must be the loss scale the first step used"),
    (None, TypeError, "not None"),
    ([[65536.0, 32768.0]], ValueError, "got an array of shape (1, 2)"),
    (65536.0, ValueError, "got a single value 65536.0"),
    ([True, False], TypeError, "got bool values"),
    ([65536.0, "a"], TypeError, "scales must be"),
    ([10**400, 1.0], ValueError, "too large for a float"),
])
def test_scale_lines_says_what_to_pass(scales, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        scale_lines(scales)
    assert "\n" not in str(info.value) and "read_log first" not in str(info.value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=30))
def test_scale_lines_reads_back(scales):
    s = np.array(scales, np.float64)
    text = scale_lines(scales)
    fell = [i for i in range(len(s) - 1) if s[i + 1] < s[i] or (math.isnan(s[i + 1]) and not math.isnan(s[i]))]
    assert [int(line.split(":")[0].split()[1]) for line in text.splitlines()] == fell
    assert same(read_log(text), s[1:][fell] if fell else [])
