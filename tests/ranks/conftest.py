"""The ranks tests' shared fixture: no test leaves a rank process behind."""

import time

import psutil
import pytest


@pytest.fixture(autouse=True)
def no_rank_left():
    """No process this test started is left (processes that earlier tests of the suite keep, such
    as a browser or a server kept for the whole test run, are not this test's)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 5
    while True:
        kids = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not kids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not kids, f"processes left behind: {kids}"
