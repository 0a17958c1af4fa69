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
    """Each notebook (00 to 14) links GLOSSARY.md near its top, on both sides of its pair."""
    root = Path(__file__).resolve().parents[2]
    lessons = sorted((root / "notebook_scripts").glob("[01][0-9]*_*.py"))
    assert len(lessons) == 17
    for script in lessons:
        head = script.read_text()[:4000]
        assert "](../GLOSSARY.md" in head, f"{script.name} does not link the glossary near its top"
        notebook = root / "notebooks" / (script.stem + ".ipynb")
        assert "](../GLOSSARY.md" in notebook.read_text(), f"{notebook.name} does not link the glossary"


# ----- each term is linked where it first appears -----
#: How each entry (by its anchor) is written in a lesson's prose; the introducing lesson (the first
#: in the entry's "lesson" column) links its first occurrence to GLOSSARY.md#<anchor>.
FORMS = {
    "fp32": r"\bfp32\b", "fp16": r"\bfp16\b", "bf16": r"\bbf16\b", "fp8": r"\b[fF][pP]8\b",
    "mx": r"\bMX\b", "nvfp4": r"\bNVFP4\b", "e8m0": r"\bE8M0\b", "sign-bit": r"\bsign bits?\b",
    "exponent": r"\bexponents?\b", "bias": r"\bbias\b", "mantissa": r"\b(?:mantissa|significand)s?\b",
    "binade": r"\bbinades?\b", "ulp": r"\bulps?\b", "round-to-nearest": r"\bround(?:s|ed|ing)? to (?:the )?nearest\b",
    "normal-number": r"\bnormal numbers?\b", "subnormal": r"\b(?:subnormal|denormal)s?\b",
    "underflow": r"\bunderflow(?:s|ed|ing)?\b", "overflow": r"\boverflow(?:s|ed|ing)?\b",
    "saturation": r"\bsaturat(?:ion|es|ed|ing|e)\b", "mixed-precision": r"\bmixed[- ]precision\b",
    "amp": r"\bAMP\b", "autocast": r"\bautocast\b", "weight-cache": r"\bweight cache\b",
    "master-weights": r"\bmaster weights?\b", "lost-update": r"\blost updates?\b|\bupdates? (?:is|are) lost\b",
    "loss-scaling": r"\bloss scaling\b", "loss-scale": r"\bloss scales?\b",
    "dynamic-loss-scaling": r"\bdynamic (?:loss )?scal(?:ing|ers?)\b", "gradscaler": r"\bGradScaler\b",
    "skipped-step": r"\bskip(?:ped|s)? (?:the |a |that |this |its )?(?:optimizer )?steps?\b",
    "gradient-clipping": r"\b(?:gradient )?clipping\b", "stochastic-rounding": r"\bstochastic rounding\b",
    "per-tensor-scaling": r"\bper-tensor scal(?:ing|es?)\b|\bscale per tensor\b", "delayed-scaling": r"\bdelayed scaling\b",
    "amax": r"\bamax\b", "block-scaling": r"\b(?:per-)?block scal(?:ing|es?)\b|\bscale per block\b", "hadamard": r"\bHadamard\b",
    "rank": r"\branks?\b", "world-size": r"\bworld size\b", "all-reduce": r"\ball-reduce\b",
    "ddp": r"\bDDP\b", "fsdp": r"\bFSDP\b", "tf32": r"\bTF32\b",
}
_MASKED = re.compile(r"\[[^\]]*\]\([^)]*\)|`[^`]*`|<[^>]+>|https?://\S+")


def anchors() -> dict[str, list[str]]:
    """{anchor: the lessons of its entry}, the anchors read from ``<a id="..."></a>`` in the English column."""
    found = {}
    for row in entries():
        anchor = re.match(r'<a id="([a-z0-9-]+)"></a>', row[0])
        assert anchor, f"entry {row[0]!r} has no <a id> anchor"
        found[anchor[1]] = re.findall(r"\d\d[ab]?", row[3])
    return found


def prose(script_text: str) -> list[str]:
    """A lesson script's markdown lines that are prose: not headings, not fenced code, not the title."""
    lines, fenced, in_markdown = [], False, False
    for line in script_text.splitlines():
        if line.startswith("# %%"):
            in_markdown = "[markdown]" in line
            continue
        if not in_markdown or not line.startswith("#"):
            continue
        text = line[2:] if line.startswith("# ") else line[1:]
        if text.startswith("```"):
            fenced = not fenced
            continue
        if fenced or text.startswith("#"):
            continue
        lines.append(text)
    return lines


def first_use(script_text: str, anchor: str):
    """(line index, the line) of the first prose line that names the entry outside links and code
    spans, or where the entry's glossary link stands, whichever comes first; None if neither."""
    pattern = re.compile(FORMS[anchor])
    target = f"](../GLOSSARY.md#{anchor})"
    for i, line in enumerate(prose(script_text)):
        if target in line or pattern.search(_MASKED.sub(" ", line)):
            return i, line
    return None


def _script(nn: str) -> Path:
    return next((ROOT / "notebook_scripts").glob(f"{nn}_*.py"))


def test_every_entry_has_an_anchor_and_a_way_to_find_it():
    assert sorted(anchors()) == sorted(FORMS)


@pytest.mark.parametrize("anchor", sorted(FORMS))
def test_each_term_is_linked_where_its_lesson_first_uses_it(anchor):
    """In the lesson that introduces the term (the first of its entry's lessons), the first prose
    line that names it links it to its glossary entry."""
    lesson = anchors()[anchor][0]
    text = _script(lesson).read_text(encoding="utf-8")
    found = first_use(text, anchor)
    assert found, f"{lesson} never names {anchor!r}: fix the entry's lesson column"
    assert f"](../GLOSSARY.md#{anchor})" in found[1], \
        f"{lesson}'s first use of {anchor!r} is not linked to the glossary: {found[1]!r}"


def test_the_first_use_finder_sees_links_code_and_headings():
    text = "\n".join(["# %% [markdown]", "# ## About fp16", "# `fp16` in code, [fp16](x.md) linked",
                      "# ```", "# fp16 in a fence", "# ```", "# %%", "# fp16 in a code cell comment",
                      "# %% [markdown]", "# then fp16 itself, and [fp16](../GLOSSARY.md#fp16)"])
    assert first_use(text, "fp16") == (1, "then fp16 itself, and [fp16](../GLOSSARY.md#fp16)")
    assert first_use("# %% [markdown]\n# a [loss scale](../GLOSSARY.md#loss-scale)", "loss-scale")[0] == 0
    assert first_use("# %% [markdown]\n# nothing here", "fp16") is None
