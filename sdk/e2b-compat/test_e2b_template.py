"""E2B's Template SDK through its unchanged Python SDK (e2b==2.63.0) against zygote
(issue 35): Template().from_template("base") + run_cmd + copy + set_envs, built with
build logs; a sandbox from the template sees the file, the env and the command's effect;
an identical second build is served from the per-step cache; a failing run_cmd raises
the SDK's BuildException with its output; exists, tags; from_image of an OCI reference
on a loopback registry (skipped, saying why, without docker-registry/skopeo/umoci).

Run by scripts/e2b-test.sh (a private zygoted, qemu runtime). Every template made here
is deleted (DELETE /templates/<name>): snapshots of `base` sandboxes are large.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

BASE = os.environ.get("E2B_TEST_TEMPLATE", "base")


def delete_template(name):
    req = urllib.request.Request(
        os.environ["E2B_API_URL"] + "/templates/" + name,
        method="DELETE",
        headers={"X-API-Key": os.environ["E2B_API_KEY"]},
    )
    try:
        urllib.request.urlopen(req).close()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise


def native(path):
    """zygote's own REST API (the daemon token is the E2B key here)."""
    base = os.environ["E2B_API_URL"].removesuffix("/e2b")
    req = urllib.request.Request(
        base + path, headers={"Authorization": "Bearer " + os.environ["E2B_API_KEY"]}
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)


@pytest.fixture
def names():
    """Template names; the templates are deleted after the test, and with them every
    snapshot their builds and cache made."""
    made = []
    before = {s["id"] for s in native("/v1/snapshots")["snapshots"]}
    sandboxes_before = {s["id"] for s in native("/v1/sandboxes")["sandboxes"]}

    def new(prefix):
        n = f"{prefix}-{uuid.uuid4().hex[:8]}"
        made.append(n)
        return n

    yield new
    for n in made:
        delete_template(n)
    left = [s["id"] for s in native("/v1/snapshots")["snapshots"] if s["id"] not in before]
    assert left == [], f"snapshots left behind: {left}"
    new_sandboxes = [
        s["id"] for s in native("/v1/sandboxes")["sandboxes"] if s["id"] not in sandboxes_before
    ]
    assert new_sandboxes == [], f"sandboxes left behind: {new_sandboxes}"


def context(tmp_path):
    d = tmp_path / "ctx"
    (d / "data" / "sub").mkdir(parents=True)
    (d / "data" / "hello.txt").write_text("hello from the build context\n")
    (d / "data" / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(d / "data" / "sub" / "run.sh", 0o755)
    return d


def template(ctx):
    return (
        Template(file_context_path=str(ctx))
        .from_template(BASE)
        .run_cmd("echo built > /tmp/marker && echo step-output-line")
        .copy("data", "/home/user/data")
        .set_envs({"TPL_GREETING": "hi there"})
        .run_cmd("cat /home/user/data/hello.txt > /home/user/copied.txt", user="user")
    )


def build(t, name, **kw):
    logs = []
    Template.build(t, name, on_build_logs=lambda e: logs.append(e.message), **kw)
    return logs


def test_build_create_and_cache(tmp_path, names):
    ctx = context(tmp_path)
    name = names("tpl")
    logs = build(template(ctx), name)
    text = "\n".join(logs)
    # The RUN step's output is a log line of its own (the step's echo, not its title).
    assert "step-output-line" in logs, text
    assert "CACHED" not in text, text
    assert Template.exists(name)

    s = Sandbox.create(name)
    try:
        assert s.files.read("/home/user/data/hello.txt") == "hello from the build context\n"
        assert s.files.read("/home/user/data/sub/run.sh").startswith("#!/bin/sh")
        assert s.commands.run("/home/user/data/sub/run.sh").stdout.strip() == "ran"
        assert s.commands.run("cat /tmp/marker").stdout.strip() == "built"
        assert s.commands.run("echo $TPL_GREETING").stdout.strip() == "hi there"
        assert s.commands.run("cat /home/user/copied.txt").stdout.startswith("hello")
        owner = s.commands.run("stat -c %U /home/user/copied.txt").stdout.strip()
        assert owner == "user"
    finally:
        s.kill()

    # The same template again: every step from the cache.
    again_logs = build(template(ctx), name)
    again = "\n".join(again_logs)
    assert again.count("CACHED") == 4, again
    assert "step-output-line" not in again_logs, again
    assert "Skipping upload" in again, again

    # A changed file: the COPY step and those after it run again.
    (ctx / "data" / "hello.txt").write_text("changed\n")
    third = "\n".join(build(template(ctx), name + ":v2"))
    assert third.count("CACHED") == 1, third
    s = Sandbox.create(name + ":v2")
    try:
        assert s.files.read("/home/user/data/hello.txt") == "changed\n"
    finally:
        s.kill()

    # skip_cache: nothing from the cache.
    forced = "\n".join(build(template(ctx), name, skip_cache=True))
    assert "CACHED" not in forced, forced


def test_failing_step_raises_with_its_output(names):
    name = names("tpl-fail")
    t = (
        Template()
        .from_template(BASE)
        .run_cmd("echo this-went-wrong >&2; exit 3")
    )
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(BuildException) as e:
        build(t, name)
    msg = str(e.value)
    assert "this-went-wrong" in msg and "exit status 3" in msg, msg
    assert not Template.exists(name)
    # No build sandbox is left behind.
    assert {s.sandbox_id for s in Sandbox.list().next_items()} <= before


def test_tags_and_exists(names):
    name = names("tpl-tags")
    assert not Template.exists(name)
    t = Template().from_template(BASE).set_envs({"A": "1"})
    build(t, name, tags=["v1"], cpu_count=1, memory_mb=768)
    assert Template.exists(name)
    tags = {x.tag for x in Template.get_tags(name)}
    assert tags == {"v1"}, tags
    info = Template.assign_tags(name + ":v1", ["stable", "latest"])
    assert sorted(info.tags) == ["latest", "stable"]
    tags = {x.tag for x in Template.get_tags(name)}
    assert tags == {"v1", "stable", "latest"}, tags
    Template.remove_tags(name, ["latest"])
    tags = {x.tag for x in Template.get_tags(name)}
    assert tags == {"v1", "stable"}, tags
    s = Sandbox.create(name + ":stable")
    try:
        assert s.commands.run("echo $A").stdout.strip() == "1"
        # The build's size is the template's (a snapshot carries it).
        info = s.get_info()
        assert (info.cpu_count, info.memory_mb) == (1, 768), info
    finally:
        s.kill()


def oci_tools_missing():
    for tool in ("docker-registry", "skopeo", "umoci"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup.sh)"
    if not os.path.isfile("/bin/busybox"):
        return "no /bin/busybox (busybox-static)"
    return None


@pytest.fixture
def registry(tmp_path):
    """Debian's docker-registry on 127.0.0.1 (a loopback registry: the daemon pulls from
    it over plain HTTP), with a busybox image pushed by skopeo: `<addr>/tpl/busybox:1`."""
    why = oci_tools_missing()
    if os.environ.get("E2B_TEST_DAEMON_URL"):
        why = "the daemon runs elsewhere (the nested lane): it cannot reach a loopback registry here"
    if why:
        print(f"skipping from_image test: {why}")
        pytest.skip(why)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {tmp_path / 'storage'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(tmp_path / "config.yml")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/").close()
                break
            except OSError:
                time.sleep(0.1)
        layout = tmp_path / "layout"
        run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
        run("umoci", "init", "--layout", str(layout))
        run("umoci", "new", "--image", f"{layout}:1")
        bundle = tmp_path / "bundle"
        run("umoci", "unpack", "--image", f"{layout}:1", str(bundle))
        root = bundle / "rootfs"
        (root / "bin").mkdir()
        (root / "etc").mkdir()
        shutil.copy("/bin/busybox", root / "bin" / "busybox")
        for applet in ("sh", "echo", "cat", "ls", "mkdir", "id"):
            os.symlink("busybox", root / "bin" / applet)
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        run("umoci", "repack", "--image", f"{layout}:1", str(bundle))
        run("umoci", "config", "--image", f"{layout}:1", "--config.env", "PATH=/bin")
        ref = f"127.0.0.1:{port}/tpl/busybox:1"
        run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:1", f"docker://{ref}")
        yield ref
    finally:
        proc.kill()
        proc.wait()


def test_from_image_of_an_oci_reference(registry, tmp_path, names):
    name = names("tpl-oci")
    ctx = tmp_path / "octx"
    ctx.mkdir()
    (ctx / "note.txt").write_text("copied into busybox\n")
    t = (
        Template(file_context_path=str(ctx))
        .from_image(registry)
        .run_cmd("echo from-busybox > /made-by-run")
        .copy("note.txt", "/opt/")
    )
    logs = build(t, name)
    assert "CACHED" not in "\n".join(logs)
    s = Sandbox.create(name)
    try:
        assert s.files.read("/made-by-run") == "from-busybox\n"
        assert s.files.read("/opt/note.txt") == "copied into busybox\n"
    finally:
        s.kill()
