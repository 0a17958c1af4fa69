"""Argument checks shared by the figures: a value shown in a message, a title, a census result."""

from __future__ import annotations

from ampviz._args import _shown  # noqa: F401 (the figures import it from here)
from ampviz.formats.census import CensusResult


def _title(title):
    """A figure title: a string, or None for the default."""
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string (or None), got {type(title).__name__}")
    return title


def _census_result(result, what: str = "result") -> CensusResult:
    if not isinstance(result, CensusResult):
        raise TypeError(f"{what} must be a CensusResult (from ampviz.formats.census.census), "
                        f"got {type(result).__name__}")
    return result
