"""E2B's Python SDK, unchanged (e2b==2.63.0): users and the filesystem (issue 35).

Run by scripts/e2b-test.sh (see test_e2b_python.py for the variables it sets). One
sandbox serves the whole module: each test works in its own directory.
"""
import io
import os

import pytest
from e2b import FileType, Sandbox
from e2b.exceptions import (
    AuthenticationException,
    FileNotFoundException,
)

TEMPLATE = os.environ.get("E2B_TEST_TEMPLATE", "base")


@pytest.fixture(scope="module")
def sbx():
    s = Sandbox.create(template=TEMPLATE, timeout=900, metadata={"suite": "e2b-files"})
    yield s
    s.kill()


def add_user(sbx, name, uid):
    """A guest user made the way E2B's templates make `user` (no useradd needed)."""
    sbx.commands.run(
        f"echo '{name}:x:{uid}:{uid}::/home/{name}:/bin/bash' >> /etc/passwd && "
        f"echo '{name}:x:{uid}:' >> /etc/group && mkdir -p /home/{name} && "
        f"chown {uid}:{uid} /home/{name}",
        user="root",
    )


def test_users_run_commands_and_own_their_files(sbx):
    # Without `user` in the image the default is root, in its home (`base` has `user`).
    has_user = sbx.commands.run("getent passwd user || true", user="root").stdout != ""
    default = "user\n/home/user\n" if has_user else "root\n/root\n"
    assert sbx.commands.run("id -un; pwd").stdout == default
    add_user(sbx, "alice", 1001)
    r = sbx.commands.run("id -u; id -g; pwd; echo $HOME $USER", user="alice")
    assert r.stdout == "1001\n1001\n/home/alice\n/home/alice alice\n"
    # A relative path is under the user's home; the file and new parents are theirs.
    info = sbx.files.write("notes/today.txt", "hi", user="alice")
    assert info.path == "/home/alice/notes/today.txt"
    owners = sbx.commands.run(
        "stat -c %U:%G /home/alice/notes /home/alice/notes/today.txt"
    ).stdout
    assert owners == "alice:alice\nalice:alice\n"
    assert sbx.files.read("notes/today.txt", user="alice") == "hi"
    assert sbx.files.read("/home/alice/notes/today.txt") == "hi"
    # Unknown users are envd's `invalid username`.
    with pytest.raises(AuthenticationException, match="invalid username: 'ghost'"):
        sbx.commands.run("true", user="ghost")
    with pytest.raises(AuthenticationException, match="invalid username"):
        sbx.files.read("/etc/hostname", user="ghost")
    with pytest.raises(AuthenticationException, match="invalid username"):
        sbx.files.list("/", user="ghost")
    # Once the guest has `user`, it is the default (as on E2B's templates).
    if not has_user:
        add_user(sbx, "user", 1000)
    assert sbx.commands.run("id -un; pwd").stdout == "user\n/home/user\n"
    assert sbx.files.write("mine.txt", "m").path == "/home/user/mine.txt"
    assert sbx.commands.run("stat -c %U /home/user/mine.txt").stdout == "user\n"


def test_make_dir_list_info_rename_remove(sbx):
    base = "/tmp/fsops"
    assert sbx.files.make_dir(f"{base}/a/b", user="root") is True
    assert sbx.files.make_dir(f"{base}/a/b", user="root") is False
    sbx.files.write(f"{base}/a/b/f.txt", "12345", user="root")
    sbx.files.write(f"{base}/top.txt", "x", user="root")
    sbx.commands.run(f"ln -s top.txt {base}/link", user="root")

    top = sbx.files.list(base, user="root")
    assert sorted((e.name, e.type) for e in top) == [
        ("a", FileType.DIR),
        ("link", FileType.SYMLINK),
        ("top.txt", FileType.FILE),
    ]
    deep = sbx.files.list(base, depth=3, user="root")
    assert sorted(e.path for e in deep) == [
        f"{base}/a",
        f"{base}/a/b",
        f"{base}/a/b/f.txt",
        f"{base}/link",
        f"{base}/top.txt",
    ]

    info = sbx.files.get_info(f"{base}/a/b/f.txt", user="root")
    assert (info.name, info.type, info.size) == ("f.txt", FileType.FILE, 5)
    assert (info.mode, info.permissions) == (0o644, "-rw-r--r--")
    assert (info.owner, info.group) == ("root", "root")
    assert info.modified_time.year >= 2024
    link = sbx.files.get_info(f"{base}/link", user="root")
    assert (link.type, link.symlink_target) == (FileType.SYMLINK, "top.txt")
    assert sbx.files.get_info(f"{base}/a", user="root").permissions == "drwxr-xr-x"

    assert sbx.files.exists(f"{base}/top.txt", user="root") is True
    assert sbx.files.exists(f"{base}/nope", user="root") is False

    moved = sbx.files.rename(f"{base}/top.txt", f"{base}/new/dir/top2.txt", user="root")
    assert (moved.path, moved.name) == (f"{base}/new/dir/top2.txt", "top2.txt")
    assert sbx.files.read(f"{base}/new/dir/top2.txt", user="root") == "x"
    assert sbx.files.exists(f"{base}/top.txt", user="root") is False
    with pytest.raises(FileNotFoundException):
        sbx.files.rename(f"{base}/gone", f"{base}/x", user="root")

    sbx.files.remove(f"{base}/a", user="root")
    assert sbx.files.exists(f"{base}/a", user="root") is False
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info(f"{base}/a/b/f.txt", user="root")


def test_make_dir_is_owned_by_the_user(sbx):
    add_user(sbx, "bob", 1002)
    assert sbx.files.make_dir("proj/src", user="bob") is True
    r = sbx.commands.run("stat -c %U /home/bob/proj /home/bob/proj/src", user="root")
    assert r.stdout == "bob\nbob\n"
    entries = sbx.files.list("proj", user="bob")
    assert [(e.path, e.owner, e.group) for e in entries] == [
        ("/home/bob/proj/src", "bob", "bob")
    ]


def test_signed_download_and_upload_urls(sbx):
    import httpx

    sbx.files.write("/tmp/signed/in.txt", "signed content", user="root")
    url = sbx.download_url("/tmp/signed/in.txt", user="root")
    assert "signature=v1_" in url
    r = httpx.get(url)  # no routing headers, no token: the signature names the sandbox
    assert (r.status_code, r.text) == (200, "signed content")
    up = sbx.upload_url("/tmp/signed/out.txt", user="root", use_signature_expiration=60)
    r = httpx.post(up, files={"file": ("out.txt", b"uploaded")})
    assert r.status_code == 200, r.text
    assert sbx.files.read("/tmp/signed/out.txt", user="root") == "uploaded"
    # A read URL does not write, an expired one is refused, a forged one too.
    assert httpx.post(url, files={"file": ("x", b"x")}).status_code == 401
    expired = sbx.download_url("/tmp/signed/in.txt", user="root", use_signature_expiration=-5)
    r = httpx.get(expired)
    assert (r.status_code, r.json()["message"]) == (401, "signature is already expired")
    forged = url.replace("in.txt", "out.txt")
    r = httpx.get(forged)
    assert (r.status_code, r.json()["message"]) == (401, "invalid signature")


def test_many_files_octet_stream_gzip_and_read_forms(sbx):
    infos = sbx.files.write_files(
        [
            {"path": "/tmp/multi/a.txt", "data": "A"},
            {"path": "/tmp/multi/sub/b.bin", "data": b"\x00\x01B"},
        ],
        user="root",
    )
    assert [i.path for i in infos] == ["/tmp/multi/a.txt", "/tmp/multi/sub/b.bin"]
    assert sbx.files.read("/tmp/multi/sub/b.bin", format="bytes", user="root") == b"\x00\x01B"
    # A file object, streamed as application/octet-stream, gzipped on the wire.
    big = os.urandom(3 << 20) + b"tail"
    info = sbx.files.write("/tmp/multi/big", io.BytesIO(big), user="root", gzip=True)
    assert info.path == "/tmp/multi/big"
    plain = sbx.files.write("/tmp/multi/plain", io.BytesIO(b"p" * 1000), user="root", use_octet_stream=True)
    assert plain.name == "plain"
    assert sbx.files.read("/tmp/multi/plain", user="root") == "p" * 1000
    assert sbx.files.read("/tmp/multi/big", format="bytes", user="root", gzip=True) == big
    streamed = b"".join(sbx.files.read("/tmp/multi/big", format="stream", user="root"))
    assert streamed == big
    assert sbx.commands.run("stat -c %s /tmp/multi/big").stdout == f"{len(big)}\n"
    assert sbx.commands.run("ls -A /tmp/multi").stdout == "a.txt\nbig\nplain\nsub\n", "no staging left"
