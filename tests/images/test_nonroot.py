"""``local`` for a caller who is not root, as on a GPU node without Docker: host and image
sandboxes start through their zygotes, with the same jail as root gets.

The suite runs as root; this test re-runs a small script as an unprivileged uid (``setpriv``)
in a mount namespace of its own where the directories it needs (the interpreter, this
checkout, its home) are reachable: a directory only root may enter (``/root`` holding the
interpreter) is covered there by a view holding just the entries on the way.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from registry import tools_missing
from requirements import needs

pytestmark = [needs(tools_missing), pytest.mark.slow]

_UID = 65534  # nobody

_SCRIPT = """
import json, sys
from pathlib import Path
import anyio, sandlot

def via(sb):
    cmdline = Path(f"/proc/{sb.init_pid}/cmdline").read_bytes()
    return "bwrap" if b"bwrap" in cmdline else "zygote"

CHECKS = {
    "uid": "id -u",
    "interfaces": "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    "write_usr": "echo x > /usr/planted 2>/dev/null && echo written || echo refused",
    "write_proc": "echo x > /proc/sys/kernel/core_pattern 2>/dev/null || echo refused",
}
# max_processes is RLIMIT_NPROC here (no pids cgroup): per sandbox, not per zygote
FORKS = "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 60 & done; echo forked"

async def main():
    seen = {}
    for image in ("host", sys.argv[1]):
        async with sandlot.open("local", image=image, max_processes=20) as a:
            async with sandlot.open("local", image=image, max_processes=20) as b:
                seen[image] = {"via": [via(a), via(b)]}
                for name, command in CHECKS.items():
                    seen[image][name] = (await a.exec(command)).stdout.strip()
                r = await b.exec("test -e /usr/planted && echo seen || echo private")
                seen[image]["sibling_sees"] = r.stdout.strip()
                await a.exec(FORKS)
                seen[image]["forks"] = (await b.exec(FORKS, timeout=30)).stdout.strip()
    print(json.dumps(seen))

anyio.run(main)
"""


def _reachable(paths: list[Path], views: Path) -> list[str]:
    """Shell commands (run as root in a private mount namespace) after which uid :data:`_UID`
    can reach each of ``paths``: every ancestor it may not enter is covered by a view, a
    directory of mode 0755 where only the entries on the way are bound, innermost first."""
    blocked: dict[Path, set[str]] = {}
    for path in paths:
        for parent in reversed(path.parents):
            child = path.relative_to(parent).parts[0]
            if not os.stat(parent).st_mode & 0o001:
                blocked.setdefault(parent, set()).add(child)
    commands: list[str] = []
    for i, (parent, children) in enumerate(sorted(blocked.items(), key=lambda b: -len(b[0].parts))):
        view = views / str(i)
        view.mkdir(mode=0o755)
        view.chmod(0o755)
        for child in sorted(children):
            source, target = parent / child, view / child
            if source.is_dir():
                target.mkdir()
            else:
                target.touch()
            commands.append(shlex.join(["mount", "--rbind", str(source), str(target)]))
        commands.append(shlex.join(["mount", "--rbind", str(view), str(parent)]))
    return commands


def _as_nobody(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    repo = Path(__file__).resolve().parents[2]
    needed = [Path(sys.base_prefix).resolve(), Path(sys.prefix), repo, home]
    drop = ["setpriv", f"--reuid={_UID}", f"--regid={_UID}", "--clear-groups", *argv]
    # not below a directory a view covers (pytest's tmp_path is in one: mode 0700)
    with tempfile.TemporaryDirectory(prefix="sandlot-views-") as views:
        script = " && ".join([*_reachable(needed, Path(views)), shlex.join(drop)])
        return _run_unshared(script, home, repo)


def _run_unshared(script: str, home: Path, repo: Path) -> subprocess.CompletedProcess[str]:
    # XDG_RUNTIME_DIR as a login session sets it: without it skopeo reads
    # /run/containers/UID/auth.json, which root's podman may have left unreadable
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(repo),
           "LANG": "C.UTF-8", "XDG_RUNTIME_DIR": str(home)}  # fmt: skip
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=env, capture_output=True, text=True, timeout=600, check=False, cwd=home,
    )  # fmt: skip


def test_a_caller_who_is_not_root_gets_both_zygotes_and_the_same_jail(
    layered: str, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("drops root itself: run the suite as root (as a user, every test is this)")
    for tool in ("setpriv", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (util-linux)")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, _UID, _UID)
    probe = _as_nobody(["sh", "-c", "unshare --user true 2>&1 || echo refused"], home)
    assert probe.returncode == 0, probe.stderr
    if probe.stdout.strip().endswith("refused"):
        pytest.skip(
            "this kernel forbids unprivileged user namespaces (user.max_user_namespaces, "
            f"kernel.unprivileged_userns_clone or an AppArmor/SELinux policy): {probe.stdout}"
        )
    done = _as_nobody([sys.executable, "-c", _SCRIPT, layered], home)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    for image, view in seen.items():
        assert view == {
            "via": ["zygote", "zygote"],
            "uid": "0",  # root of a user namespace: the caller outside it
            "interfaces": "lo",
            # the host's /usr is read-only; an image's is the sandbox's own writable layer
            "write_usr": "refused" if image == "host" else "written",
            "sibling_sees": "private",
            "write_proc": "refused",
            "forks": "forked",
        }, (image, done.stderr[-3000:])
    # the image went to the caller's own cache, under its home ($XDG_CACHE_HOME's default)
    assert any((home / ".cache" / "sandlot" / "images" / "layers").iterdir())
