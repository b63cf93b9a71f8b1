"""OCI images and snapshot packs against a real zygoted and a real registry
on 127.0.0.1 (tests/live_registry.py): a busybox image made with umoci and
pushed with skopeo is pulled (with progress, and on first use by a create),
booted and exec'd in as its config says (and as other users); a snapshot of
that sandbox is exported to a file and imported back, pushed to the registry
(a second push sends nothing) and pulled back, and sandboxes started from the
imported and the pulled snapshot find its files.

Skips, saying why, without docker-registry, skopeo, umoci or a static busybox
(and the pack part on a daemon whose runtime has no packs: kvm, for now).
Everything made is removed at the end: sandboxes, snapshots, the registry and
its storage, the temporary files."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

import zygote
from zygote import AsyncClient, Client, Sandbox, TransferProgress

from .live_registry import APP_FILE, GREETING, LocalRegistry, build_layout, unavailable

pytestmark = pytest.mark.live

STATE = "written before the snapshot\n"


@dataclass
class Registry:
    registry: LocalRegistry
    tmp: Path
    digest: str
    """The image's manifest digest (both tags)."""

    def ref(self, repo: str) -> str:
        return f"{self.registry.host}/{repo}"


@dataclass
class Made:
    """What the tests made, removed at the end: sandboxes first (they read their
    snapshots' disk layers), then snapshots, newest first."""

    sandboxes: list[Sandbox] = field(default_factory=list)
    snapshots: list[zygote.Snapshot] = field(default_factory=list)

    def sandbox(self, sb: Sandbox) -> Sandbox:
        self.sandboxes.append(sb)
        return sb

    def snapshot(self, snap: zygote.Snapshot) -> zygote.Snapshot:
        self.snapshots.append(snap)
        return snap


@pytest.fixture(scope="module")
def client(live_env: dict[str, str]) -> Iterator[Client]:
    with Client(live_env["url"], live_env["token"]) as c:
        yield c


@pytest.fixture(scope="module")
def registry(live_env: dict[str, str]) -> Iterator[Registry]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"the OCI live tests need a local registry: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="zygote-sdk-oci-"))
    reg = None
    try:
        reg = LocalRegistry()
        layout = build_layout(tmp)
        digest = reg.push(layout, "v1", "sdk/app:1")
        # The same image under a second name, for a create to pull on first use.
        assert reg.push(layout, "v1", "sdk/app:2") == digest
        yield Registry(reg, tmp, digest)
    finally:
        if reg is not None:
            reg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def made(client: Client) -> Iterator[Made]:
    m = Made()
    yield m
    for sb in m.sandboxes:
        sb.kill()
    # Newest first: a later snapshot of a sandbox may build on an earlier one.
    for snap in reversed(m.snapshots):
        client.delete_snapshot(snap)


@pytest.fixture(scope="module")
def packs(client: Client) -> None:
    """Skips the pack tests where the daemon cannot make packs."""
    runtime = client.info()["runtime"]["name"]
    if runtime != "qemu":
        pytest.skip(f"snapshot packs are the qemu runtime's; this daemon runs {runtime}")


@pytest.fixture(scope="module")
def oci_sb(client: Client, registry: Registry, made: Made) -> Sandbox:
    """A sandbox of the image, created from a reference the daemon has not pulled."""
    return made.sandbox(Sandbox.create(registry.ref("sdk/app:2"), memory_mib=128, client=client))


def test_pull_image_reports_progress_and_lists_it(client: Client, registry: Registry) -> None:
    ref = registry.ref("sdk/app:1")
    seen: list[TransferProgress] = []
    image = client.pull_image(ref, on_progress=seen.append)
    assert (image.source, image.digest) == (ref, registry.digest)
    assert image.name.endswith("sdk/app:1")
    kinds = [e.type for e in seen]
    assert kinds[0] == "resolved" and "layer" in kinds, kinds
    assert (seen[0].digest, seen[0].layers) == (registry.digest, 1)
    last = [e for e in seen if e.type == "layer"][-1]
    assert last.total and last.done == last.total and last.state in ("done", "cached"), last
    listed = {i.name: i for i in client.images()}
    assert listed[image.name].digest == registry.digest
    assert listed["minimal"].source is None
    with pytest.raises(zygote.ImageNotFound):
        client.pull_image(registry.ref("sdk/app:nope"))


def test_a_sandbox_of_the_image_runs_commands_as_its_config_says(oci_sb: Sandbox) -> None:
    r = oci_sb.commands.run("id -u; id -g; pwd; echo $GREETING")
    assert (r.exit_code, r.stdout) == (0, f"1000\n1000\n/app\n{GREETING}\n"), r
    assert oci_sb.commands.run("id -u; pwd", user="root", cwd="/").stdout == "0\n/\n"
    assert oci_sb.commands.run(["id", "-u"], user=4242).stdout == "4242\n"
    assert oci_sb.commands.run("id -u; id -g", user="1000:1234").stdout == "1000\n1234\n"
    assert oci_sb.commands.run("echo $GREETING", env={"GREETING": "mine"}).stdout == "mine\n"
    with pytest.raises(zygote.InvalidArgument):
        oci_sb.commands.run("id", user="app")
    h = oci_sb.commands.run("id -u", background=True, user="0")
    assert h.wait(timeout=60).stdout == "0\n"
    assert oci_sb.files.read("/app/hello.txt") == APP_FILE


def test_snapshot_export_import_push_pull_and_restore(
    client: Client, registry: Registry, oci_sb: Sandbox, made: Made, tmp_path: Path, packs: None
) -> None:
    oci_sb.files.write("/app/state.txt", STATE)
    snap = made.snapshot(oci_sb.snapshot(name="sdk-oci-live"))
    assert snap.pack is None

    pack = tmp_path / "snapshot.tar"
    size = client.export_snapshot(snap, pack)
    assert size == pack.stat().st_size > 0
    imported = made.snapshot(client.import_snapshot(pack, name="sdk-oci-imported"))
    assert imported.name == "sdk-oci-imported" and imported.id != snap.id
    assert imported.pack is not None and (imported.pack.source, imported.pack.snapshot) == ("file", snap.id)

    warm = registry.ref("sdk/warm:v1")
    pushing: list[TransferProgress] = []
    pushed = client.push_snapshot(snap, warm, on_progress=pushing.append)
    assert pushed.reference == warm and pushed.digest.startswith("sha256:") and pushed.size > 0
    blobs = [e for e in pushing if e.type == "blob"]
    assert blobs and {e.index for e in blobs} == set(range(len({e.index for e in blobs})))
    again: list[TransferProgress] = []
    assert client.push_snapshot(snap.id, warm, on_progress=again.append).digest == pushed.digest
    assert {e.state for e in again if e.type == "blob"} == {"cached"}, "a second push sends no blob"

    pulled = made.snapshot(client.pull_snapshot(warm, name="sdk-oci-pulled"))
    assert pulled.pack is not None
    assert (pulled.pack.source, pulled.pack.digest, pulled.pack.snapshot) == (f"oci://{warm}", pushed.digest, snap.id)
    assert {imported.id, pulled.id} <= {s.id for s in client.snapshots()}

    for source in (imported, pulled):
        sb = made.sandbox(Sandbox.restore(source, client=client))
        assert sb.files.read("/app/state.txt") == STATE
        # The image's run config came along: its user, its working directory.
        assert sb.commands.run("id -u; pwd").stdout == "1000\n/app\n"

    with pytest.raises(zygote.ImageNotFound):
        client.pull_snapshot(registry.ref("sdk/warm:nope"))


@pytest.mark.anyio
async def test_async_pull_export_import_and_push(
    live_env: dict[str, str], registry: Registry, oci_sb: Sandbox, made: Made, tmp_path: Path, packs: None
) -> None:
    async with AsyncClient(live_env["url"], live_env["token"]) as c:
        states: list[str] = []

        async def on_progress(p: TransferProgress) -> None:
            if p.type == "layer":
                states.append(p.state or "")

        # Converted already: nothing is downloaded again.
        image = await c.pull_image(registry.ref("sdk/app:1"), on_progress=on_progress)
        assert image.digest == registry.digest and set(states) <= {"cached"}, states

        snap = made.snapshot(oci_sb.snapshot(name="sdk-oci-async"))
        pack = tmp_path / "async.tar"
        size = await c.export_snapshot(snap, pack)
        assert size == pack.stat().st_size > 0
        imported = made.snapshot(await c.import_snapshot(pack))
        assert imported.pack is not None and imported.pack.snapshot == snap.id
        pushed = await c.push_snapshot(imported, registry.ref("sdk/warm:async"))
        assert pushed.reference == registry.ref("sdk/warm:async")
