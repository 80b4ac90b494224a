"""The MiniWoB++ site in a sandbox: the vendored pages uploaded as one archive, the server
started on its port, and the episode's state read back.

The pages are some 200 files: one tar upload and one unpack is much cheaper than a request
per file.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

from orchard.domains.web.environment import IN_SANDBOX, SiteError, state_path
from orchard.domains.web.miniwob.tasks import PAGES
from orchard.domains.web.model import SITE_PORTS
from orchard.env.client import OrchardError, Sandbox
from orchard.tasks.served import wait_serving

SERVER = Path(__file__).resolve().parent / "server.py"
ROOT = f"{IN_SANDBOX}/miniwob"


@cache
def pages_archive() -> bytes:
    """The vendored pages and the server, as a gzipped tar (built once per process)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(PAGES, arcname="pages")
        tar.add(SERVER, arcname="server.py")
    return buffer.getvalue()


def start_miniwob(sandbox: Sandbox, timeout: float = 30.0) -> None:
    """Upload the pages and start the server; return once it answers."""
    archive = f"{IN_SANDBOX}/miniwob.tar.gz"
    sandbox.upload_content(pages_archive(), archive)
    # Our own archive; the 'data' filter where this Python has it (3.11.4 and later).
    unpack = (f"import tarfile; t = tarfile.open({archive!r}); t.extraction_filter = "
              f"getattr(tarfile, 'data_filter', None); t.extractall({ROOT!r})")
    done = sandbox.exec(f"python3 -c {shlex.quote(unpack)}", timeout=60)
    if not done.ok:
        raise SiteError(f"the MiniWoB++ pages did not unpack in sandbox {sandbox.id}: "
                        f"{done.stderr.strip()[-300:]}")
    port = SITE_PORTS["miniwob"]
    sandbox.start_process(f"python3 {ROOT}/server.py --port {port} --root {ROOT}/pages "
                          f"--state {state_path('miniwob')}")
    why = wait_serving(sandbox, [f"http://127.0.0.1:{port}/"], timeout)
    if why:
        raise SiteError(f"the MiniWoB++ site did not answer on port {port} within "
                        f"{timeout:g}s ({why}); see the processes of sandbox {sandbox.id}")


def episode(sandbox: Sandbox) -> dict[str, Any]:
    """The episode as the page reported it: instruction, done, reward, raw reward, reason."""
    try:
        return json.loads(sandbox.download_content(state_path("miniwob")))
    except (OrchardError, ValueError) as e:
        raise SiteError(f"cannot read the MiniWoB++ episode in sandbox {sandbox.id}: {e}"
                        ) from None
