"""Sentences the course used to teach and that real runs proved wrong stay out of it. Each entry
names the notebook source, the old sentence (a fragment of it) and the test or checked cell that
now holds the corrected claim."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "tools" / "notebook_sources"

WRONG = [
    # saturation is the cast's, not the format's: tests/test_formats.py::test_overflow_rules_match_each_librarys_cast
    ("01_fp16_range.py", "it *saturates* at 448"),
    ("01_fp16_range.py", "fp8 E4M3 saturates at 448"),
    # 240 is float8_e4m3fnuz's max: tests/test_lessons.py::test_the_fnuz_checker_holds_torchs_float8_e4m3fnuz
    ("01_fp16_range.py", "Which decoding mistake gives 240"),
    # unscale_ checks the scaled gradients, then divides (notebook 03 section 3)
    ("02_loss_scaling.py", "checks every gradient for inf and NaN after unscaling"),
    # update() after unscale_ alone works: tests/test_gradscaler.py::test_every_error_case_has_its_exact_message
    ("03_gradscaler_internals.py", "`update()` needs a `step()` to count"),
    # a scale settles when backing off removes the overflow: notebook 04's checked cell and claims
    ("04_scaling_lab.py", "a scaler without hysteresis\n      can only lower the scale"),
    ("04_scaling_lab.py", "what a dozen frameworks' loss scalers do"),
    # only the optimizers that overflow halve the scale: tests/test_pitfall_manual_backward.py
    ("06_lightning_manual_backward.py", "overflowing iteration divides the scale by 2^N"),
    # the stale weight copy is real on torch 2.13: tests/test_pitfall_autocast_cache.py
    ("07_lightning_autocast_cache.py", "Two independent changes made this safe:"),
]


@pytest.mark.parametrize("name, sentence", WRONG, ids=[f"{n[:2]}: {s[:30]}" for n, s in WRONG])
def test_a_disproved_sentence_stays_out(name, sentence):
    text = (SOURCES / name).read_text(encoding="utf-8")
    assert sentence not in text
