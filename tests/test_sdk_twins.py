"""The blocking SDK client is generated from the async one and must stay in step with it."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import orchard.env.client as sdk
from scripts import unasync

ROOT = Path(__file__).resolve().parent.parent
TWINS = [
    (sdk.SandboxClient, sdk.AsyncSandboxClient),
    (sdk.Sandbox, sdk.AsyncSandbox),
    (sdk.PtySession, sdk.AsyncPtySession),
]


def test_the_committed_sync_client_is_what_the_generator_writes() -> None:
    # The way `make test` and CI see it: the script itself, in check mode.
    run = subprocess.run(
        [sys.executable, "scripts/unasync.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stderr


def test_check_mode_fails_on_a_stale_sync_client_until_regenerated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for source, target in unasync.TWINS.items():
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / source, tmp_path / source)
        (tmp_path / target).write_text((ROOT / target).read_text() + "# edited by hand\n")
    root = ["--root", str(tmp_path)]

    assert unasync.main(["--check", *root]) == 1
    assert "sync_client.py is stale: run `python scripts/unasync.py`" in capsys.readouterr().err

    assert unasync.main(root) == 0
    assert unasync.main(["--check", *root]) == 0
    assert "edited by hand" not in (tmp_path / target).read_text()


def test_the_rewrite_renames_whole_tokens_only() -> None:
    source = (
        "async def f(s: AsyncSandbox, it: AsyncIterator[bytes]) -> httpx.AsyncClient:\n"
        "    async with contextlib.aclosing(r), await open_file(p) as out:\n"
        "        async for x in r.aiter_bytes():\n"
        "            await out.write((await r.aread()) + x)\n"
        "    await stack.enter_async_context(aconnect_ws(u))\n"
        "    await self.__aexit__()\n"
        "from orchard.env.client._async_io import sleep\n"
        "import asyncio; Asyncish = areader = aclosed = async_io = 1\n"
        "from orchard.env.client.async_client import C  # generated from async_client.py\n"
    )
    assert unasync.unasync(source) == (
        "def f(s: Sandbox, it: Iterator[bytes]) -> httpx.Client:\n"
        "    with contextlib.closing(r), open_file(p) as out:\n"
        "        for x in r.iter_bytes():\n"
        "            out.write((r.read()) + x)\n"
        "    stack.enter_context(connect_ws(u))\n"
        "    self.__exit__()\n"
        "from orchard.env.client._sync_io import sleep\n"
        "import asyncio; Asyncish = areader = aclosed = async_io = 1\n"
        "from orchard.env.client.sync_client import C  # generated from async_client.py\n"
    )


def _public(cls: type) -> dict[str, str]:
    """The public members and context-manager methods, by their names in the sync twin."""
    names = [n for n in dir(cls) if not n.startswith("_") or n == "__init__"]
    names += [n for n in ("__enter__", "__exit__", "__aenter__", "__aexit__") if hasattr(cls, n)]
    return {unasync.unasync(n): n for n in names}


@pytest.mark.parametrize(("sync", "async_"), TWINS, ids=[s.__name__ for s, _ in TWINS])
def test_each_sync_class_mirrors_its_async_twin(sync: type, async_: type) -> None:
    sync_names, async_names = _public(sync), _public(async_)
    assert sync_names.keys() == async_names.keys()
    for name, async_name in async_names.items():
        if isinstance(inspect.getattr_static(async_, async_name), property):
            continue
        sync_fn, async_fn = getattr(sync, name), getattr(async_, async_name)
        # Same parameters and defaults; annotations differ by the rewrite alone.
        assert str(inspect.signature(sync_fn)) == unasync.unasync(
            str(inspect.signature(async_fn))), name
        assert not inspect.iscoroutinefunction(sync_fn), name
        assert inspect.isgeneratorfunction(sync_fn) == inspect.isasyncgenfunction(async_fn), name
