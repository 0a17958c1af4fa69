"""The records of a live run: ``StepRecord`` (one step), ``Run`` (a run's records), and their CSV / JSON files.

``Run`` holds the records (thinned past ``max_records``), gives columns (``run["loss"]``) and
writes itself with ``to_csv`` / ``to_json``; ``load_run`` reads either back. A file that is not a
run is one ValueError line naming the file (``_not_a_run``); every field read is checked.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ampviz.formats.census import CensusResult
from ampviz._args import _shown
from ampviz.formats import CATEGORIES, get_format
from ampviz.training.live.config import TrainConfig


# ------------------------------------------------------------------ records
@dataclass
class StepRecord:
    """One training step.

    ``scale``: the loss scale this step used (None without a scaler); ``skipped``: the scaler
    skipped the optimizer step (``unscale_`` found an inf or NaN in the gradients: its
    ``found_inf``, which ``scaler.step`` reads to decide); ``grad_norm``: the L2 norm of the true (unscaled)
    gradients, inf or NaN when they overflowed; ``step_time``: seconds for data transfer, forward, backward and the
    optimizer step (the census is not counted); ``growth_tracker`` (after the update) and the three
    scaler settings in effect at this step (None without a scaler); ``param_census`` (by parameter
    name) and ``act_census`` (by watched module name): ``CensusResult`` of ``gradient × scale`` in
    ``census_fmt``, every ``census_every`` steps, else None. ``error``: set on the last record of a run
    that stopped on an exception, one sentence that says what happened (``failure_sentence``, e.g.
    "fp16 overflowed at step 4: the model's fp16 output went past 65504, so the loss is inf ...");
    its other fields may then be NaN or None. A scale of 0 (a collapsed scaler) is recorded like
    any other: its census counts every finite gradient as "zero" (all lost).
    """

    step: int
    loss: float = math.nan
    scale: float | None = None
    skipped: bool = False
    grad_norm: float = math.nan
    step_time: float = math.nan
    growth_tracker: int | None = None
    growth_factor: float | None = None
    backoff_factor: float | None = None
    growth_interval: int | None = None
    param_census: dict | None = None
    act_census: dict | None = None
    error: str | None = None
    grads: dict | None = field(default=None, repr=False, compare=False)

_SCALARS = ("step", "loss", "scale", "skipped", "grad_norm", "step_time", "growth_tracker",
            "growth_factor", "backoff_factor", "growth_interval", "error")
_CENSUSES = ("param_census", "act_census")


# ------------------------------------------------------------------ runs: collect, save, load
def _census_to_dict(c: CensusResult) -> dict:
    return {"fmt": c.fmt.name, "scale": c.scale, "total": c.total, "counts": dict(c.counts),
            "log2_bins": c.log2_bins.tolist(), "log2_counts": c.log2_counts.tolist()}


def _read_field(name: str, value, kind):
    """A number read from a file, checked: ``kind`` int (within int64) or float (an int stands
    for a float, as JSON writes 2.0 as 2 in other tools); anything else is a ValueError."""
    if not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int):
        if kind is int and -2**63 <= value < 2**63:
            return value
        if kind is float and (isinstance(value, float) or abs(value) < 2**1023):
            return float(value)
    raise ValueError(f"{name} must be {'a number' if kind is float else 'a whole number'}, not {_shown(value, 30)}")


def _census_from_dict(d) -> CensusResult:
    if not isinstance(d, dict):
        raise ValueError(f"a census must be an object with fmt, scale, total, counts, log2_bins, log2_counts, "
                         f"not {_shown(d, 30)}")
    counts, bins, hist = d.get("counts"), d.get("log2_bins"), d.get("log2_counts")
    if not isinstance(counts, dict) or set(counts) != set(CATEGORIES):
        raise ValueError(f"a census's counts must give {', '.join(CATEGORIES)}, not {_shown(counts, 30)}")
    if not isinstance(bins, list) or not isinstance(hist, list) or len(bins) != len(hist):
        raise ValueError("a census's log2_bins and log2_counts must be two lists of whole numbers of one length")
    return CensusResult(fmt=get_format(d.get("fmt")), scale=_read_field("scale", d.get("scale"), float),
                        total=_read_field("total", d.get("total"), int),
                        counts={k: _read_field(k, counts[k], int) for k in CATEGORIES},
                        log2_bins=np.array([_read_field("log2_bins", b, int) for b in bins], dtype=np.int64),
                        log2_counts=np.array([_read_field("log2_counts", c, int) for c in hist], dtype=np.int64))


def _record_to_dict(rec: StepRecord) -> dict:
    out = {k: getattr(rec, k) for k in _SCALARS}
    for k in _CENSUSES:
        c = getattr(rec, k)
        out[k] = None if c is None else {n: _census_to_dict(v) for n, v in c.items()}
    return out


def _record_from_dict(d) -> StepRecord:
    """A StepRecord from the fields a file holds (censuses as dicts), each checked (ValueError)."""
    if not isinstance(d, dict):
        raise ValueError(f"a step must be an object of fields, not {_shown(d, 30)}")
    kw = {}
    for k in _SCALARS:
        v = d.get(k)
        if k == "skipped" and not isinstance(v, bool):
            raise ValueError(f"skipped must be true or false, not {_shown(v, 30)}")
        if k == "error" and not (v is None or isinstance(v, str)):
            raise ValueError(f"error must be text, not {_shown(v, 30)}")
        if k not in ("skipped", "error") and (v is not None or k == "step"):
            v = _read_field(k, v, int if k in _INT_FIELDS else float)
        kw[k] = v
    for k in _CENSUSES:
        c = d.get(k)
        if not (c is None or isinstance(c, dict)):
            raise ValueError(f"{k} must be an object of censuses by name, not {_shown(c, 30)}")
        kw[k] = None if c is None else {n: _census_from_dict(v) for n, v in c.items()}
    return StepRecord(**kw)

_INT_FIELDS = {"step", "growth_tracker", "growth_interval"}
_FLOAT_FIELDS = {"loss", "scale", "grad_norm", "step_time", "growth_factor", "backoff_factor"}


def _csv_cell(key, value) -> str:
    if value is None:
        return ""
    if key in _CENSUSES:
        return json.dumps({n: _census_to_dict(v) for n, v in value.items()}, separators=(",", ":"))
    return repr(value) if isinstance(value, float) else str(value)


def _parse_cell(key, text: str):
    if text == "":
        return None
    if key in _CENSUSES:
        return json.loads(text)  # checked by _record_from_dict
    if key in _INT_FIELDS:
        return int(text)
    if key in _FLOAT_FIELDS:
        return float(text)
    if key == "skipped":
        return text == "True"
    return text

_CSV_COLUMNS = _SCALARS + _CENSUSES
_CSV_MAGIC = "# ampviz run "


@dataclass
class Run:
    """The records of one run, with its config and device line; ``run["loss"]`` is a column
    (numpy float array, None as NaN; census columns as lists).

    ``max_records`` bounds the memory of a long run (a live widget's): when more records than that
    are held, the run keeps every ``stride``-th step (``stride`` doubles each time), the skipped
    steps more densely (every ``stride // 8``-th), the failed step and the last one, and drops the
    others. ``steps_recorded`` and ``skipped_recorded`` count every step appended, kept or not.
    ``None`` (the default) keeps every record.
    """

    config: TrainConfig
    records: list = field(default_factory=list)
    device: str = ""
    max_records: int | None = None
    stride: int = 1
    steps_recorded: int = 0
    skipped_recorded: int = 0

    def __post_init__(self):
        if self.max_records is not None and (isinstance(self.max_records, bool)
                                             or not isinstance(self.max_records, int) or self.max_records < 16):
            raise ValueError(f"max_records must be None or an integer >= 16, got {self.max_records!r}")
        if not self.steps_recorded and self.records:
            self.steps_recorded = len(self.records)
            self.skipped_recorded = sum(bool(r.skipped) for r in self.records)

    def append(self, rec: StepRecord) -> None:
        self.records.append(rec)
        self.steps_recorded += 1
        self.skipped_recorded += bool(rec.skipped)
        if self.max_records is not None and len(self.records) > self.max_records:
            self._thin()

    def _thin(self) -> None:
        """Double the stride until at most half of ``max_records`` records are kept."""
        recs, last = self.records, self.records[-1]
        while len(recs) > self.max_records // 2:
            self.stride *= 2
            s, s_skip = self.stride, max(self.stride // 8, 1)
            recs = [r for r in recs if r.step % s == 0 or r.error is not None or r is last
                    or (r.skipped and r.step % s_skip == 0)]
        self.records = recs

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key):
        values = [getattr(r, key) for r in self.records]
        if key in _CENSUSES or key == "error":
            return values
        return np.array([math.nan if v is None else v for v in values], dtype=float)

    @property
    def error(self) -> str | None:
        return self.records[-1].error if self.records else None

    def _header(self) -> dict:
        return {"config": asdict(self.config), "device": self.device}

    def to_json(self, path) -> Path:
        """Write the run as JSON (non-finite floats as NaN / Infinity, as Python's json does)."""
        path = Path(path)
        data = {**self._header(), "records": [_record_to_dict(r) for r in self.records]}
        path.write_text(json.dumps(data))
        return path

    def to_csv(self, path) -> Path:
        """Write the run as CSV: a ``# ampviz run {...}`` line with the config, then one row per
        step; census columns hold JSON."""
        path = Path(path)
        with open(path, "w", newline="") as f:
            self._write_csv_head(f)
            writer = csv.writer(f)
            for rec in self.records:
                writer.writerow([_csv_cell(k, getattr(rec, k)) for k in _CSV_COLUMNS])
        return path

    def _write_csv_head(self, f) -> None:
        f.write(_CSV_MAGIC + json.dumps(self._header()) + "\n")
        csv.writer(f).writerow(_CSV_COLUMNS)

    @classmethod
    def from_json(cls, path) -> "Run":
        """Read a JSON file written by ``to_json`` (any other content: one ValueError line)."""
        text = _run_text(path)
        with _reading(path, "its content"):
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("records"), list):
                raise ValueError("it is not a JSON object with config, device and a list of records")
            config, device = _config_from_dict(data.get("config")), _device_line(data)
        with _reading(path, "a step"):
            return cls(config=config, device=device, records=[_record_from_dict(d) for d in data["records"]])

    @classmethod
    def from_csv(cls, path) -> "Run":
        """Read a CSV written by ``to_csv`` or saved row by row by ``run_training``. A last row cut
        off (the kernel died while writing it) is dropped: every complete row is kept. Any other
        content is one ValueError line."""
        text = _run_text(path)
        first, sep, rest = text.partition("\n")
        if not first.startswith(_CSV_MAGIC):
            raise _not_a_run(path, f"it is not an ampviz run (its first line should start with {_CSV_MAGIC!r})")
        if not sep:
            raise _not_a_run(path, "it ends inside its first line: the run's settings were never written "
                                   "completely, and no step was recorded")
        with _reading(path, "the run's settings on its first line"):
            head = json.loads(first[len(_CSV_MAGIC):])
            if not isinstance(head, dict):
                raise ValueError("it is not a JSON object with config and device")
            config, device = _config_from_dict(head.get("config")), _device_line(head)
        with _reading(path, "its rows"):
            rows = list(csv.reader(io.StringIO(rest, newline="")))
        if rest and not rest.endswith("\n"):
            rows = rows[:-1]  # the row in progress when the file was cut
        records = []
        if rows:  # (a header line cut short was dropped above: no step had been written yet)
            columns, rows = rows[0], rows[1:]
            unknown = [c for c in columns if c not in _CSV_COLUMNS]
            if unknown:
                raise _not_a_run(path, f"unknown column {_shown(unknown[0], 30)}, not an ampviz run")
            for n, row in enumerate(rows, start=3):
                if len(row) != len(columns):
                    raise _not_a_run(path, f"line {n} has {len(row)} fields where the header has {len(columns)}")
                cells = dict(zip(columns, row))
                with _reading(path, f"line {n}, a step"):
                    records.append(_record_from_dict({k: _parse_cell(k, cells.get(k, "")) for k in _CSV_COLUMNS}))
        return cls(config=config, device=device, records=records)


def _config_from_dict(d) -> TrainConfig:
    if not isinstance(d, dict):
        raise ValueError(f"the config must be an object of TrainConfig's settings, not {_shown(d, 30)}")
    known = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in d.items() if k in known})


def _device_line(head: dict) -> str:
    device = head.get("device", "")
    if not isinstance(device, str):
        raise ValueError(f"the device must be text, not {_shown(device, 30)}")
    return device


_EXPECTED_RUN = "expected an ampviz run as Run.to_json, Run.to_csv or run_training(save_to=...) writes it"


def _not_a_run(path, why: str) -> ValueError:
    """One line: the file, what is wrong with it, and what was expected."""
    return ValueError(f"{path}: {' '.join(str(why).split())}; {_EXPECTED_RUN}")


@contextlib.contextmanager
def _reading(path, what: str):
    """Turn what a malformed file raises while ``what`` is read into one ``_not_a_run`` line."""
    try:
        yield
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, csv.Error) as e:
        raise _not_a_run(path, f"cannot read {what} ({str(e)[:150]})") from None


def _run_text(path) -> str:
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_a_run(path, "it is not text (not UTF-8: a binary file?)") from None


def load_run(path) -> Run:
    """Read a run written by ``Run.to_csv`` or ``Run.to_json`` (or saved as it went by ``run_training``);
    a ``.json`` file as JSON, any other as CSV. A file that is not such a run (binary, other JSON,
    damaged) is one ValueError line that names the file and says what was expected."""
    path = Path(path)
    return Run.from_json(path) if path.suffix.lower() == ".json" else Run.from_csv(path)
