"""Pulling registry images with Debian's ``skopeo``: resolve a reference to the manifest for
this platform, then copy it into an OCI layout directory that the unpacker reads.

skopeo (containers/image, the library behind podman and CRI-O) speaks the registry protocol:
the anonymous token flow, basic auth, docker config.json and credential helpers, mirrors
(registries.conf), and it checks the digest of every blob it copies. We check the manifest
digests ourselves and pin the copy to the digest we resolved, so a tag that moves between
the create and the pull cannot change what is unpacked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.env.backends.base import ImageUnavailable
from orchard.env.backends.local.image_refs import ImageRef
from orchard.env.backends.local.image_sources import _host_platform
from orchard.env.images_config import ImagesConfig

_INDEX_TYPES = {"application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json"}
# The first pattern found in skopeo's error decides the kind; order matters (a digest
# mismatch mentions no connection, a refused login may mention the registry's URL).
_CAUSES: list[tuple[str, tuple[str, ...]]] = [
    ("disk_full", ("no space left on device", "disk quota exceeded")),
    ("digest_mismatch", ("digest did not match", "does not match digest", "digest mismatch")),
    ("no_platform", ("no image found in",)),
    ("unauthorized", ("unauthorized", "authentication required", "denied",
                      "invalid username/password", "incorrect username or password")),
    ("not_found", ("manifest unknown", "name unknown", "not found", "repository name not")),
]
_HINTS = {
    "forbidden": "pull from an allowed registry or add it to the setting",
    "disk_full": "free space in the image cache (`orchard image prune`) or set "
                 "images.max_cache_bytes",
    "digest_mismatch": "the registry served content that does not match its digest: it is "
                       "corrupt or tampered with; nothing was kept",
    "no_platform": "pick an image built for this platform",
    "unauthorized": "log in: put credentials in the docker config.json "
                    "(images.docker_config) or under images.registries in orchard.yaml",
    "not_found": "check the name and tag",
    "registry_unavailable": "check that the registry is up and reachable from the "
                            "orchestrator (images.mirrors, images.insecure_registries)",
}
# Progress is read from the files skopeo writes, this often.
_POLL_S = 0.25

Progress = Callable[[int, int], Awaitable[None]]  # (bytes done, layers done)


@dataclass(frozen=True)
class RemoteImage:
    """A reference resolved to the one manifest this platform runs."""

    ref: ImageRef
    digest: str  # of that manifest: the cache key
    layers: tuple[tuple[str, int], ...]  # (digest, size) of each blob
    architecture: str

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.layers)


def failure(image: str, kind: str, detail: str) -> ImageUnavailable:
    return ImageUnavailable(f"image {image}: {detail}; {_HINTS.get(kind, '')}".rstrip("; "),
                            kind)


def _classify(image: str, stderr: str) -> ImageUnavailable:
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "skopeo failed"
    # skopeo's fatal line is a logrus record: keep its message.
    if 'msg="' in text:
        text = text.split('msg="', 1)[1].rsplit('"', 1)[0].replace('\\"', '"')
    low = text.lower()
    for kind, needles in _CAUSES:
        if any(n in low for n in needles):
            return failure(image, kind, f"{kind.replace('_', ' ')}: {text}")
    return failure(image, "registry_unavailable", f"registry unavailable: {text}")


class Skopeo:
    """Runs skopeo with this orchestrator's registry settings (auth, TLS, mirrors)."""

    def __init__(self, config: ImagesConfig, docker_config: Path | None, workdir: Path) -> None:
        self.config = config
        self.docker_config = docker_config
        self.workdir = workdir
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Our own registries.conf, always: the host's /etc/containers one never redirects a
        # pull behind our back, and mirrors come from orchard.yaml.
        self.registries_conf = workdir / "registries.conf"
        self.registries_conf.write_text(self._registries_conf())
        self.empty_auth = workdir / "no-auth.json"
        self.empty_auth.write_text('{"auths": {}}')

    def insecure(self, host: str) -> bool:
        ref_host = host.rsplit(":", 1)[0] if not host.startswith("[") else host
        if ref_host in ("localhost", "::1", "[::1]") or ref_host.startswith("127."):
            return True
        return host in self.config.insecure_registries or ref_host in \
            self.config.insecure_registries

    def _registries_conf(self) -> str:
        out = []
        for registry, mirrors in self.config.mirrors.items():
            insecure = "true" if self.insecure(registry) else "false"
            out.append(f'[[registry]]\nprefix = "{registry}"\nlocation = "{registry}"\n'
                       f"insecure = {insecure}\n")
            for mirror in mirrors:
                insecure = "true" if self.insecure(mirror) else "false"
                out.append(f'[[registry.mirror]]\nlocation = "{mirror}"\n'
                           f"insecure = {insecure}\n")
        return "\n".join(out)

    def _base(self) -> list[str]:
        return ["skopeo", "--insecure-policy", "--registries-conf", str(self.registries_conf),
                "--override-os", "linux", "--override-arch", _host_platform()]

    @contextlib.contextmanager
    def _auth(self, ref: ImageRef, prefix: str) -> Iterator[list[str]]:
        """skopeo's auth and TLS flags for ``ref`` (``prefix`` is "src-" for copy)."""
        # A registry with mirrors takes its TLS settings, and its mirrors', from our
        # registries.conf: a flag here would apply to the mirrors too.
        args = [] if ref.registry in self.config.mirrors else [
            f"--{prefix}tls-verify={'false' if self.insecure(ref.registry) else 'true'}"]
        creds = self.config.registries.get(ref.registry)
        if creds is None and ref.registry == "docker.io":
            creds = self.config.registries.get("index.docker.io")
        if creds is not None and creds.token:
            # A flag, as skopeo takes no token file; only host root sees our command lines.
            yield [*args, f"--{prefix}authfile={self.empty_auth}",
                   f"--{prefix}registry-token={creds.token}"]
            return
        if creds is not None and creds.username is not None:
            # In a private file rather than on the command line (--creds).
            token = base64.b64encode(f"{creds.username}:{creds.password or ''}".encode()).decode()
            fd, name = tempfile.mkstemp(prefix="auth-", suffix=".json", dir=self.workdir)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"auths": {ref.registry: {"auth": token}}}, f)
                yield [*args, f"--{prefix}authfile={name}"]
            finally:
                os.unlink(name)
            return
        authfile = self.docker_config if self.docker_config is not None else self.empty_auth
        yield [*args, f"--{prefix}authfile={authfile}"]

    async def _run(self, argv: list[str]) -> tuple[int, bytes, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={"PATH": os.environ.get("PATH", "/usr/bin"),
                                                 "HOME": str(self.workdir)})
        try:
            out, err = await proc.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        return proc.returncode or 0, out, err.decode(errors="replace")

    async def _raw(self, ref: ImageRef, target: str) -> bytes:
        with self._auth(ref, "") as auth:
            rc, out, err = await self._run(
                [*self._base(), "inspect", "--raw", "--retry-times", "1", *auth,
                 f"docker://{target}"])
        if rc != 0:
            raise await self._explain(ref, _classify(ref.name, err))
        return out

    async def _explain(self, ref: ImageRef, error: ImageUnavailable) -> ImageUnavailable:
        """A not-found says whether the repository or only the tag is unknown."""
        if error.kind != "not_found" or ref.tag is None:
            return error
        with self._auth(ref, "") as auth:
            rc, out, _ = await self._run([*self._base(), "list-tags", *auth,
                                          f"docker://{ref.registry}/{ref.repository}"])
        tags = json.loads(out).get("Tags") or [] if rc == 0 else []
        if tags:
            listed = ", ".join(sorted(tags)[:10]) + (", ..." if len(tags) > 10 else "")
            return failure(ref.name, "not_found", f"unknown tag {ref.tag!r} (the repository "
                           f"{ref.registry}/{ref.repository} has: {listed})")
        return failure(ref.name, "not_found", f"unknown repository {ref.repository!r} on "
                       f"{ref.registry}")

    async def resolve(self, ref: ImageRef) -> RemoteImage:
        """The manifest for this platform, its digest checked; ImageUnavailable otherwise."""
        target = ref.pinned(ref.digest) if ref.digest else ref.name
        raw = await self._raw(ref, target)
        doc = _json(ref, raw)
        if ref.digest:
            _check(ref, ref.digest, raw)
        digest = ref.digest or "sha256:" + hashlib.sha256(raw).hexdigest()
        arch = _host_platform()
        if doc.get("mediaType") in _INDEX_TYPES or "manifests" in doc:
            wanted = [d for d in doc.get("manifests") or [] if isinstance(d, dict)
                      and (d.get("platform") or {}).get("os") == "linux"
                      and (d.get("platform") or {}).get("architecture") == arch]
            if not wanted:
                have = sorted({f"{(d.get('platform') or {}).get('os')}/"
                               f"{(d.get('platform') or {}).get('architecture')}"
                               for d in doc.get("manifests") or [] if isinstance(d, dict)})
                raise failure(ref.name, "no_platform", f"no manifest for linux/{arch} (the "
                              f"image has {', '.join(have) or 'none'})")
            digest = str(wanted[0].get("digest"))
            raw = await self._raw(ref, ref.pinned(digest))
            _check(ref, digest, raw)
            doc = _json(ref, raw)
        layers = doc.get("layers")
        if not isinstance(layers, list) or not all(isinstance(d, dict) for d in layers):
            raise failure(ref.name, "bad_image", "its manifest lists no layers")
        return RemoteImage(ref=ref, digest=digest, architecture=arch, layers=tuple(
            (str(d.get("digest")), int(d.get("size") or 0)) for d in layers))

    async def copy(self, image: RemoteImage, layout: Path, progress: Progress) -> None:
        """Copy the resolved manifest and its blobs into the OCI layout dir ``layout``."""
        ref = image.ref
        with self._auth(ref, "src-") as auth:
            argv = [*self._base(), "copy", "--quiet", "--retry-times", "2", *auth,
                    f"docker://{ref.pinned(image.digest)}", f"oci:{layout}:image"]
            copying = asyncio.ensure_future(self._run(argv))
            try:
                while not copying.done():
                    await asyncio.wait([copying], timeout=_POLL_S)
                    await progress(*_done(layout, image))
                rc, _, err = copying.result()
            finally:
                if not copying.done():
                    copying.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await copying
        if rc != 0:
            raise _classify(ref.name, err)


def _json(ref: ImageRef, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise failure(ref.name, "bad_image", "the registry's manifest is not a JSON object")
    return doc


def _check(ref: ImageRef, digest: str, raw: bytes) -> None:
    algo, _, want = digest.partition(":")
    got = hashlib.new(algo, raw).hexdigest()
    if got != want:
        raise failure(ref.name, "digest_mismatch", f"digest mismatch: its manifest has "
                      f"{algo}:{got}, not {digest}")


def _done(layout: Path, image: RemoteImage) -> tuple[int, int]:
    """Bytes on disk so far (finished blobs and skopeo's partial files), layers complete."""
    total = 0
    for root, _, files in os.walk(layout):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    layers = sum(1 for digest, _ in image.layers
                 if (layout / "blobs" / digest.replace(":", "/", 1)).exists())
    return min(total, image.total_bytes), layers
