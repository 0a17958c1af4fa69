"""Sentences the course used to teach and that real runs proved wrong stay out of it. Each entry
names the notebook, the old sentence (a fragment of it) and the test or checked cell that now holds
the corrected claim. Both sides of each notebook's pair are read (the .ipynb and its script in
notebook_scripts/, through Jupytext), with line breaks and indentation counted as one space, so
that rewrapping a paragraph cannot bring a sentence back."""

import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SCRIPTS = ROOT / "notebook_scripts"

WRONG = [
    # Transformer Engine ships current scaling too (Float8CurrentScaling): notebook 12 names both recipes
    ("12_fp8_scaling.py", "## 2. Current scaling (torchao) and delayed scaling (Transformer Engine)"),
    ("12_fp8_scaling.py", "(current scaling, as torchao does)"),
    ("12_fp8_scaling.py", '"current (torchao)": dict(recipe="current")'),
    # the 18-binade and 34% claims held for the synthetic log-normal stream only: N(0, 1) tensors span
    # about 14 binades and lose 0.22% (tests/formats/test_fp8_compare.py, notebook 12 sections 1 and 2)
    ("12_fp8_scaling.py", "FP8 keeps about 18 binades; one tensor's values already span more"),
    ("12_fp8_scaling.py", "1,789 of 2,000 steps lose at least 1% of their values to underflow: 34% on average"),
    ("12_fp8_scaling.py", "the same held-down scale that costs E4M3 34% of the values"),
    ("12_fp8_scaling.py", "Margin 3 pushes the smallest 1% of every tensor into underflow"),
    # saturation is the cast's, not the format's: tests/formats/test_formats.py::test_overflow_rules_match_each_librarys_cast
    ("01_fp16_range.py", "it *saturates* at 448"),
    ("01_fp16_range.py", "fp8 E4M3 saturates at 448"),
    # 240 is float8_e4m3fnuz's max: tests/formats/test_formats_lesson.py::test_the_fnuz_checker_holds_torchs_float8_e4m3fnuz
    ("01_fp16_range.py", "Which decoding mistake gives 240"),
    # unscale_ checks the scaled gradients, then divides (notebook 04 section 3)
    ("02_loss_scaling.py", "checks every gradient for inf and NaN after unscaling"),
    # step only skips; update() backs the scale off: notebook 02's checked walk_iteration(overflow=True)
    # cell and tests/training/test_gradscaler.py::test_step_skips_and_update_backs_off
    ("02_loss_scaling.py", "entirely and multiplies the scale by `backoff_factor`"),
    # the paper's 67% are zeros of its fp32 histogram, not fp16 underflow (notebook 02 section 3, text)
    ("02_loss_scaling.py", "67% of the activation gradients of a Multibox SSD detector were zero"),
    # notebook 01 section 5 defines ulp, binade and the ½-ulp rule; 03b points to that section
    ("03b_bf16_in_practice.py", "(the ½-ulp rule of notebook 01)"),
    # update() after unscale_ alone works: tests/training/test_gradscaler.py::test_every_error_case_has_its_exact_message
    ("04_gradscaler_internals.py", "`update()` needs a `step()` to count"),
    # get_scale() is _scale.item(): a blocking device-to-host sync on a GPU (notebook 04 section 7, text)
    ("04_gradscaler_internals.py", "once per step is cheap"),
    # a scale settles when backing off removes the overflow: notebook 06's checked cell and claims
    ("06_scaling_lab.py", "a scaler without hysteresis can only lower the scale"),
    ("06_scaling_lab.py", "what a dozen frameworks' loss scalers do"),
    # jmp's DynamicLossScale has no default loss_scale; the preset (JmpScaler) picks 2^15 (notebook 06 section 4)
    ("06_scaling_lab.py", "Keras and jmp start at 2^15"),
    # only the optimizers that overflow halve the scale: tests/pitfalls/test_pitfall_manual_backward.py
    ("08_lightning_manual_backward.py", "overflowing iteration divides the scale by 2^N"),
    # the stale weight copy is real on torch 2.13: tests/pitfalls/test_pitfall_autocast_cache.py
    ("09_lightning_autocast_cache.py", "Two independent changes made this safe:"),
    # FSDP1 with a plain GradScaler: the scales meet again at step 5; the half-model steps stay
    # (notebook 11a section 2c's checked cell: weights moved per step, steps with equal scales)
    ("11a_loss_scaling_across_ranks.py", "the scales part for good"),
    ("11a_loss_scaling_across_ranks.py", "They meet again at 2048 after step 5"),
    # DDP's bf16_compress_hook check is on the torch build (CUDA + NCCL 2.10+, or XPU + XCCL), not the
    # backend: notebook 11b section 2's checked error message
    ("11b_allreduce_numerics.py", "since DDP refuses torch's own `bf16_compress_hook` there"),
    # only torchao's fallback (eager, CPU, GPUs before SM100) takes a float32 log2; compiled on SM100+
    # _to_mx_rceil uses cvt.rp.satfinite.ue8m0x2.f32 (notebook 13 section 4, text)
    ("13_mx_and_nvfp4.py", "torchao 0.18 computes rceil as `ceil(log2(amax / max))` in float32"),
    ("13_mx_and_nvfp4.py", "torchao's float32 rceil is one step short"),
    # the PTX path also needs torch 2.12 or later (torchao's _to_mx_rceil checks torch_version_at_least):
    # tests/formats/test_format_errors.py::test_mx_scales_default_to_rceil_as_torchaos_configs_do
    ("13_mx_and_nvfp4.py", "Everywhere else (eager mode, the CPU, older GPUs) it falls back"),
    # torchao's MX configs default to rceil, so the lesson leads with it and shows floor as the trap
    # (same test; notebook 13 sections 3 and 8, checked cells)
    ("13_mx_and_nvfp4.py", "## 3. The floor rule saturates, rounding up does not"),
    ("13_mx_and_nvfp4.py", "at 4 bits NVFP4 beats MXFP4 on both weights and gradient"),
    ("13_mx_and_nvfp4.py", "Rounding the MX scales up removes the saturation:"),
]


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def sides_saying(stem: str, sentence: str, notebooks: Path = NOTEBOOKS, scripts: Path = SCRIPTS) -> list[str]:
    """The files of notebook ``stem``'s pair (.ipynb, script) whose cells contain ``sentence``."""
    sides = [notebooks / f"{stem}.ipynb", scripts / f"{stem}.py"]
    missing = [p.name for p in sides if not p.is_file()]
    assert not missing, f"no {missing}"
    return [p.name for p in sides
            if _words(sentence) in _words("\n".join(c.source for c in jupytext.read(p).cells))]


@pytest.mark.parametrize("name, sentence", WRONG, ids=[f"{n[:2]}: {s[:30]}" for n, s in WRONG])
def test_a_disproved_sentence_stays_out(name, sentence):
    assert sides_saying(Path(name).stem, sentence) == []


def test_a_sentence_is_found_on_either_side_across_line_breaks(tmp_path):
    """The check finds a sentence put back on one side only, wrapped differently."""
    stem, sentence = "06_scaling_lab", "a scaler without hysteresis can only lower the scale"
    original = jupytext.read(NOTEBOOKS / f"{stem}.ipynb")
    edited = jupytext.read(NOTEBOOKS / f"{stem}.ipynb")
    edited.cells[0].source += "\n\nOnly a scaler without\n  hysteresis can only lower the scale."
    for notebook, script, found in ((edited, original, [f"{stem}.ipynb"]), (original, edited, [f"{stem}.py"])):
        (tmp_path / "nb").mkdir(exist_ok=True)
        (tmp_path / "py").mkdir(exist_ok=True)
        jupytext.write(notebook, tmp_path / "nb" / f"{stem}.ipynb")
        jupytext.write(script, tmp_path / "py" / f"{stem}.py", fmt="py:percent")
        assert sides_saying(stem, sentence, tmp_path / "nb", tmp_path / "py") == found
        assert sides_saying(stem, "what a dozen frameworks' loss scalers do", tmp_path / "nb", tmp_path / "py") == []


def test_notebook_01_defines_the_words_later_notebooks_use():
    """03b cites "the ½-ulp rule of notebook 01, section 5": 01 defines ulp and binade there, before
    it first uses them."""
    cells = [c.source for c in jupytext.read(NOTEBOOKS / "01_fp16_range.ipynb").cells if c.cell_type == "markdown"]
    text = _words(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", "\n".join(cells)))  # glossary links read as their words
    section5 = text.index("## 5. Why a weight stops learning in fp16")
    assert text.index("The *ulp* (unit in the last place) of a number") > section5
    assert text.index("A *binade* is") > section5 and "the *½-ulp rule*" in text[section5:]
    assert "ulp" not in text[:section5] and "binade" not in text[:section5]
    assert "(the ½-ulp rule of notebook 01, section 5)" in _words(
        "\n".join(c.source for c in jupytext.read(NOTEBOOKS / "03b_bf16_in_practice.ipynb").cells))
