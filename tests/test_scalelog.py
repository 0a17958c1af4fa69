"""ampviz.scalelog: logs written from simulated traces read back, and verdicts on real scenarios."""

import numpy as np
import pytest

from ampviz import synth
from ampviz.scalelog import LOG_FORMATS, diagnose, read_log, write_log
from ampviz.scaling import TorchGradScaler, simulate


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
