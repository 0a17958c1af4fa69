"""pytest's hooks for both stages of ``make test`` (``pytest tests`` and nbval over ``notebooks``).

nbval starts one kernel per notebook. jupyter_client picks the kernel's five TCP ports by binding
port 0 and closing it again, and the kernel binds them about a second later, once Python and
ipykernel are imported: on a loaded machine, where another process (a second nbval worker, a rank
of a gloo test) may take such a port in between, the kernel then exits and nbval reports "Kernel
died before replying to kernel_info". A kernel start that fails so is tried again, with new ports,
up to ``KERNEL_STARTS`` times.
"""

KERNEL_STARTS = 3


def _retrying(start):
    def start_new_kernel(*args, **kwargs):
        for attempt in range(KERNEL_STARTS):
            try:
                return start(*args, **kwargs)
            except RuntimeError:
                if attempt == KERNEL_STARTS - 1:
                    raise
    start_new_kernel.retries = start
    return start_new_kernel


def pytest_configure(config):
    try:
        import nbval.kernel
    except ImportError:
        return
    if not hasattr(nbval.kernel.start_new_kernel, "retries"):
        nbval.kernel.start_new_kernel = _retrying(nbval.kernel.start_new_kernel)
