"""`pip install orchard` is the SDK and the CLI client; each optional part names its extra.

The SDK-only test installs the repository into a fresh virtual environment (the core
dependencies only, from the package index) and drives the session's orchestrator from it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import venv
from pathlib import Path

import httpx
import pytest

from orchard.extras import EXTRAS, MissingExtra, require
from tests.conftest import create_ready, free_port, needs_root, run, wait_until

REPO = Path(__file__).resolve().parents[1]
# Never in an SDK-only install: the server side, the rollout layer, grading, training.
HEAVY = ("fastapi", "uvicorn", "redis", "kubernetes_asyncio", "transformers", "torch",
         "datasets", "swebench", "minisweagent", "litellm", "matplotlib")



def run_without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter where importing ``modules`` fails as if they were
    not installed (a None entry in sys.modules is how Python spells that)."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_require_names_the_extra_and_the_missing_module() -> None:
    r = run_without(["minisweagent"], """
        from orchard.extras import MissingExtra
        try:
            import orchard.rollout
        except MissingExtra as e:
            print(e.extra, e.module, e, sep="|")
        """)
    assert r.returncode == 0, r.stderr
    extra, module, message = r.stdout.strip().split("|")
    assert (extra, module) == ("rollout", "minisweagent")
    assert "pip install 'orchard[rollout]'" in message and "\n" not in message


@pytest.mark.parametrize(("package", "extra"), [
    ("orchard.env.server", "server"), ("orchard.tasks", "tasks"),
    ("orchard.eval", "rollout"), ("orchard.recipes", "train"), ("orchard.openenv", "openenv"),
    ("orchard.integrations.harbor.environment", "harbor"),
])
def test_each_layer_checks_its_extra(package: str, extra: str) -> None:
    first = EXTRAS[extra][1][0]
    r = run_without([first], f"import {package}")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("orchard.extras.MissingExtra:"), r.stderr
    assert f"orchard[{extra}]" in last and repr(first) in last


def test_an_installed_extra_passes() -> None:
    # This venv has everything (`make setup` installs [all]) but Harbor, which needs Python
    # >= 3.12 and lives in .venv-harbor (`make harbor`).
    require(*(extra for extra in EXTRAS if extra != "harbor"))
    with pytest.raises(ValueError, match="unknown extra"):
        require("gpu")
    assert issubclass(MissingExtra, ImportError)


@needs_root
def test_sdk_only_install_drives_a_running_server(orchestrator: str, tmp_path: Path) -> None:
    env_dir = tmp_path / "sdk-venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              str(REPO)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, check=True).stdout.lower()
    names = {line.split("==")[0].replace("-", "_") for line in listed.splitlines()}
    assert not names & set(HEAVY), f"an SDK-only install pulled in {names & set(HEAVY)}"

    drive = textwrap.dedent(f"""
        import sys
        from orchard import SandboxClient
        with SandboxClient({orchestrator!r}) as client:
            sb = client.create_sandbox(image="host")
            r = sb.exec("echo sdk-only $((6 * 7))")
            sb.delete()
            gone = sb.id not in {{s.sandbox_id for s in client.list_sandboxes()}}
        print(r.exit_code, r.stdout.strip(), gone)
        print(sorted(m for m in ("fastapi", "uvicorn", "torch") if m in sys.modules))
        """)
    r = subprocess.run([py, "-c", drive], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0 sdk-only 42 True", "[]"]

    # The server side is an extra: asking for it says which one, in one line.
    r = subprocess.run([py, "-c", "from orchard import SandboxClient; SandboxClient.local()"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0
    assert "pip install 'orchard[server]'" in r.stderr.strip().splitlines()[-1]


@needs_root
def test_server_extra_alone_runs_the_orchestrator(tmp_path: Path) -> None:
    """What the orchestrator image installs (`[server]`) is enough to serve, and has no torch."""
    env_dir = tmp_path / "server-venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              f"{REPO}[server]"], capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = "import importlib.util as u; print([m for m in ('torch', 'transformers', " \
            "'datasets', 'minisweagent') if u.find_spec(m)])"
    assert subprocess.run([py, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"

    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="/tmp/orc-srv-"))  # short: sockets live under it
    server = subprocess.Popen([env_dir / "bin" / "orchard", "serve", "--port", str(port),
                               "--data-dir", str(data)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_until(lambda: _healthy(url), timeout=120):
            server.kill()
            pytest.fail(f"orchard serve did not come up: {server.communicate()[0][-3000:]}")
        with httpx.Client(base_url=url, timeout=60) as http:
            sid = create_ready(http, {"image": "host"})
            assert run(http, sid, command="echo served")["stdout"] == "served\n"
            # The console comes with it; its run pages say what they need.
            assert sid in http.get("/ui/sandboxes").text
            runs = http.get("/ui/runs", params={"path": "runs/x"})
            assert runs.status_code == 501 and "pip install" in runs.text, runs.text
            assert http.delete(f"/sandboxes/{sid}").status_code == 200
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(data, ignore_errors=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
