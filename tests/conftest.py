"""Fixtures and hooks shared by the test files.

The ``gpu`` marker: a test marked ``@pytest.mark.gpu`` needs a CUDA device. Where there is none,
it is skipped with ``GPU_SKIP_REASON``. torch is imported only when a collected test carries the
marker, so test files that do not need torch never load it.
"""

import importlib
import os

import pytest

# One torch (OpenMP) thread per test process unless a test asks for more: make test runs two pytest
# workers on 2 cores, and a thread per core in each left four threads spinning on two cores (the
# torch-heavy test files took 49 s instead of 25). Set before any test imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

GPU_SKIP_REASON = "needs a CUDA device (torch.cuda.is_available() is False)"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device")


#: Test files that take minutes: collected first, so that with ``-n 2`` (make test) one worker starts
#: them while the other takes the thousands of short tests, instead of one of them running alone at the end.
LONG_FIRST = ("test_binder.py", "test_exercises.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)  # stable: the order within stays
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    try:
        import torch
    except ImportError:
        reason = "needs a CUDA device (torch is not installed)"
    else:
        if torch.cuda.is_available():
            return
        reason = GPU_SKIP_REASON
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module's tests (as the notebooks' setup cells run it),
    restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the calls of the fused encoder-layer kernel and of the nested-tensor packing (both looked
    up on ``torch`` at call time by ``nn.TransformerEncoder``), passing each call on (pitfall 3's
    tests, on the CPU and on CUDA)."""
    import torch

    counts = {"fused": 0, "nested": 0}
    for key, name in (("fused", "_transformer_encoder_layer_fwd"), ("nested", "_nested_tensor_from_mask")):
        real = getattr(torch, name)

        def counted(*args, _real=real, _key=key, **kwargs):
            counts[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch, name, counted)
    return counts


def _torchao_modules(*names):
    """The torchao modules ``names`` (dotted), imported; the test is skipped without torchao, and
    fails under CI=true, where every reference must run."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # its CUDA kernels: not needed
    try:
        return [importlib.import_module(name) for name in names]
    except ImportError as exc:
        why = f"torchao is not installed or does not import ({exc}); pip install torchao==0.18.0"
        if os.environ.get("CI") == "true":
            pytest.fail(f"torchao tests cannot run under CI: {why}")
        pytest.skip(why)


@pytest.fixture(scope="session")
def torchao_modules():
    """``torchao_modules("torchao.float8.config", ...)``: torchao's modules by name, the reference
    that ampviz.formats.blocks, ampviz.formats.fp8 and the fp6/fp4 formats are tested against (see
    ``_torchao_modules``)."""
    return _torchao_modules
