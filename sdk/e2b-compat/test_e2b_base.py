"""E2B's default template `base` (issue 35): what code written for E2B expects in it.

`Sandbox.create()` names no template, so E2B's SDK asks for `base`, which zygote builds from
guest/rootfs/recipes/base.recipe on first use (scripts/e2b-test.sh builds it first, with
progress, so no test waits on a silent build).
"""
from e2b import Sandbox


def test_the_default_template_is_base_with_the_tools_e2b_users_expect():
    s = Sandbox.create(timeout=600, metadata={"suite": "e2b-compat"})
    try:
        assert s.get_info().template_id == "base"
        versions = {
            "bash": "bash --version",
            "python3": "python3 --version",
            "pip": "python3 -m pip --version",
            "venv": "python3 -m venv --help",
            "node": "node --version",
            "npm": "npm --version",
            "git": "git --version",
            "curl": "curl --version",
            "sudo": "sudo --version",
        }
        for tool, cmd in versions.items():
            r = s.commands.run(cmd)
            assert r.exit_code == 0 and r.stdout.strip(), (tool, r)
        assert s.commands.run("node -e 'console.log(6 * 7)'").stdout == "42\n"
        bundle = s.commands.run("test -s /etc/ssl/certs/ca-certificates.crt && echo ok")
        assert bundle.stdout == "ok\n", "CA certificates are installed"
    finally:
        s.kill()


def test_base_has_the_unprivileged_user_with_passwordless_sudo():
    s = Sandbox.create("base", timeout=600, metadata={"suite": "e2b-compat"})
    try:
        entry = s.commands.run("getent passwd user").stdout.strip()
        assert entry == "user:x:1000:1000::/home/user:/bin/bash", entry
        assert s.commands.run("stat -c %U:%G:%a /home/user").stdout == "user:user:750\n"
        who = s.commands.run("sudo -n -u user sh -c 'id -un; sudo -n id -un'").stdout
        assert who == "user\nroot\n", who
    finally:
        s.kill()
