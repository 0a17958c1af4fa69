"""Every lesson ends with exercises whose checkers work, and 00_start_here links every lesson.

The run that answers the exercises is also a lesson's run on another machine: its kernel computes
with SSE4.2 kernels in MKL and oneDNN, torch's plain C++ kernels and 3 threads
(``tests/checked_outputs.py``), and every checked cell's outputs must equal the stored ones.

An exercise cell is a code cell with the line ``answer = None`` followed by a checker call, which
answers with one fixed line. ``tests/exercise_solutions.py`` holds, for each lesson
(``notebooks/0N_*.ipynb``), ``SOLUTIONS``: for each exercise cell, found by a phrase that only that
cell contains, a correct answer and a plausible wrong one, as source text.

``test_checkers_answer_three_ways_and_checked_outputs_hold_on_another_machine`` takes the lesson's cells with two copies of each exercise cell
inserted after it (``answer = <wrong>``, ``answer = <right>``), executes them once in a fresh
kernel of this environment, and reads the three lines: "not answered yet", "✗ not quite" and
"✓ correct".
"""

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
LESSONS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))
UNANSWERED = "answer = None"
EXPECTED = {"unanswered": "not answered yet", "wrong": "✗ not quite", "right": "✓ correct"}
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


sys.path.insert(0, str(ROOT / "tools"))  # the refresh tool, imported as the tools import each other
import run_notebooks  # noqa: E402  (executes with its SlicedPollClient: no stall on widget output)
from checked_outputs import differences, variant_env  # noqa: E402  (tests/, on the path as pytest runs them)
from exercise_solutions import SOLUTIONS  # noqa: E402

VARIANT = "SSE4.2 kernels, plain C++ kernels, 3 threads"


def lesson_cells(path: Path) -> list[tuple[str, str]]:
    """A notebook's cells as (kind, source text) pairs."""
    return [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]


def notebook_of(path: Path, cells) -> nbformat.NotebookNode:
    """The notebook at ``path`` (its kernel and metadata) with ``cells`` in place of its own."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = [nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
                for kind, text in cells]
    return nb


def exercise_cells(cells) -> list[int]:
    """Indices (in CELLS) of the code cells that set ``answer = None``."""
    return [i for i, (kind, text) in enumerate(cells)
            if kind == "code" and any(line.strip() == UNANSWERED for line in text.splitlines())]


def solution_keys(cells, solutions) -> dict[int, str]:
    """Each exercise cell's SOLUTIONS key; AssertionError listing every exercise without exactly
    one solution, every solution that matches no exercise or several, and malformed entries."""
    assert isinstance(solutions, dict), "tests/exercise_solutions.py has no SOLUTIONS dict for this lesson"
    exercises = exercise_cells(cells)
    problems = [] if exercises else ["no exercise cell (a code cell with `answer = None`)"]
    keys = {}
    for i in exercises:
        found = [k for k in solutions if k in cells[i][1]]
        if len(found) == 1:
            keys[i] = found[0]
        else:
            first = cells[i][1].splitlines()[0]
            problems.append(f"cell {i} ({first!r}): {len(found)} SOLUTIONS keys match, expected 1")
    for key, answers in solutions.items():
        hits = [i for i in exercises if key in cells[i][1]]
        if len(hits) != 1:
            problems.append(f"SOLUTIONS[{key!r}] matches {len(hits)} exercise cells, expected 1")
        if not (isinstance(answers, tuple) and len(answers) == 2 and all(isinstance(a, str) for a in answers)):
            problems.append(f"SOLUTIONS[{key!r}] is not a (right, wrong) pair of source texts")
            continue
        for answer in answers:
            try:
                compile(answer, key, "eval")
            except SyntaxError:
                problems.append(f"SOLUTIONS[{key!r}]: {answer!r} is not an expression")
    assert not problems, "\n".join(problems)
    return keys


def answered(text: str, answer: str) -> str:
    """An exercise cell's source with ``answer = None`` replaced by ``answer = <answer>``."""
    return "\n".join(f"answer = {answer}" if line.strip() == UNANSWERED else line for line in text.splitlines())


def with_answers(lesson: list[tuple[str, str]], solutions: dict, where: dict | None = None):
    """(the cells with a wrong and a right copy after each exercise, [(cell index, key, status)]);
    ``where``, a dict, gets each lesson cell's index among the cells."""
    keys = solution_keys(lesson, solutions)
    cells, expect = [], []
    for i, (kind, text) in enumerate(lesson):
        if where is not None:
            where[i] = len(cells)
        cells.append((kind, text))
        if i in keys:
            right, wrong = solutions[keys[i]]
            expect.append((len(cells) - 1, keys[i], "unanswered"))
            for answer, status in ((wrong, "wrong"), (right, "right")):
                cells.append(("code", answered(text, answer)))
                expect.append((len(cells) - 1, keys[i], status))
    return cells, expect


def printed(cell) -> str:
    """Everything a cell showed as text: streams (stderr too) and text/plain results."""
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            out.append(o.data.get("text/plain", ""))
        elif o.output_type == "error":
            out.append(f"{o.ename}: {o.evalue}")
    return "".join(out)


# ----- every exercise has a solution (fast: no kernel) -----
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_exercise_has_a_solution(path):
    solution_keys(lesson_cells(path), SOLUTIONS.get(path.stem))


def test_every_solution_belongs_to_a_lesson():
    assert sorted(SOLUTIONS) == [p.stem for p in LESSONS]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_ends_with_exercises(path):
    """Check yourself, then the Summary with the open exercises; after it at most the lesson's
    claims (an "all claims hold" cell), so that no answer is printed between the questions and the
    summary. An exercise cell sits under Check yourself, or earlier as a prediction ("# Predict")
    placed before the cell that shows the answer."""
    cells = lesson_cells(path)
    headings = [line for kind, text in cells if kind == "markdown" for line in text.splitlines()
                if line.startswith("## ")]
    assert headings[-2:] == ["## Check yourself", "## Summary"], headings[-3:]
    summary_at = next(i for i, (kind, text) in enumerate(cells) if text.startswith("## Summary"))
    assert "**Open exercises**\n1. " in cells[summary_at][1]
    after = cells[summary_at + 1:]
    assert all(kind == "markdown" or "all claims hold" in text for kind, text in after), \
        "after the Summary only the lesson's claims may follow"
    check_at = next(i for i, (kind, text) in enumerate(cells) if text.startswith("## Check yourself"))
    assert not any("all claims hold" in text for _, text in cells[check_at:summary_at]), \
        "the claims cell gives the answers away: put it after the Summary"
    for i in exercise_cells(cells):
        assert check_at < i < summary_at or cells[i][1].lstrip().startswith("# Predict"), \
            f"exercise cell {i} is neither under Check yourself nor a prediction"


def test_missing_solutions_are_found():
    cells = [("markdown", "## Check yourself"),
             ("code", "# The first question?\nanswer = None\ncheck_first(answer)"),
             ("code", "# The second question?\nanswer = None\ncheck_second(answer)"),
             ("code", "x = 1  # answer = None in a comment is no exercise")]
    assert exercise_cells(cells) == [1, 2]
    assert solution_keys(cells, {"first": ("1", "2"), "second": ("'b'", "'a'")}) == {1: "first", 2: "second"}
    with pytest.raises(AssertionError, match=r"cell 2 \('# The second question\?'\): 0 SOLUTIONS keys match"):
        solution_keys(cells, {"first": ("1", "2")})
    with pytest.raises(AssertionError, match=r"SOLUTIONS\['question'\] matches 2 exercise cells"):
        solution_keys(cells, {"question": ("1", "2"), "second": ("1", "2")})
    with pytest.raises(AssertionError, match="not a \\(right, wrong\\) pair"):
        solution_keys(cells, {"first": ("1",), "second": ("1", "2")})
    with pytest.raises(AssertionError, match="is not an expression"):
        solution_keys(cells, {"first": ("answer = 1", "2"), "second": ("1", "2")})
    with pytest.raises(AssertionError, match="no SOLUTIONS"):
        solution_keys(cells, None)
    with pytest.raises(AssertionError, match="no exercise cell"):
        solution_keys(cells[3:], {})
    assert answered(cells[1][1], "2**-24") == "# The first question?\nanswer = 2**-24\ncheck_first(answer)"


# ----- every checker answers three ways (one kernel per notebook) -----
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_checkers_answer_three_ways_and_checked_outputs_hold_on_another_machine(path, tmp_path):
    solutions, where = SOLUTIONS[path.stem], {}
    cells, expect = with_answers(lesson_cells(path), solutions, where)
    nb = run_notebooks.execute(notebook_of(path, cells), env=variant_env(VARIANT, tmp_path))
    differ = differences(nbformat.read(path, as_version=4).cells, nb.cells, where)
    assert not differ, f"{path.name} with {VARIANT}:\n" + "\n".join(differ)
    wrong = []
    for index, key, status in expect:
        text = printed(nb.cells[index])
        ok = text.count("\n") <= 1 and (text.strip() == EXPECTED["right"] if status == "right"
                                         else text.startswith(EXPECTED[status]))
        if not ok:
            wrong.append(f"{key!r} answered {status}: printed {text!r}")
    assert not wrong, "\n".join(wrong)
    assert [s for _, _, s in expect].count("right") == len(solutions)


# ----- 00 links every lesson; no link points nowhere -----
def _markdown(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _title(path: Path) -> str:
    """A notebook's H1 title, without the "# "."""
    return nbformat.read(path, as_version=4).cells[0].source.splitlines()[0].removeprefix("# ")


def test_start_here_links_every_lesson():
    """The course map links every lesson notebook there is, by its title ("01 · The fp16 range: ...")."""
    text = _markdown(NOTEBOOK_DIR / "00_start_here.ipynb")
    lessons = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb") if not p.name.startswith("00"))
    assert len(lessons) >= 8
    titled = {target for label, target in LINK.findall(text)
              if target in lessons and label == _title(NOTEBOOK_DIR / target)}
    assert [name for name in lessons if name not in titled] == []
    assert "Check yourself" in text and "open exercises" in text  # where each lesson's exercises are


@pytest.mark.parametrize("path", sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb")), ids=lambda p: p.name)
def test_notebook_links_resolve(path):
    """Every relative link leads to a file; a link to a lesson carries that lesson's title."""
    broken, mislabelled = [], []
    for label, target in LINK.findall(_markdown(path)):
        if target.startswith(("http://", "https://", "#")):
            continue
        file = path.parent / target.split("#")[0]
        if not file.exists():
            broken.append(target)
        elif re.fullmatch(r"\d\d[ab]?_\w+\.ipynb", target) and label != _title(file):
            mislabelled.append((label, _title(file)))
    assert broken == [] and mislabelled == []


GUIDE = ROOT / "TEACHING.md"
GUIDE_HEADINGS = ("### Prerequisites", "### Minutes per section", "### One-slide recap", "### Check yourself: answers",
                  "### Open exercises: answers", "### What to demo live")


def _guide_sections() -> dict:
    """The teacher's guide, split at its per-notebook anchors (``<a id="nbNN"></a>``)."""
    parts = re.split(r'<a id="nb(\d\d[ab]?)"></a>', GUIDE.read_text(encoding="utf-8"))
    return {nn: text for nn, text in zip(parts[1::2], parts[2::2])}


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_the_teachers_guide_covers_every_notebook(path):
    """Every notebook links its section of TEACHING.md; the section has its title, the six parts a
    teacher needs, and as many answered open exercises as the notebook asks."""
    nn = path.stem.split("_")[0]
    notebook = path
    targets = [target for _, target in LINK.findall(_markdown(notebook))]
    assert (f"../TEACHING.md#nb{nn}" if nn != "00" else "../TEACHING.md") in targets
    sections = _guide_sections()
    assert nn in sections, f"TEACHING.md has no section nb{nn}"
    section = sections[nn]
    assert section.lstrip().startswith(f"## {_title(notebook)}"), section.lstrip().splitlines()[0]
    missing = [h for h in GUIDE_HEADINGS if h not in section]
    assert missing == [], missing
    cells = lesson_cells(path)
    summary = next(text for kind, text in cells if text.startswith("## Summary"))
    asked = len(re.findall(r"^\d+\. ", summary.split("**Open exercises**")[1], flags=re.M))
    answers = section.split("### Open exercises: answers")[1].split("\n### ")[0]
    answered = len(re.findall(r"^\d+\. ", answers, flags=re.M))
    assert answered == asked, f"{asked} open exercises, {answered} answered in the guide"


# ----- every lesson asks why at least twice, and shows the options its checker reads -----
def _choices():
    import importlib
    import pkgutil

    import ampviz
    from ampviz.checks import CHOICES
    for info in pkgutil.walk_packages(ampviz.__path__, "ampviz."):
        importlib.import_module(info.name)
    return CHOICES


def _comment_text(cell_text: str) -> str:
    """A code cell's comments, joined into one line with runs of spaces folded."""
    comments = [line.strip()[1:] for line in cell_text.splitlines() if line.strip().startswith("#")]
    return " ".join(" ".join(comments).split())


def asked_choices(cells) -> list[tuple[int, str]]:
    """(cell index, Choice name) for each exercise cell whose checker asks a Choice."""
    choices, asked = _choices(), []
    for i in exercise_cells(cells):
        called = re.search(r"^check_(\w+)\(answer\b", cells[i][1], flags=re.M)
        if called and called[1] in choices:
            asked.append((i, called[1]))
    return asked


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_asks_why_at_least_twice_with_the_options_its_checker_reads(path):
    cells, choices = lesson_cells(path), _choices()
    asked = asked_choices(cells)
    assert len(asked) >= 2, f"{path.stem} asks {len(asked)} questions that test an explanation, at least 2 wanted"
    for i, name in asked:
        shown = _comment_text(cells[i][1])
        question = choices[name]
        missing = [f"{letter}) {text}" for letter, text in question.options.items()
                   if f"{letter}) {' '.join(text.split())}" not in shown]
        assert missing == [], f"{path.stem} cell {i} does not show the options check_{name} reads: {missing}"
        assert question.letters.split(" or ")[-1] in shown or "letter" in shown


def test_every_why_question_is_asked_in_exactly_one_lesson():
    asked = [name for path in LESSONS for _, name in asked_choices(lesson_cells(path))]
    made = [name for name in _choices() if not name.startswith(("demo_", "bad", "twice"))]
    assert sorted(asked) == sorted(set(asked)), "a question asked twice"
    assert sorted(set(made) - set(asked)) == [], "questions the package makes but no lesson asks"
