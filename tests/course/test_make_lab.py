"""`make lab` as a new user meets it: the link JupyterLab prints opens the course's first notebook."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lab_args() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.search(r"^LAB_ARGS := (.*)$", text, flags=re.M).group(1).split()


def test_the_printed_link_opens_start_here():
    args = _lab_args()
    assert "--ip" in args and "127.0.0.1" in args
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="ampviz-make-lab-")
    env = {**os.environ, **{k: os.path.join(tmp, k.lower()) for k in (
        "JUPYTER_CONFIG_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTER_RUNTIME_DIR")}}
    cmd = [sys.executable, "-m", "jupyterlab", *args, "--no-browser", f"--port={port}", "--port-retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = Path(tmp) / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "?token=" not in log.read_text():
                assert proc.poll() is None, log.read_text()[-2000:]
                time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    urls = re.findall(rf"http://127\.0\.0\.1:{port}(\S*)\?token=", log.read_text())
    assert urls and all(u == "/lab/tree/notebooks/00_start_here.ipynb" for u in urls), urls
    assert (ROOT / "notebooks" / "00_start_here.ipynb").exists()
