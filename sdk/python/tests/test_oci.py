"""OCI images, exec users and snapshot packs against the fake daemon's model
of them (tests/fake_oci.py): pulls with progress and credentials, creates that
pull on first use, export to a file and import from one (streamed), push and
pull through the modelled registry, and each error the daemon can answer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

import zygote
from zygote import AsyncClient, AsyncSandbox, Client, Sandbox, TransferProgress

from .fake_daemon import FakeDaemon, FakeFiles
from .fake_oci import FakeOci, RegistryImage
from .fake_processes import FakeProcesses

APP = "127.0.0.1:5000/team/app:1"
WARM = "127.0.0.1:5000/team/warm:v1"


@pytest.fixture
def oci() -> FakeOci:
    return FakeOci(
        registry={
            APP: RegistryImage(layers=[700, 300]),
            "127.0.0.1:5000/arm/only:1": RegistryImage(layers=[10], arch="arm64"),
            "127.0.0.1:5000/team/broken:1": RegistryImage(layers=[10], broken=True),
        }
    )


@pytest.fixture
def fake(oci: FakeOci) -> Iterator[FakeDaemon]:
    f = FakeDaemon(files=FakeFiles(), oci=oci).start()
    yield f
    f.stop()


@pytest.fixture
def client(fake: FakeDaemon) -> Iterator[Client]:
    with Client(fake.url, "t") as c:
        yield c


def kinds(events: list[TransferProgress]) -> list[tuple[str, Any]]:
    return [(e.type, e.state or e.line or e.digest) for e in events]


# --- images -----------------------------------------------------------------------


def test_pull_image_reports_progress_and_returns_the_image(client: Client, fake: FakeDaemon, oci: FakeOci) -> None:
    seen: list[TransferProgress] = []
    image = client.pull_image(APP, on_progress=seen.append)
    assert (image.name, image.source) == (APP, APP)
    assert image.digest == oci.registry[APP].manifest(APP)
    assert [e.type for e in seen] == ["resolved", "layer", "layer", "layer", "layer", "progress"]
    resolved = seen[0]
    assert (resolved.reference, resolved.digest, resolved.layers, resolved.bytes) == (APP, image.digest, 2, 1000)
    first = seen[1:3]
    assert [(e.index, e.done, e.total, e.state) for e in first] == [(0, 0, 700, "downloading"), (0, 700, 700, "done")]
    assert seen[-1].line == "converting to ext4"
    assert json.loads(fake.requests[0].body) == {"reference": APP}
    assert fake.requests[0].path == "/v1/images"

    listed = {i.name: i for i in client.images()}
    assert set(listed) == {"minimal", APP}
    assert (listed["minimal"].source, listed["minimal"].digest) == (None, None)
    assert (listed[APP].source, listed[APP].digest) == (APP, image.digest)

    # The layers are in the daemon's store now: a second pull downloads none.
    again: list[TransferProgress] = []
    client.pull_image(APP, on_progress=again.append)
    assert [e.state for e in again if e.type == "layer"] == ["cached", "cached"]


def test_pull_image_errors_map_to_their_classes(client: Client) -> None:
    cases: list[tuple[str, type[zygote.ZygoteError], str]] = [
        ("127.0.0.1:5000/team/missing:1", zygote.ImageNotFound, "image_not_found"),
        ("127.0.0.1:5000/arm/only:1", zygote.UnsupportedPlatform, "unsupported_platform"),
        ("127.0.0.1:5000/team/broken:1", zygote.BadImage, "bad_image"),
    ]
    for ref, cls, code in cases:
        with pytest.raises(cls) as e:
            client.pull_image(ref)
        assert e.value.code == code and e.value.status is None, ref
    assert issubclass(zygote.ImageNotFound, zygote.NotFoundError)
    assert issubclass(zygote.RegistryError, zygote.ServerError)
    # Refused before any stream: the status is there.
    with pytest.raises(zygote.InvalidArgument) as bad:
        client.pull_image("Not A Reference")
    assert bad.value.status == 400


def test_pull_image_with_credentials(client: Client, fake: FakeDaemon, oci: FakeOci) -> None:
    oci.auth = ("ci", "pw")
    with pytest.raises(zygote.RegistryUnauthorized) as e:
        client.pull_image(APP)
    assert e.value.code == "registry_unauthorized"
    with pytest.raises(zygote.RegistryUnauthorized):
        client.pull_image(APP, username="ci", password="wrong")
    assert client.pull_image(APP, username="ci", password="pw").name == APP
    assert json.loads(fake.requests[-1].body) == {"reference": APP, "username": "ci", "password": "pw"}
    sent = len(fake.requests)
    with pytest.raises(ValueError, match="go together"):
        client.pull_image(APP, username="ci")
    assert len(fake.requests) == sent


def test_a_stream_without_its_last_line_or_with_an_unknown_line(fake: FakeDaemon) -> None:
    fake.oci = None
    fake.load(
        [
            {"status": 200, "ndjson": [{"type": "resolved", "reference": APP, "digest": "sha256:1", "layers": 1, "bytes": 1}]},
            {"status": 200, "ndjson": [{"type": "newer_kind", "x": 1}, {"type": "done", "image": {"name": APP}}]},
            {"status": 200, "ndjson": [{"type": "error", "code": "registry_error", "message": "502 from the registry"}]},
        ]
    )
    seen: list[TransferProgress] = []
    with Client(fake.url, "t") as c:
        with pytest.raises(zygote.ServerError) as e:
            c.pull_image(APP)
        assert e.value.code == "stream_ended"
        assert c.pull_image(APP, on_progress=seen.append).name == APP
        with pytest.raises(zygote.RegistryError) as failed:
            c.pull_image(APP)
    assert [(p.type, p.raw) for p in seen] == [("newer_kind", {"type": "newer_kind", "x": 1})]
    assert failed.value.code == "registry_error"


def test_create_from_a_reference_pulls_it_first(client: Client, oci: FakeOci) -> None:
    sb = Sandbox.create(APP, client=client)
    assert sb.info().state == "running"
    assert APP in [i.name for i in client.images()]
    with pytest.raises(zygote.ImageNotFound) as e:
        Sandbox.create("127.0.0.1:5000/team/missing:1", client=client)
    assert e.value.status == 404


# --- exec users -----------------------------------------------------------------


def test_run_sends_the_user(fake: FakeDaemon) -> None:
    exit_ok = {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False, "duration_ms": 1}
    fake.load([{"status": 200, "ndjson": [exit_ok]}] * 3)
    with Client(fake.url, "t") as c:
        sb = Sandbox("sb-aaaaaaaaaaaa", client=c)
        sb.commands.run("id -u", user="1000:1000")
        sb.commands.run(["id"], user=1000)
        sb.commands.run("id")
        with pytest.raises(TypeError):
            sb.commands.run("id", user=True)
    bodies = [json.loads(r.body) for r in fake.requests]
    assert [b.get("user") for b in bodies] == ["1000:1000", "1000", None]
    assert "user" not in bodies[2]


def test_background_run_sends_the_user(fake: FakeDaemon) -> None:
    fake.processes = FakeProcesses()
    with Client(fake.url, "t") as c:
        h = Sandbox("sb-aaaaaaaaaaaa", client=c).commands.run("echo hi", background=True, user="root")
        assert h.wait().stdout == "hi\n"
    assert json.loads(fake.requests[0].body)["user"] == "root"


# --- snapshot packs -------------------------------------------------------------


def test_export_streams_to_a_file_and_import_streams_it_back(client: Client, fake: FakeDaemon, oci: FakeOci, tmp_path: Path) -> None:
    sb = Sandbox.create(client=client)
    snap = sb.snapshot(name="warm")
    assert snap.pack is None
    dest = tmp_path / "warm.tar"
    size = client.export_snapshot(snap, dest)
    data = dest.read_bytes()
    assert size == len(data) == len(oci.tar(oci.snapshots[snap.id]))
    assert fake.requests[-1].path == f"/v1/snapshots/{snap.id}/export"
    assert os.listdir(tmp_path) == ["warm.tar"]

    imported = client.import_snapshot(dest, name="warm-copy")
    req = fake.requests[-1]
    assert (req.method, req.path, req.query) == ("POST", "/v1/snapshots/import", {"name": "warm-copy"})
    assert req.body == data
    assert req.headers["content-type"] == "application/x-tar"
    assert req.headers["content-length"] == str(len(data))
    assert imported.id != snap.id and imported.name == "warm-copy"
    assert imported.pack is not None
    assert (imported.pack.source, imported.pack.snapshot) == ("file", snap.id)
    assert imported.pack.digest.startswith("sha256:")
    assert client.get_snapshot(imported.id).pack == imported.pack
    # No name: the exported one's.
    assert client.import_snapshot(str(dest)).name == "warm"


def test_a_large_import_is_sent_whole(client: Client, fake: FakeDaemon, tmp_path: Path) -> None:
    # Over a few read chunks, not a multiple of them: sent as it is read, with its length.
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(3 * (1 << 20) + 12345))
    with pytest.raises(zygote.BadImage) as e:
        client.import_snapshot(junk)
    assert e.value.status == 422
    assert fake.requests[-1].body == junk.read_bytes()
    assert fake.requests[-1].headers["content-length"] == str(junk.stat().st_size)


def test_export_failures_leave_no_file(client: Client, oci: FakeOci, tmp_path: Path) -> None:
    dest = tmp_path / "x.tar"
    with pytest.raises(zygote.SnapshotNotFound):
        client.export_snapshot("snap-000000000000", dest)
    snap = Sandbox.create(client=client).snapshot()
    oci.cut_exports.add(snap.id)
    with pytest.raises(zygote.ServerError) as e:
        client.export_snapshot(snap, dest)
    assert e.value.code == "stream_ended"
    assert os.listdir(tmp_path) == []
    oci.cut_exports.clear()
    with pytest.raises(FileNotFoundError):
        client.export_snapshot(snap, tmp_path / "no" / "such" / "dir.tar")
    with pytest.raises(FileNotFoundError):
        client.import_snapshot(tmp_path / "missing.tar")


def test_push_and_pull_a_snapshot_through_the_registry(client: Client, fake: FakeDaemon, oci: FakeOci) -> None:
    snap = Sandbox.create(client=client).snapshot(name="warm")
    seen: list[TransferProgress] = []
    pushed = client.push_snapshot(snap, WARM, on_progress=seen.append)
    assert (pushed.reference, pushed.size) == (WARM, 6000)
    assert pushed.digest.startswith("sha256:")
    assert fake.requests[-1].path == f"/v1/snapshots/{snap.id}/push"
    assert json.loads(fake.requests[-1].body) == {"reference": WARM}
    assert seen[0].line == "packing"
    blobs = [(e.index, e.state) for e in seen if e.type == "blob"]
    assert blobs == [(0, "downloading"), (0, "done"), (1, "downloading"), (1, "done"), (2, "downloading"), (2, "done")]
    # A second push sends nothing.
    again: list[TransferProgress] = []
    client.push_snapshot(snap.id, WARM, on_progress=again.append)
    assert {e.state for e in again if e.type == "blob"} == {"cached"}

    got: list[TransferProgress] = []
    pulled = client.pull_snapshot(WARM, name="warm-pulled", on_progress=got.append)
    assert json.loads(fake.requests[-1].body) == {"reference": WARM, "name": "warm-pulled"}
    assert pulled.name == "warm-pulled" and pulled.id != snap.id
    assert pulled.pack is not None
    assert (pulled.pack.source, pulled.pack.digest, pulled.pack.snapshot) == (f"oci://{WARM}", pushed.digest, snap.id)
    assert [e.type for e in got] == ["progress", "blob", "blob", "blob"]
    assert pulled.id in [s.id for s in client.snapshots()]


def test_restore_from_a_pack_reference_pulls_it_first(client: Client, oci: FakeOci) -> None:
    snap = Sandbox.create(client=client).snapshot()
    client.push_snapshot(snap, WARM)
    before = len(oci.snapshots)
    sb = Sandbox.restore(WARM, client=client)
    assert sb.info().state == "running"
    assert len(oci.snapshots) == before + 1


def test_pack_errors(client: Client, oci: FakeOci) -> None:
    with pytest.raises(zygote.SnapshotNotFound) as e:
        client.push_snapshot("snap-000000000000", WARM)
    assert e.value.status == 404
    with pytest.raises(zygote.ImageNotFound):
        client.pull_snapshot(WARM)
    snap = Sandbox.create(client=client).snapshot()
    with pytest.raises(zygote.InvalidArgument):
        client.push_snapshot(snap, "Bad Ref")
    oci.auth = ("ci", "pw")
    with pytest.raises(zygote.RegistryUnauthorized):
        client.push_snapshot(snap, WARM)
    client.push_snapshot(snap, WARM, username="ci", password="pw")
    with pytest.raises(zygote.RegistryUnauthorized):
        client.pull_snapshot(WARM)
    assert client.pull_snapshot(WARM, username="ci", password="pw").pack is not None
    with pytest.raises(ValueError):
        client.pull_snapshot(WARM, password="pw")


# --- async ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_images_users_and_packs(fake: FakeDaemon, oci: FakeOci, tmp_path: Path) -> None:
    seen: list[str] = []

    async def on_progress(p: TransferProgress) -> None:
        seen.append(p.type)

    async with AsyncClient(fake.url, "t") as c:
        image = await c.pull_image(APP, on_progress=on_progress)
        assert image.source == APP and seen[0] == "resolved"
        assert APP in [i.name for i in await c.images()]
        sb = await AsyncSandbox.create(APP, client=c)
        snap = await sb.snapshot(name="warm")

        dest = tmp_path / "warm.tar"
        size = await c.export_snapshot(snap, dest)
        assert size == dest.stat().st_size > 0
        imported = await c.import_snapshot(dest)
        assert imported.pack is not None and imported.pack.source == "file"
        assert fake.requests[-1].body == dest.read_bytes()
        oci.cut_exports.add(snap.id)
        with pytest.raises(zygote.ServerError):
            await c.export_snapshot(snap, tmp_path / "cut.tar")
        assert sorted(os.listdir(tmp_path)) == ["warm.tar"]

        blobs: list[str] = []
        pushed = await c.push_snapshot(snap, WARM, on_progress=lambda p: blobs.append(p.state or ""))
        assert pushed.reference == WARM and "done" in blobs
        pulled = await c.pull_snapshot(WARM)
        assert pulled.pack is not None and pulled.pack.digest == pushed.digest
        restored = await AsyncSandbox.restore(WARM, client=c)
        assert (await restored.info()).state == "running"
        with pytest.raises(zygote.ImageNotFound):
            await c.pull_image("127.0.0.1:5000/team/missing:1")

    fake.processes = FakeProcesses()
    fake.files = None
    async with AsyncClient(fake.url, "t") as c:
        h = await AsyncSandbox("sb-aaaaaaaaaaaa", client=c).commands.run("echo hi", background=True, user="0:0")
        assert (await h.wait()).stdout == "hi\n"
    [started] = [r for r in fake.requests if r.path.endswith("/exec")]
    assert json.loads(started.body)["user"] == "0:0"
