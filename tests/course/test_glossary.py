"""GLOSSARY.md: every entry has an English term, a Chinese term and a definition; the terms the
course relies on are there with the Chinese word Chinese writing on mixed precision uses; README
and TEACHING.md link it."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "GLOSSARY.md"
LESSONS = {p.stem.split("_")[0] for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")}
CJK = re.compile(r"[\u4e00-\u9fff]")

#: English term (found in the English column) → the Chinese term its row must give.
REQUIRED = {
    "underflow": "下溢",
    "overflow": "上溢",
    "subnormal": "次正规数",
    "denormal": "次正规数",
    "ulp": "ulp",
    "binade": "binade",
    "mantissa": "尾数",
    "significand": "尾数",
    "exponent": "指数",
    "bias": "偏置",
    "loss scaling": "损失缩放",
    "dynamic loss scaling": "动态损失缩放",
    "master weights": "主权重",
    "autocast": "autocast",
    "automatic mixed precision": "自动混合精度",
    "mixed precision": "混合精度",
    "stochastic rounding": "随机舍入",
    "block scaling": "块缩放",
    "amax": "amax",
    "saturation": "饱和",
    "all-reduce": "全归约",
    "rank": "rank",
    "fp16": "半精度",
    "bf16": "BF16",
    "fp8": "FP8",
    "MX": "MX",
    "NVFP4": "NVFP4",
}


def entries() -> list[list[str]]:
    """The glossary table's rows as [English, 中文, definition, lesson]."""
    lines = GLOSSARY.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*English\s*\|\s*中文\s*\|", line))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_every_entry_has_both_languages_a_definition_and_a_lesson():
    rows = entries()
    assert len(rows) >= len(set(REQUIRED.values()))
    assert [r for r in rows if len(r) != 4] == []
    assert [r[0] for r in rows if not re.search(r"[A-Za-z]", r[0]) or CJK.search(r[0])] == [], "English column"
    assert [r[0] for r in rows if not CJK.search(r[1])] == [], "every entry needs its Chinese term"
    assert [r[0] for r in rows if len(r[2].split()) < 4] == [], "every entry needs a definition"
    assert [r[0] for r in rows if not set(re.findall(r"\d\d[ab]?", r[3])) or set(re.findall(r"\d\d[ab]?", r[3])) - LESSONS] == []
    english = [r[0].lower() for r in rows]
    assert len(english) == len(set(english)), "no entry twice"


@pytest.mark.parametrize("term", REQUIRED)
def test_the_course_terms_are_there_with_their_chinese_term(term):
    pattern = re.compile(rf"(?<![\w-]){re.escape(term)}(?![\w-])", flags=re.I)
    rows = [r for r in entries() if pattern.search(r[0])]
    assert rows, f"GLOSSARY.md has no entry for {term!r}"
    assert any(REQUIRED[term] in r[1] for r in rows), f"{term!r}: expected {REQUIRED[term]} in {[r[1] for r in rows]}"


@pytest.mark.parametrize("page", ["README.md", "TEACHING.md"])
def test_readme_and_the_teachers_guide_link_the_glossary(page):
    assert re.search(r"\]\(GLOSSARY\.md\)", (ROOT / page).read_text(encoding="utf-8")), f"{page} links GLOSSARY.md"


def test_every_lesson_links_the_glossary():
    """Each notebook (00 to 13) links GLOSSARY.md near its top, on both sides of its pair."""
    root = Path(__file__).resolve().parents[2]
    lessons = sorted((root / "notebook_scripts").glob("[01][0-9]*_*.py"))
    assert len(lessons) == 16
    for script in lessons:
        head = script.read_text()[:4000]
        assert "](../GLOSSARY.md" in head, f"{script.name} does not link the glossary near its top"
        notebook = root / "notebooks" / (script.stem + ".ipynb")
        assert "](../GLOSSARY.md" in notebook.read_text(), f"{notebook.name} does not link the glossary"
