from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import stat
import subprocess
import sys
import tarfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchard.env.backends.local import image_unpack
from orchard.env.backends.local.images import (
    ImageError,
    ImageForbidden,
    ImageStore,
    ResolvedImage,
)
from orchard.env.config import Settings
from tests.image_fixtures import (
    Layer,
    layer_tar,
    make_busybox_rootfs,
    make_docker_archive,
    make_oci_archive,
    make_oci_layout,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def busybox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_busybox_rootfs(tmp_path_factory.mktemp("busybox") / "rootfs")


@pytest.fixture
def store(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> ImageStore:
    # The tests make their images in pytest's temp dirs.
    return ImageStore(tmp_path / "cache", allowed_paths=[tmp_path_factory.getbasetemp()])


def _entry(name: str, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def _assert_busybox_runs(rootfs: Path) -> None:
    out = subprocess.run(
        [rootfs / "bin/busybox", "echo", "hi"], check=True, capture_output=True, text=True
    )
    assert out.stdout == "hi\n"


def test_busybox_rootfs_is_libc_less(busybox: Path) -> None:
    for applet in ("sh", "ls", "cat", "echo", "true", "sleep", "patch", "mkdir", "env", "id"):
        assert (busybox / "bin" / applet).readlink() == Path("busybox")
    assert not list(busybox.rglob("libc*"))
    assert (busybox / "etc/passwd").read_text().startswith("root:x:0:0:")
    _assert_busybox_runs(busybox)


def test_host_and_rootfs_refs(store: ImageStore, busybox: Path) -> None:
    assert store.resolve("host") == ResolvedImage("host", "host", None, None)
    resolved = store.resolve(str(busybox))
    assert resolved == ResolvedImage(str(busybox), "rootfs", busybox, None)
    assert store.cached() == []


@pytest.mark.parametrize("fmt", ["docker", "oci-archive", "oci-archive-gz", "oci-layout"])
def test_unpack_formats(store: ImageStore, busybox: Path, tmp_path: Path, fmt: str) -> None:
    extra = [{"etc/motd": b"hello\n"}]
    if fmt == "docker":
        ref = make_docker_archive(busybox, tmp_path / "img.tar", extra)
    elif fmt == "oci-layout":
        ref = make_oci_layout(busybox, tmp_path / "layout", extra)
    else:
        ref = make_oci_archive(busybox, tmp_path / "img.tar", extra, compress=fmt.endswith("gz"))
    resolved = store.resolve(str(ref))
    assert resolved.kind == "oci"
    assert resolved.ref == str(ref)
    assert resolved.digest is not None and resolved.digest.startswith("sha256:")
    rootfs = resolved.rootfs
    assert rootfs == store.cache_dir / resolved.digest.replace(":", "-") / "rootfs"
    assert store.cached() == [rootfs]
    assert (rootfs / "etc/motd").read_bytes() == b"hello\n"
    assert (rootfs / "bin/sh").readlink() == Path("busybox")
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    for name in ("proc", "dev", "tmp", "workspace", "home"):
        assert (rootfs / name).is_dir()
    _assert_busybox_runs(rootfs)


def test_docker_archive_digest_is_config_digest(
    store: ImageStore, busybox: Path, tmp_path: Path
) -> None:
    archive = make_docker_archive(busybox, tmp_path / "img.tar")
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    config_hex = manifest[0]["Config"].removesuffix(".json")
    assert store.resolve(str(archive)).digest == f"sha256:{config_hex}"


def test_mount_points_added_without_touching_user_rootfs(store: ImageStore, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin/busybox").write_bytes(b"")
    resolved = store.resolve(str(make_oci_layout(bare, tmp_path / "layout")))
    assert resolved.rootfs is not None
    assert sorted(p.name for p in resolved.rootfs.iterdir()) == [
        "bin", "dev", "home", "proc", "tmp", "workspace",
    ]  # fmt: skip
    assert store.resolve(str(bare)).rootfs == bare
    assert [p.name for p in bare.iterdir()] == ["bin"]


def test_whiteout_and_opaque(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    layers: list[Layer] = [
        {"etc/motd": b"hi", "opt/a/old": b"1", "opt/a/sub/deep": b"2", "opt/keep": b"3"},
        {"etc/motd": None, "bin/ls": None, "opt/a/.wh..wh..opq": None, "opt/a/new": b"4"},
    ]
    resolved = store.resolve(str(make_oci_archive(busybox, tmp_path / "img.tar", layers)))
    rootfs = resolved.rootfs
    assert rootfs is not None
    assert not (rootfs / "etc/motd").exists()
    assert not (rootfs / "bin/ls").is_symlink()
    assert (rootfs / "bin/cat").is_symlink()
    assert sorted(p.name for p in (rootfs / "opt/a").iterdir()) == ["new"]
    assert (rootfs / "opt/keep").read_bytes() == b"3"
    assert not list(rootfs.rglob(".wh.*"))


def test_opaque_marker_after_siblings_keeps_same_layer_entries(
    store: ImageStore, busybox: Path, tmp_path: Path
) -> None:
    # The spec only says whiteouts SHOULD come first; entries of the same layer must survive.
    late_opaque = layer_tar([(_entry("opt/new"), b"new"), (_entry("opt/.wh..wh..opq"), b"")])
    layers = [{"opt/old": b"old"}, late_opaque]
    rootfs = store.resolve(str(make_oci_layout(busybox, tmp_path / "layout", layers))).rootfs
    assert rootfs is not None
    assert sorted(p.name for p in (rootfs / "opt").iterdir()) == ["new"]


def test_plain_tar_layers_detected_by_magic(
    store: ImageStore, busybox: Path, tmp_path: Path
) -> None:
    layout = make_oci_layout(busybox, tmp_path / "layout", [{"x": b"y"}], gzip_extra=False)
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs/sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_text())
    # Mislabel the plain layer as gzip: the store must trust the bytes, not the media type.
    manifest["layers"][1]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(data))
    (layout / "index.json").write_text(json.dumps(index))
    rootfs = store.resolve(str(layout)).rootfs
    assert rootfs is not None and (rootfs / "x").read_bytes() == b"y"


def test_multi_arch_picks_host_arch(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    layout = make_oci_layout(busybox, tmp_path / "layout", multi_arch=True)
    rootfs = store.resolve(str(layout)).rootfs
    assert rootfs is not None
    expected = b"arm64" if platform.machine().lower() in ("aarch64", "arm64") else b"amd64"
    assert (rootfs / "etc/arch").read_bytes() == expected


def test_second_resolve_is_cached(
    store: ImageStore, busybox: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = make_docker_archive(busybox, tmp_path / "img.tar")
    first = store.resolve(str(archive))
    assert first.rootfs is not None
    (first.rootfs / "sentinel").write_text("x")

    def no_unpack(*args: object) -> None:
        raise AssertionError("layers were re-applied for a cached image")

    monkeypatch.setattr(image_unpack, "_apply_layer", no_unpack)
    second = store.resolve(str(archive))
    assert second == first
    assert (second.rootfs / "sentinel").exists()  # type: ignore[operator]
    assert store.cached() == [first.rootfs]


def test_concurrent_threads_unpack_once(
    store: ImageStore, busybox: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = make_oci_archive(busybox, tmp_path / "img.tar")
    calls: list[object] = []
    real_apply = image_unpack._apply_layer

    def counting_apply(*args: object) -> None:
        calls.append(args)
        real_apply(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(image_unpack, "_apply_layer", counting_apply)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: store.resolve(str(archive)), range(8)))
    assert len({r.rootfs for r in results}) == 1
    assert len(calls) == 1  # one layer, applied once
    entry = results[0].rootfs.parent  # type: ignore[union-attr]
    assert sorted(p.name for p in entry.iterdir()) == ["image.json", "rootfs"]


def test_concurrent_processes_unpack_once(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    archive = make_docker_archive(busybox, tmp_path / "img.tar")
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from orchard.env.backends.local.images import ImageStore
        store = ImageStore(Path(sys.argv[1]), allowed_paths=[Path(sys.argv[3])])
        print(store.resolve(sys.argv[2]).rootfs)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(store.cache_dir), str(archive), str(tmp_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(outputs) == 1
    rootfs = Path(outputs.pop())
    assert store.cached() == [rootfs]
    assert sorted(p.name for p in rootfs.parent.iterdir()) == ["image.json", "rootfs"]
    _assert_busybox_runs(rootfs)


def test_path_traversal_refused(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    evil = layer_tar([(_entry("../../../escaped"), b"pwned")])
    archive = make_oci_archive(busybox, tmp_path / "img.tar", [evil])
    with pytest.raises(ImageError, match="escapes the image root"):
        store.resolve(str(archive))
    assert not list(tmp_path.rglob("escaped"))
    assert store.cached() == []
    # The failed unpack leaves no temp dir behind.
    assert not list(store.cache_dir.glob("*/.tmp-*"))


def test_absolute_paths_and_symlinks_are_contained(
    store: ImageStore, busybox: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    plant = layer_tar(
        [
            (_entry("abs_link", type=tarfile.SYMTYPE, linkname=str(outside)), None),
            (_entry("up_link", type=tarfile.SYMTYPE, linkname="../../../../../.."), None),
            (_entry("file_link", type=tarfile.SYMTYPE, linkname=str(outside / "f")), None),
        ]
    )
    write_through = layer_tar(
        [
            (_entry(f"{tmp_path}/absolute"), b"a"),
            (_entry("abs_link/pwned"), b"b"),
            (_entry("up_link/pwned2"), b"c"),
            (_entry("file_link"), b"d"),  # replaces the symlink instead of writing through it
            (_entry("hard", type=tarfile.LNKTYPE, linkname="/etc/passwd"), None),
        ]
    )
    archive = make_docker_archive(busybox, tmp_path / "img.tar", [plant, write_through])
    rootfs = store.resolve(str(archive)).rootfs
    assert rootfs is not None
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "absolute").exists()
    inner = rootfs / str(outside).lstrip("/")
    assert (inner / "pwned").read_bytes() == b"b"
    assert (rootfs / str(tmp_path).lstrip("/") / "absolute").read_bytes() == b"a"
    assert (rootfs / "pwned2").read_bytes() == b"c"
    assert not (rootfs / "file_link").is_symlink()
    assert (rootfs / "file_link").read_bytes() == b"d"
    assert (rootfs / "hard").samefile(rootfs / "etc/passwd")


def test_modes_hardlinks_and_devices(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    layer = layer_tar(
        [
            (_entry("opt/tool", mode=0o4755), b"#!/bin/sh\n"),
            (_entry("opt/ro", type=tarfile.DIRTYPE, mode=0o555), None),
            (_entry("opt/ro/file", mode=0o600), b"x"),
            (_entry("opt/tool2", type=tarfile.LNKTYPE, linkname="opt/tool"), None),
            (_entry("opt/pipe", type=tarfile.FIFOTYPE, mode=0o640, mtime=1234), None),
            (_entry("dev/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3), None),
            # A directory a later entry replaces with a file: its mode is not applied
            # to the file, and the unpack goes on.
            (_entry("gone", type=tarfile.DIRTYPE, mode=0o700), None),
            (_entry("gone/sub", type=tarfile.DIRTYPE, mode=0o777), None),
            (_entry("gone", mode=0o644), b"file now"),
        ]
    )
    rootfs = store.resolve(str(make_oci_layout(busybox, tmp_path / "layout", [layer]))).rootfs
    assert rootfs is not None
    assert (rootfs / "opt/tool").stat().st_mode & 0o7777 == 0o4755
    assert (rootfs / "opt/ro").stat().st_mode & 0o7777 == 0o555
    assert (rootfs / "opt/ro/file").stat().st_mode & 0o7777 == 0o600
    assert (rootfs / "opt/tool2").samefile(rootfs / "opt/tool")
    pipe = (rootfs / "opt/pipe").stat()
    assert stat.S_ISFIFO(pipe.st_mode) and pipe.st_mode & 0o7777 == 0o640
    assert pipe.st_mtime == 1234
    assert not (rootfs / "dev/null").exists()
    assert (rootfs / "gone").read_bytes() == b"file now"
    assert (rootfs / "gone").stat().st_mode & 0o7777 == 0o644


def test_layer_digest_mismatch(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    layout = make_oci_layout(busybox, tmp_path / "layout", [{"etc/motd": b"hello"}])
    index = json.loads((layout / "index.json").read_text())
    manifest_hex = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((layout / "blobs/sha256" / manifest_hex).read_text())
    tampered = layout / "blobs/sha256" / manifest["layers"][1]["digest"].split(":")[1]
    # A well-formed layer with different content: only the digest check can catch it.
    tampered.write_bytes(gzip.compress(layer_tar([(_entry("etc/motd"), b"evil!")])))
    with pytest.raises(ImageError, match="digest"):
        store.resolve(str(layout))
    assert store.cached() == []


def _last_layer_hex(layout: Path) -> str:
    index = json.loads((layout / "index.json").read_text())
    manifest_hex = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((layout / "blobs/sha256" / manifest_hex).read_text())
    return manifest["layers"][-1]["digest"].split(":")[1]


def test_docker_diff_id_mismatch(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    good = make_docker_archive(busybox, tmp_path / "good.tar", [{"etc/motd": b"hello"}])
    bad = tmp_path / "bad.tar"
    with tarfile.open(good) as src, tarfile.open(bad, "w") as dst:
        manifest = json.loads(src.extractfile("manifest.json").read())  # type: ignore[union-attr]
        last_layer = manifest[0]["Layers"][-1]
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if member.name == last_layer:
                payload = layer_tar([(_entry("etc/motd"), b"evil!")])
                member.size = len(payload)
                dst.addfile(member, io.BytesIO(payload))
            else:
                dst.addfile(member, data)
    with pytest.raises(ImageError, match="uncompressed"):
        store.resolve(str(bad))


def test_missing_blob(store: ImageStore, busybox: Path, tmp_path: Path) -> None:
    layout = make_oci_layout(busybox, tmp_path / "layout")
    (layout / "blobs/sha256" / _last_layer_hex(layout)).unlink()
    with pytest.raises(ImageError, match="missing"):
        store.resolve(str(layout))


@pytest.mark.parametrize(
    ("ref", "match"),
    [
        ("relative/rootfs", "absolute path"),
        ("ubuntu:22.04", "absolute path"),
        ("/nonexistent/image.tar", "outside the image directories"),
    ],
)
def test_bad_references(store: ImageStore, ref: str, match: str) -> None:
    with pytest.raises(ImageError, match=match):
        store.resolve(ref)


def test_a_missing_image_in_an_image_directory(store: ImageStore, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="does not exist"):
        store.resolve(str(tmp_path / "no-such-image.tar"))


def test_garbage_file(store: ImageStore, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"definitely not a tar archive\n" * 100)
    with pytest.raises(ImageError, match="not a tar archive") as err:
        store.resolve(str(garbage))
    assert str(garbage) in str(err.value)


def test_tar_of_unknown_format(store: ImageStore, tmp_path: Path) -> None:
    archive = tmp_path / "plain.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(__file__, arcname="hello.py")
    with pytest.raises(ImageError, match="unknown image format"):
        store.resolve(str(archive))


# --- where image paths may lie --------------------------------------------------------------


def _tree(base: Path) -> dict[str, Path]:
    """data/ and cache/ (the orchestrator's own, each with images/ inside), extra/ (allowed
    by config), elsewhere/ (allowed by nothing); each holds a rootfs dir."""
    dirs = {name: base / name for name in ("data", "extra", "elsewhere")}
    dirs["images"] = dirs["data"] / "images"
    dirs["cache"] = base / "cache" / "images"
    for d in dirs.values():
        (d / "rootfs" / "etc").mkdir(parents=True)
    return dirs


def test_image_paths_must_lie_in_an_image_dir(tmp_path: Path) -> None:
    d = _tree(tmp_path)
    private = [d["data"], d["cache"].parent]
    store = ImageStore(d["cache"], d["images"], [d["extra"]], private=private)
    for name in ("cache", "images", "extra"):
        rootfs = d[name] / "rootfs"
        assert store.resolve(str(rootfs)).rootfs == rootfs
    with pytest.raises(ImageForbidden, match="outside the image directories") as err:
        store.resolve(str(d["elsewhere"] / "rootfs"))
    assert "images.allowed_paths" in str(err.value)
    # No way around it by dots or symlinks; a link is judged, and used, by where it leads.
    with pytest.raises(ImageForbidden, match="outside"):
        store.resolve(f"{d['extra']}/../elsewhere/rootfs")
    (d["extra"] / "out").symlink_to(d["elsewhere"] / "rootfs")
    with pytest.raises(ImageForbidden, match=f"really {d['elsewhere']}/rootfs"):
        store.resolve(str(d["extra"] / "out"))
    (d["extra"] / "in").symlink_to(d["images"] / "rootfs")
    assert store.resolve(str(d["extra"] / "in")).rootfs == d["images"] / "rootfs"
    # The orchestrator's own files are no image, not even where a broader allowed dir holds
    # them; the image dir inside is nearer, and so allowed.
    broad = ImageStore(d["cache"], d["images"], [tmp_path], private=private)
    with pytest.raises(ImageForbidden, match="orchestrator's own directory"):
        broad.confine(str(d["data"] / "rootfs"))
    assert broad.confine(str(d["images"] / "rootfs")) == d["images"] / "rootfs"
    assert broad.confine(str(d["elsewhere"] / "rootfs")) == d["elsewhere"] / "rootfs"


def test_an_allowed_path_inside_the_data_dir_is_refused_at_start(tmp_path: Path) -> None:
    d = _tree(tmp_path)
    with pytest.raises(ImageError, match=f"images.allowed_paths entry {d['data']}/x lies in"):
        ImageStore(d["cache"], d["images"], [d["data"] / "x"], private=[d["data"]])


def test_image_settings() -> None:
    settings = Settings(data_dir=Path("/srv/orchard"), images={"allowed_paths": ["/srv/img"]})
    assert settings.image_dir() == Path("/srv/orchard/images")
    assert settings.images.allowed_paths == [Path("/srv/img")]
    with pytest.raises(ValueError, match="rel/img is not an absolute path"):
        Settings(images={"allowed_paths": ["rel/img"]})
