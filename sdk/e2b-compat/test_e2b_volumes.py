"""E2B's volumes through its unchanged Python SDK (e2b==2.63.0): Volume.create / list /
get_info / destroy, and Sandbox.create(volume_mounts=...) (issue 35). A volume outlives
the sandbox that wrote it; it is written by one sandbox at a time.

Run by scripts/e2b-test.sh (a private zygoted, qemu runtime; see test_e2b_python.py).
"""
import os
import uuid

import pytest
from e2b import Sandbox, Volume, VolumeFileType
from e2b.exceptions import (
    SandboxException,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "base")


def test_volume_lifecycle_and_mount_outlives_the_sandbox():
    name = "e2b-vol-" + uuid.uuid4().hex[:8]
    vol = Volume.create(name)
    try:
        assert vol.name == name and vol.volume_id.startswith("vol-")
        assert vol.token, "VolumeAndToken carries the volume's own token"
        assert vol.token != os.environ["E2B_API_KEY"], "never the daemon's token"
        listed = {v.volume_id: v.name for v in Volume.list()}
        assert listed.get(vol.volume_id) == name
        info = Volume.get_info(vol.volume_id)
        assert (info.volume_id, info.name, info.token) == (vol.volume_id, name, vol.token)

        # Mounted by a Volume instance; the sandbox's default user writes it.
        s = Sandbox.create(template=TEMPLATE, timeout=600, volume_mounts={"/mnt/data": vol})
        try:
            s.files.write("/mnt/data/hello.txt", "written through e2b")
            mounts = s.commands.run("grep ' /mnt/data ' /proc/mounts").stdout
            assert "ext4" in mounts, mounts
            # One writer at a time: destroy and a second mount are refused.
            with pytest.raises(VolumeException):
                Volume.destroy(vol.volume_id)
            with pytest.raises(SandboxException):
                Sandbox.create(template=TEMPLATE, timeout=60, volume_mounts={"/x": name})
        finally:
            s.kill()

        # Mounted by name in a new sandbox: the file outlived the first one.
        s2 = Sandbox.create(template=TEMPLATE, timeout=600, volume_mounts={"/data": name})
        try:
            assert s2.files.read("/data/hello.txt") == "written through e2b"
        finally:
            s2.kill()
    finally:
        Volume.destroy(vol.volume_id)
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id)
    assert vol.volume_id not in {v.volume_id for v in Volume.list()}


def test_bad_volume_requests():
    with pytest.raises(VolumeException):
        Volume.create("bad/name")
    with pytest.raises(SandboxException, match="volume"):
        Sandbox.create(template=TEMPLATE, timeout=60, volume_mounts={"/d": "no-such-volume"})
    name = "e2b-vol-" + uuid.uuid4().hex[:8]
    vol = Volume.create(name)
    try:
        with pytest.raises(VolumeException):
            Volume.create(name)
        for path in ["/", "relative", "/proc/x", "/a/../etc"]:
            with pytest.raises(SandboxException):
                Sandbox.create(template=TEMPLATE, timeout=60, volume_mounts={path: vol})
    finally:
        assert Volume.destroy(vol.volume_id) is True


def test_volume_content_api_detached_and_attached():
    """Volume.write_file/read_file/list/make_dir/get_info/update_metadata/remove on a
    volume no sandbox has (a helper sandbox serves it) and on one a sandbox has mounted
    (that sandbox serves it): the same files either way."""
    name = "e2b-vol-" + uuid.uuid4().hex[:8]
    vol = Volume.create(name)
    try:
        info = vol.write_file("/notes/a.txt", "alpha")
        assert info.name == "a.txt" and info.size == 5
        assert vol.read_file("/notes/a.txt") == "alpha"
        made = vol.make_dir("/deep/er", force=True)
        assert made.type == VolumeFileType.DIRECTORY and made.path == "/deep/er"
        listed = sorted(e.path for e in vol.list("/", depth=2))
        assert "/notes/a.txt" in listed and "/deep/er" in listed, listed
        assert vol.exists("/notes/a.txt") and not vol.exists("/nope")
        vol.update_metadata("/notes/a.txt", mode=0o600)
        assert vol.get_info("/notes/a.txt").mode & 0o777 == 0o600
        with pytest.raises(VolumePathNotFoundException):
            vol.read_file("/missing")
        with pytest.raises(VolumeException):
            vol.read_file("/../etc/passwd")

        # A wrong token is refused; the daemon's key is not a volume token.
        with pytest.raises(Exception, match="401"):
            Volume(vol.volume_id, name, token="wrong").read_file("/notes/a.txt")
        with pytest.raises(Exception, match="401"):
            Volume(vol.volume_id, name, token=os.environ["E2B_API_KEY"]).read_file("/notes/a.txt")

        # Mounted in a sandbox: the content API reaches the same files through it.
        s = Sandbox.create(template=TEMPLATE, timeout=600, volume_mounts={"/mnt/v": vol})
        try:
            assert s.files.read("/mnt/v/notes/a.txt") == "alpha"
            vol.write_file("/from-api.txt", "beta")
            assert s.files.read("/mnt/v/from-api.txt") == "beta"
            s.files.write("/mnt/v/from-sandbox.txt", "gamma")
            assert vol.read_file("/from-sandbox.txt") == "gamma"
            vol.remove("/deep")
            assert not vol.exists("/deep")
        finally:
            s.kill()
    finally:
        assert Volume.destroy(vol.volume_id) is True
