"""nbval's kernel start is tried again when a kernel dies at start-up (the root conftest.py)."""

import importlib.util
from pathlib import Path

import nbval.kernel
import pytest

_spec = importlib.util.spec_from_file_location("root_conftest", Path(__file__).resolve().parents[2] / "conftest.py")
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)


def test_nbval_starts_kernels_through_the_retry():
    assert hasattr(nbval.kernel.start_new_kernel, "retries")


def _flaky(failures):
    calls = []

    def start(**kwargs):
        calls.append(kwargs)
        if len(calls) <= failures:
            raise RuntimeError("Kernel died before replying to kernel_info")
        return "km", "kc"
    return start, calls


def test_a_kernel_that_dies_at_start_up_is_started_again():
    start, calls = _flaky(root_conftest.KERNEL_STARTS - 1)
    assert root_conftest._retrying(start)(startup_timeout=180, kernel_name="python3") == ("km", "kc")
    assert len(calls) == root_conftest.KERNEL_STARTS and calls[-1] == {"startup_timeout": 180, "kernel_name": "python3"}


def test_a_kernel_that_never_starts_is_reported():
    start, calls = _flaky(root_conftest.KERNEL_STARTS)
    with pytest.raises(RuntimeError, match="Kernel died before replying"):
        root_conftest._retrying(start)()
    assert len(calls) == root_conftest.KERNEL_STARTS
