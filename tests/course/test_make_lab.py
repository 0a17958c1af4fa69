"""`make lab` as a new user meets it: the link JupyterLab prints opens the course's first notebook,
the server asks for the token it prints, and it starts without a warning."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lab_args() -> list[str]:
    text = (ROOT / "Makefile").read_text()
    return re.search(r"^LAB_ARGS := (.*)$", text, flags=re.M).group(1).split()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen, url: str, log: Path, deadline: float) -> int | None:
    """The status of ``url`` once the server listens; None when it exited because its port was taken.

    JupyterLab prints its links before it binds its port (the bind is its event loop's first
    callback), so a refused connection right after the links is a server still starting."""
    while True:
        try:
            return _status(url)
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError):
                raise
        if proc.poll() is not None:
            text = log.read_text()
            assert "already in use" in text, text[-2000:]
            return None
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)


def _serve_and_check_token(args: list[str], env: dict, tmp: Path):
    """Start the lab as `make lab` does on a free port, check its token, stop it; (port, log, tokens),
    with port None when the port was taken before the server could bind it."""
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyterlab", *args, "--no-browser", f"--port={port}", "--port-retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = tmp / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "?token=" not in log.read_text():
                if proc.poll() is not None:
                    text = log.read_text()
                    assert "already in use" in text, text[-2000:]
                    return None, log, []
                time.sleep(0.5)
            printed = log.read_text()
            tokens = re.findall(rf"http://127\.0\.0\.1:{port}\S*\?token=(\w+)", printed)
            assert tokens, printed[-2000:]
            # token authentication: refused without the token printed, answered with it
            base = f"http://127.0.0.1:{port}/api/status"
            first = _wait_listening(proc, base, log, time.monotonic() + 60)
            if first is None:
                return None, log, []
            assert first == 403
            assert _status(f"{base}?token=wrong{tokens[0]}") == 403
            assert _status(f"{base}?token={tokens[0]}") == 200
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return port, log, tokens


def test_the_printed_link_opens_start_here_and_asks_for_the_token():
    args = _lab_args()
    assert "--ip" in args and "127.0.0.1" in args
    # the token is JupyterLab's own, generated at start: nothing sets it, in the deprecated way
    # (ServerApp.token) or another
    assert not any("token" in a.lower() for a in args)
    assert not re.search(r"^\s*c\.\w+\.token\b", (ROOT / "jupyter_server_config.py").read_text(), flags=re.M)
    env_dir = tempfile.mkdtemp(prefix="ampviz-make-lab-")
    env = {**os.environ, **{k: os.path.join(env_dir, k.lower()) for k in (
        "JUPYTER_CONFIG_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTER_RUNTIME_DIR")}}
    # as the Makefile's lab target: this folder first on Jupyter's config path
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("JUPYTER_CONFIG_PATH")) if p)
    # A free port can be taken between our probe and the server's bind (other tests start kernels and
    # servers side by side); the server then says so and exits, and we try another port.
    for attempt in range(3):
        port, log, tokens = _serve_and_check_token(args, env, Path(tempfile.mkdtemp(dir=env_dir)))
        if port is not None:
            break
    else:
        raise AssertionError(f"the lab server found its port taken three times:\n{log.read_text()[-2000:]}")
    text = log.read_text()
    urls = re.findall(rf"http://127\.0\.0\.1:{port}(\S*)\?token=", text)
    assert urls and all(u == "/lab/tree/notebooks/00_start_here.ipynb" for u in urls), urls
    assert (ROOT / "notebooks" / "00_start_here.ipynb").exists()
    # a generated token, the same in every link printed, never masked ("...")
    assert len(set(tokens)) == 1 and len(tokens[0]) >= 32
    # no Python warning on the way (it was "DeprecationWarning: ServerApp.token config is
    # deprecated", from an extension reading that attribute, made visible by Voila's import)
    assert not re.search(r"\w*Warning: ", text), text[:3000]
    assert "ServerApp.token" not in text
