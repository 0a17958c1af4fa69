"""The course's timings have one source: the "Minutes per lesson" table of TEACHING.md, with a
self-study and a class column per lesson. README's course table states the self-study minutes,
each lesson's section of TEACHING.md the class minutes (its slot, its per-section table and its
"In class" row), and both files state totals in prose ("In all: N minutes of self-study, M minutes
of class."). These tests hold every one of those numbers to the source, every lesson to one
sitting, and the workshop and class plans to their 90
minutes."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "TEACHING.md"
LESSONS = sorted(p.stem.split("_")[0] for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))



def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole line) up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines))
                if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start + 1:end])


def _tables(text: str) -> list[list[list[str]]]:
    """Every markdown table in ``text``: its rows (header and separator left out) as lists of cells."""
    tables, rows, header_seen = [], None, False
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows, header_seen = [], False
                continue  # the header
            if not header_seen and all(re.fullmatch(r":?-+:?", c) for c in cells):
                header_seen = True
                continue
            rows.append(cells)
        elif rows is not None:
            tables.append(rows)
            rows = None
    return tables


def _number(cell: str) -> int | None:
    bare = cell.replace("*", "").strip()
    return int(bare) if bare.isdigit() else None


def source() -> dict[str, tuple[int, int]]:
    """{lesson: (self-study minutes, class minutes)} from TEACHING.md's "Minutes per lesson" table."""
    section = _section(GUIDE.read_text(encoding="utf-8"), "## Minutes per lesson")
    table = next(t for t in _tables(section) if any("(#nb" in row[0] for row in t))
    minutes = {}
    for row in table:
        nn = re.search(r"\(#nb(\d\d[ab]?)\)", row[0]).group(1)
        assert nn not in minutes, f"lesson {nn} appears twice in TEACHING.md's Minutes per lesson"
        minutes[nn] = (_number(row[-2]), _number(row[-1]))
    return minutes


def sitting() -> tuple[int, int]:
    """(the most self-study minutes, the class minutes) that one sitting holds, as TEACHING.md states it."""
    found = re.search(r"\*\*One sitting\*\* holds at most (\d+) minutes of self-study, or one (\d+)-minute class",
                      GUIDE.read_text(encoding="utf-8"))
    assert found, "TEACHING.md states what one sitting holds"
    return int(found[1]), int(found[2])


def _guide_sections() -> dict[str, str]:
    parts = re.split(r'<a id="nb(\d\d[ab]?)"></a>', GUIDE.read_text(encoding="utf-8"))
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_source_table_has_every_lesson_and_both_kinds_of_minutes():
    minutes = source()
    assert sorted(minutes) == LESSONS
    assert [nn for nn, pair in minutes.items() if None in pair or 0 in pair] == []
    assert [nn for nn, (alone, in_class) in minutes.items() if alone > in_class] == [], \
        "a class runs the same lesson with discussion and demos: it takes at least the self-study minutes"


def test_readme_minutes_are_the_self_study_minutes():
    readme = README.read_text(encoding="utf-8")
    header = next(line for line in readme.splitlines() if line.startswith("| number | title |"))
    assert header.rstrip(" |").endswith("minutes")
    stated = {m[1]: int(m[2]) for m in re.finditer(r"^\| (\d\d[ab]?) \|.*\| (\d+) \|$", readme, flags=re.M)}
    expected = {nn: alone for nn, (alone, _) in source().items()}
    assert stated == expected, f"README minutes {stated}, TEACHING.md self-study minutes {expected}"


@pytest.mark.parametrize("nn", LESSONS)
def test_each_lessons_timing_table_adds_up_to_its_class_minutes(nn):
    """The slot in the heading, the sum of the per-section rows and any "In class" row all equal
    the lesson's class minutes; the open exercises (homework) are not counted."""
    in_class = source()[nn][1]
    section = _guide_sections()[nn]
    heading = re.search(r"^### Minutes per section \(a (\d+)-minute slot", section, flags=re.M)
    assert heading, f"{nn}: no 'Minutes per section (a N-minute slot' heading"
    assert int(heading[1]) == in_class, f"{nn}: the slot says {heading[1]}, the source {in_class}"
    table = _tables(section[heading.end():])[0]
    totals = [_number(row[1]) for row in table if "in class" in row[0].lower()]
    parts = [_number(row[1]) for row in table
             if "in class" not in row[0].lower() and not row[0].startswith("Open exercises")]
    assert None not in parts, f"{nn}: every section row states whole minutes"
    assert sum(parts) == in_class, f"{nn}: the sections add up to {sum(parts)}, the source says {in_class}"
    assert all(total == in_class for total in totals), f"{nn}: In class row {totals}, the source {in_class}"


@pytest.mark.parametrize("path", [README, GUIDE], ids=lambda p: p.name)
def test_totals_stated_in_prose_are_the_sums(path):
    minutes = source()
    sums = {"self-study": sum(a for a, _ in minutes.values()), "class": sum(c for _, c in minutes.values())}
    text = re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))
    sentences = re.findall(r"In all: [^.]*\.", text)
    stated = [(kind, int(n)) for s in sentences for n, kind in re.findall(r"(\d+) minutes of (self-study|class)", s)]
    assert ("self-study", sums["self-study"]) in stated, f"{path.name} states the self-study total"
    assert [(kind, n) for kind, n in stated if n != sums[kind]] == [], f"totals are {sums}"
    if path == GUIDE:
        assert ("class", sums["class"]) in stated


def test_every_lesson_fits_one_sitting():
    """No lesson is a double one: each fits one sitting alone and one class (03 and 11 were double
    lessons until each was split in two, 03a/03b and 11a/11b)."""
    alone_limit, class_limit = sitting()
    minutes = source()
    assert [nn for nn, (alone, _) in minutes.items() if alone > alone_limit] == [], \
        f"over {alone_limit} minutes of self-study"
    assert [nn for nn, (_, in_class) in minutes.items() if in_class > class_limit] == [], \
        f"every lesson fits one {class_limit}-minute class"


def test_the_workshop_and_the_three_classes_add_up_to_90_minutes():
    plans = _section(GUIDE.read_text(encoding="utf-8"), "## Planning a workshop or a short course")
    assert "### A 90-minute workshop" in plans and "### Three classes of 90 minutes" in plans
    tables = _tables(plans)
    assert len(tables) == 4, "one workshop table and three class tables"
    for table in tables:
        rows = [row for row in table if "total" not in row[1].lower()]
        total = [_number(row[0]) for row in table if "total" in row[1].lower()]
        assert total == [90], table
        assert sum(_number(row[0]) for row in rows) == 90, table
        named = {nn for row in rows for nn in re.findall(r"(?<![-^.])\b(\d\d[ab]?)\b", row[1] + " " + row[2])}
        assert named <= set(LESSONS), named - set(LESSONS)


def test_the_course_map_places_every_lesson_in_the_guide_the_readme_and_00():
    guide_map = _section(GUIDE.read_text(encoding="utf-8"), "## The course map")
    in_guide = {nn for row in _tables(guide_map)[0] for nn in re.findall(r"\b(\d\d[ab]?)\b", row[1])}
    assert in_guide == set(LESSONS)
    readme = README.read_text(encoding="utf-8")
    mermaid = re.search(r"```mermaid\n(.*?)```", readme, flags=re.S)
    assert mermaid, "README draws the course map as a Mermaid diagram"
    assert set(re.findall(r"\bn(\d\d[ab]?)\b", mermaid[1])) == set(LESSONS)
    start = (ROOT / "notebook_scripts" / "00_start_here.py").read_text(encoding="utf-8")
    in_00 = re.search(r"# ```mermaid\n(.*?)# ```", start, flags=re.S)
    assert in_00, "00 draws the course map as a Mermaid diagram (JupyterLab renders it)"
    assert re.sub(r"^# ", "", in_00[1], flags=re.M) == mermaid[1], "00 draws the same map as README"
