"""What the model changed, as the repository says, and the patches refused before any applier.

The patch text is not trusted to say what it changes: ``git apply`` and GNU ``patch`` accept
diffs without a ``diff --git`` line, quoted and escaped names, renames, copies, mode changes,
symlinks and gitlinks. So:

* **before any applier runs**, every name the patch text could give an applier (``diff --git``,
  ``---``/``+++``/``***``, ``Index:``, ``rename``/``copy from``/``to`` lines, C-quoted or not,
  each word and the whole rest of the line) is checked: a ``.git`` component or a ``..``
  component refuses the patch (:func:`refused_names`). Afterwards the damage would be done;
* the appliers run in one ``exec`` (:func:`apply_script`) between two listings of the work
  tree (``find``: type, mode, inode, size, status-change time of every entry outside
  ``.git``), so every path any applier created, deleted, rewrote, renamed, copied, re-moded or
  turned into a symlink or directory is listed, tracked, untracked and ignored alike; plus
  ``git status`` of the tracked files against ``base_commit`` (content, not times);
* GNU ``patch``, the last fallback, runs only after a check in the sandbox that no name it
  could use passes through a symlink, with ``.git`` renamed away while it runs (a ``.git`` it
  creates refuses the patch) and with ``PATH`` empty, so it cannot run ``ed`` or an RCS tool;
* a symlink the patch leaves that points outside the repository or into ``.git`` refuses it
  (in the agent's own sandbox symlinks are only judged by the revert rules);
* a changed path of an environment refuses it (:func:`environment_reason`: under a directory
  holding ``pyvenv.cfg``, a ``site-packages``/``dist-packages`` component, or ignored by the
  ``.gitignore`` files of ``base_commit``): untracked, nothing could restore it.

For the agent's own sandbox (no patch to apply) the changes are ``git status`` of the work
tree against ``base_commit`` with the evaluator's own index (:func:`working_changes_script`);
the environment's paths are left out there (:func:`parse_working_changes`).
"""

from __future__ import annotations

import posixpath
import re
import secrets
import shlex
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from sandlot.rewards.scripts import MODEL_PATCH_PATH

_NAME_LINE = re.compile(
    r"^(?:diff |--- |\+\+\+ |\*\*\* |Index: |(?:rename|copy) (?:from|to|old|new) )(.*)$"
)
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}

APPLIED = "=== sandlot applied "
_ATTEMPT = "=== sandlot attempt "
LISTING_START = "=== sandlot changed"
_TRACKED = "=== sandlot tracked"
_SYMLINKS = "=== sandlot symlinks"
_VENVS = "=== sandlot pyvenv"
_IGNORED = "=== sandlot ignored"
_VIOLATION = "=== sandlot violation "
_END = "=== sandlot end"
LISTING = "listing"  # the file, in the evaluator's git directory, holding the listing
_LIST_FAILED = "sandlot: listing the work tree failed (needs GNU find, sort -z, comm -z)"


def _unquote(text: str, start: int) -> tuple[str, int]:
    """The C-quoted string of ``text`` opening at ``start`` (git's quoting), and the index
    after its closing quote (or the end)."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            octal = re.match(r"[0-7]{1,3}", text[i + 1 :])
            if octal:
                out.append(chr(int(octal.group(), 8)))
                i += 1 + len(octal.group())
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out), i


def _as_name(text: str) -> str:
    text = text.strip()
    return _unquote(text, 0)[0] if text.startswith('"') else text


def patch_names(patch: str) -> list[str]:
    """Every name an applier could read from ``patch``'s header lines (a superset).

    Each word of a header line (C-quoted words unquoted; octal escapes decoded as bytes read
    as Latin-1, enough for the component checks), the rest of the line up to a tab, and the
    whole rest of the line: GNU ``patch`` takes names with spaces up to a tab or the end.
    """
    names: dict[str, None] = {}
    for line in patch.replace("\r\n", "\n").split("\n"):
        m = _NAME_LINE.match(line)
        if not m:
            continue
        rest = m.group(1)
        names.setdefault(_as_name(rest))
        names.setdefault(_as_name(rest.split("\t", 1)[0]))
        i = 0
        while i < len(rest):
            if rest[i].isspace():
                i += 1
            elif rest[i] == '"':
                word, i = _unquote(rest, i)
                names.setdefault(word)
            else:
                j = i
                while j < len(rest) and not rest[j].isspace():
                    j += 1
                names.setdefault(rest[i:j])
                i = j
    return [n for n in names if n and n != "/dev/null"]


def refused_names(patch: str) -> list[str]:
    """Why ``patch`` must not reach an applier: a name with a ``.git`` or ``..`` component."""
    into_git: list[str] = []
    outside: list[str] = []
    for name in patch_names(patch):
        parts = name.split("/")
        if any(p.lower() == ".git" for p in parts):
            into_git.append(repr(name))
        if ".." in parts:
            outside.append(repr(name))
    reasons = []
    if into_git:
        reasons.append(f"the patch writes into .git/ ({', '.join(into_git[:3])})")
    if outside:
        reasons.append(f"the patch names a path outside the repository ({', '.join(outside[:3])})")
    return reasons


def gnu_patch_paths(patch: str) -> list[str]:
    """The leading paths (``a``, ``a/b``, ``a/b/c``) of each of :func:`patch_names` after
    ``-p1``: none may be a symlink when GNU ``patch`` runs."""
    out: dict[str, None] = {}
    for name in patch_names(patch):
        if "/" not in name:
            continue
        parts = [p for p in name.split("/", 1)[1].split("/") if p and p != "."]
        for k in range(1, len(parts) + 1):
            out.setdefault("/".join(parts[:k]))
    return list(out)


# Type, mode, inode, size and status-change time of every entry but the directories' times
# (which change with their entries), outside .git.
_SNAPSHOT = (
    "find . -path ./.git -prune -o -type d -printf 'd %p\\0' "
    "-o -printf '%y %m %i %s %C@ %p\\0' | LC_ALL=C sort -z"
)
_SYMLINK_LIST = "find . -path ./.git -prune -o -type l -printf '%p\\0%l\\0'"


# Two parts of the listing (section headers echoed before each), from the changed entries
# (``$S/changed``), with shell builtins for each path: the directories holding a ``pyvenv.cfg``
# among the changed paths and their leading directories (their paths go to ``$S/paths``); then
# the changed paths that the ``.gitignore`` files of ``base_commit`` ignore, followed by a
# ``_TRACKED_AT_BASE`` part naming those of them tracked at ``base_commit`` (never ignored).
# The ``.gitignore`` files are written from the evaluator's index (``base_commit``) into a
# directory of their own, where ``git check-ignore --no-index`` reads them (no symlink or
# submodule of the work tree in the way): a ``.gitignore`` of the patch counts for nothing.
_VENVS_SCRIPT = r"""while IFS= read -r -d '' _r; do
  _r=${_r#$'\t'}
  case $_r in "d "*) _p=${_r#d } ;; *) _p=${_r#* * * * * } ;; esac
  _p=${_p#./}
  printf '%s\0' "$_p" >&4
  _d=$_p
  while :; do
    [ -f "$_d/pyvenv.cfg" ] && printf '%s\0' "$_d"
    [ "$_d" = "${_d%/*}" ] && break
    _d=${_d%/*}
  done
done < "$S/changed" 4> "$S/paths" || exit 96"""
_TRACKED_AT_BASE = "=== sandlot ignored but tracked"
_IGNORED_SCRIPT = rf"""git ls-files -z -- ':(glob)**/.gitignore' > "$S/rules.list" || exit 96
_ign=()
if [ -s "$S/rules.list" ]; then
  git checkout-index -z --stdin --prefix="$S/rules/" < "$S/rules.list" || exit 96
  GIT_WORK_TREE="$S/rules" git -C "$S/rules" check-ignore --no-index -z --stdin \
    < "$S/paths" > "$S/ignored"
  [ $? -le 1 ] || exit 96
  mapfile -d '' -t _ign < "$S/ignored"
fi
[ ${{#_ign[@]}} = 0 ] || printf '%s\0' "${{_ign[@]}}"
echo; echo '{_TRACKED_AT_BASE}'
[ ${{#_ign[@]}} = 0 ] || git --literal-pathspecs ls-files -z -- "${{_ign[@]}}" || exit 96"""


def apply_script(
    patch: str,
    commands: tuple[str, ...],
    *,
    list_changes: bool,
    patch_path: str = MODEL_PATCH_PATH,
    names_path: str | None = None,
) -> str:
    """The shell (run in the work tree, under :class:`~sandlot.tools.trusted_git.TrustedGit`)
    that applies the patch written at ``patch_path`` with ``commands`` in order (the last one,
    GNU ``patch``, guarded as the module says) and, with ``list_changes``, lists what changed.

    ``names_path``: a file in the sandbox holding :func:`gnu_patch_paths` (NUL-separated),
    for patches whose list would not fit in a command line; ``None`` puts the list inline.
    Its output is read by :func:`parse_apply_output`; the listing is also kept in the file
    :data:`LISTING` of the evaluator's git directory (for output over the backend's cap).
    """
    aside = f".sandlot-git-aside-{secrets.token_hex(8)}"
    if names_path is None:
        names = " ".join(shlex.quote(p) for p in gnu_patch_paths(patch))
        each_name = f"for _p in {names}; do"
    else:
        each_name = "while IFS= read -r -d '' _p; do"
    done = "done" if names_path is None else f"done < {shlex.quote(names_path)}"
    p = shlex.quote(patch_path)
    lines = ['S="$SANDLOT_GIT_DIR"', "set -o pipefail"]
    if list_changes:
        lines.append(f'{_SNAPSHOT} > "$S/before" || {{ echo "{_LIST_FAILED}" >&2; exit 96; }}')
    lines.append("applied=")
    for i, cmd in enumerate(commands, 1):
        if cmd.startswith("patch "):
            lines.append(
                "_gnu_patch() {\n"
                f'  {each_name} if [ -L "$_p" ]; then\n'
                f"    echo '{_VIOLATION}the patch writes through the symlink '\"$_p\"; return 1\n"
                f"  fi; {done}\n"
                '  _bin=$(command -v patch) || { echo "patch: not found"; return 1; }\n'
                f"  mv .git {aside} || return 1\n"
                f'  PATH=/nonexistent "$_bin" {cmd[len("patch ") :]} {p}; _rc=$?\n'
                "  if [ -e .git ] || [ -L .git ]; then\n"
                f"    echo '{_VIOLATION}the patch writes into .git/'; rm -rf ./.git; _rc=1\n"
                "  fi\n"
                f"  mv {aside} .git && return $_rc\n"
                "}"
            )
            run = "_gnu_patch"
        else:
            run = f"{cmd} {p}"
        lines.append(
            f"if [ -z \"$applied\" ]; then echo '{_ATTEMPT}{i}'; "
            f"{{ {run}; }} 2>&1 | tail -c 4000; "
            f"[ ${{PIPESTATUS[0]}} != 0 ] || applied={i}; fi"
        )
    lines.append(f"echo '{APPLIED}'\"${{applied:-0}}\"")
    if list_changes:
        lines += [
            f'{_SNAPSHOT} > "$S/after" || {{ echo "{_LIST_FAILED}" >&2; exit 96; }}',
            'LC_ALL=C comm -3 -z "$S/before" "$S/after" > "$S/changed" || exit 96',
            "{",
            f"echo '{LISTING_START}'",
            'cat "$S/changed"',
            f"echo; echo '{_TRACKED}'",
            "git status --porcelain=v2 -z --untracked-files=no || exit 96",
            f"echo; echo '{_SYMLINKS}'",
            f"{_SYMLINK_LIST} || exit 96",
            f"echo; echo '{_VENVS}'",
            _VENVS_SCRIPT,
            f"echo; echo '{_IGNORED}'",
            _IGNORED_SCRIPT,
            f"echo; echo '{_END}'",
            f'}} > "$S/{LISTING}" || exit 96',
            f'cat "$S/{LISTING}"',
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Changes:
    """The model's changes: repository-relative paths, and what refuses them.

    Attributes:
        paths: every path created, deleted or modified (in listing order, no repeats).
        dir_like: those that are (or stand for) a directory: symlinks and new directories;
            the revert rules judge them as directories too.
        violations: reasons the patch is refused (unresolved before the tests run).
        applied: 1-based index of the applier that worked (0: none).
        attempts: each applier's output tail, for the error message.
    """

    paths: list[str] = field(default_factory=list)
    dir_like: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    applied: int = 0
    attempts: list[str] = field(default_factory=list)


def _section(output: str, start: str, end: str) -> str:
    return output.partition(start + "\n")[2].partition("\n" + end)[0]


def _rel(path: str) -> str:
    return path[2:] if path.startswith("./") else path


def parse_apply_output(output: str, workdir: str) -> Changes:
    """The :class:`Changes` of an :func:`apply_script` run's output."""
    out = Changes()
    head = output.partition("\n" + LISTING_START)[0] if LISTING_START in output else output
    m = re.search(rf"^{re.escape(APPLIED)}(\d+)$", head, re.MULTILINE)
    out.applied = int(m.group(1)) if m else 0
    for chunk in re.split(rf"^{re.escape(_ATTEMPT)}\d+\n", head, flags=re.MULTILINE)[1:]:
        out.attempts.append(chunk.partition("\n" + APPLIED)[0])
    out.violations += list(
        dict.fromkeys(
            line[len(_VIOLATION) :] for line in head.splitlines() if line.startswith(_VIOLATION)
        )
    )
    if LISTING_START not in output:
        return out
    paths: dict[str, None] = {}
    for record in _section(output, LISTING_START, _TRACKED).split("\0"):
        record = record.lstrip("\t\n")
        if not record:
            continue
        kind, _, rest = record.partition(" ")
        path = _rel(rest if kind == "d" else rest.split(" ", 4)[-1])
        if path in ("", "."):
            continue
        paths.setdefault(path)
        if kind == "d":
            out.dir_like.add(path)
    for path in _status_paths(_section(output, _TRACKED, _SYMLINKS)):
        paths.setdefault(path)
    _check_symlinks(_section(output, _SYMLINKS, _VENVS), paths, workdir, out)
    out.paths = list(paths)
    # A pyvenv.cfg the patch deleted still marks its directory.
    venvs = _section(output, _VENVS, _IGNORED).lstrip("\n").split("\0") + [
        posixpath.dirname(p) for p in out.paths if posixpath.basename(p) == "pyvenv.cfg"
    ]
    tracked = set(_section(output, _TRACKED_AT_BASE, _END).lstrip("\n").split("\0"))
    ignored = set(_section(output, _IGNORED, _TRACKED_AT_BASE).lstrip("\n").split("\0"))
    ignored -= tracked
    found = [(p, why) for p in out.paths if (why := environment_reason(p, venvs, ignored))]
    if found:
        listed = ", ".join(f"{p} ({why})" for p, why in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        out.violations.append(f"{_ENVIRONMENT}: {listed}{more}")
    return out


_ENVIRONMENT = (
    "the patch changes an environment (a virtualenv, site-packages or a path the .gitignore "
    "files of base_commit ignore), not the repository's code; untracked, nothing could restore "
    "it"
)
_SITE_DIRS = ("site-packages", "dist-packages")


def environment_reason(path: str, venvs: Iterable[str], ignored: Container[str] = ()) -> str | None:
    """Why ``path`` (repository-relative) belongs to an environment, not to the repository's
    code, or ``None``: a ``site-packages``/``dist-packages`` component, a virtual environment
    (under one of ``venvs``, the directories holding a ``pyvenv.cfg``; the root is the
    repository, never one), or one of ``ignored`` (by the ``.gitignore`` files of
    ``base_commit``)."""
    parts = path.split("/")
    site = next((p for p in parts if p in _SITE_DIRS), None)
    if site is not None:
        return site
    for venv in venvs:
        if venv not in ("", ".") and (path == venv or path.startswith(venv + "/")):
            return f"virtual environment {venv}"
    if path in ignored:
        return "ignored by .gitignore at base_commit"
    return None


def _status_paths(status: str) -> list[str]:
    """Paths of ``git status --porcelain=v2 -z`` records (both names of a rename)."""
    out: list[str] = []
    fields = status.lstrip("\n").split("\0")
    i = 0
    while i < len(fields):
        rec = fields[i]
        i += 1
        if not rec:
            continue
        kind = rec[0]
        if kind == "1":
            out.append(rec.split(" ", 8)[-1])
        elif kind == "2":
            out.append(rec.split(" ", 9)[-1])
            if i < len(fields):
                out.append(fields[i])  # the original path
                i += 1
        elif kind == "u":
            out.append(rec.split(" ", 10)[-1])
        elif kind in "?!":
            out.append(rec[2:])
    return [p.rstrip("/") for p in out if p]


def _check_symlinks(listing: str, paths: dict[str, None], workdir: str, out: Changes) -> None:
    fields = listing.lstrip("\n").split("\0")
    for path, target in zip(fields[0::2], fields[1::2], strict=False):
        path = _rel(path)
        if path not in paths:
            continue
        out.dir_like.add(path)
        if target.startswith("/"):
            inside = posixpath.normpath(target)
            root = posixpath.normpath(workdir)
            resolved = (
                posixpath.relpath(inside, root)
                if inside == root or inside.startswith(root + "/")
                else ".."
            )
        else:
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        parts = resolved.split("/")
        if parts[0] == "..":
            out.violations.append(
                f"the patch leaves a symlink {path} -> {target} pointing outside the repository"
            )
        elif resolved == "." or ".git" in (p.lower() for p in parts):
            out.violations.append(
                f"the patch leaves a symlink {path} -> {target} pointing into the repository's "
                "root or .git/"
            )


def working_changes_script() -> str:
    """The shell (under :class:`~sandlot.tools.trusted_git.TrustedGit`, whose index is
    ``base_commit``) listing every path of the work tree that differs from ``base_commit``:
    tracked, untracked and ignored, and the symlinks; also kept in the file :data:`LISTING` of
    the evaluator's git directory. Read by :func:`parse_working_changes`."""
    return (
        "set -o pipefail\n{\n"
        f"echo '{_TRACKED}'\n"
        "git status --porcelain=v2 -z --untracked-files=all --ignored || exit 96\n"
        f"echo; echo '{_SYMLINKS}'\n"
        f"{_SYMLINK_LIST} || exit 96\n"
        f"echo; echo '{_END}'\n"
        f'}} > "$SANDLOT_GIT_DIR/{LISTING}" || exit 96\n'
        f'cat "$SANDLOT_GIT_DIR/{LISTING}"\n'
    )


def parse_working_changes(output: str) -> Changes:
    """The :class:`Changes` of a :func:`working_changes_script` run's output.

    The agent had a shell: it may have installed packages (``pip install``), and an
    environment inside the repository (R2E-Gym's ``.venv``) shows in ``git status`` whole,
    changed or not, with no content of ``base_commit`` to compare or restore. So environment
    paths (:func:`environment_reason` without the ``.gitignore`` rule, the virtual environments
    being those whose ``pyvenv.cfg`` the listing shows) are left out, neither refused nor
    reverted: the environment of the agent's sandbox is the agent's (``evaluate`` grades in a
    fresh one). Other ignored paths stay, for the revert rules (caches, ``conftest.py``).
    Symlinks are not refused here (a virtual environment's ``bin/python`` points outside);
    they are judged by the revert rules as the directories they stand for.
    """
    out = Changes()
    status = _section(output, _TRACKED, _SYMLINKS)
    listed = _status_paths(status)
    venvs = [posixpath.dirname(p) for p in listed if posixpath.basename(p) == "pyvenv.cfg"]
    paths = dict.fromkeys(p for p in listed if environment_reason(p, venvs) is None)
    for rec in status.lstrip("\n").split("\0"):
        if rec[:1] in ("?", "!") and rec.endswith("/"):
            out.dir_like.add(rec[2:].rstrip("/"))
    out.dir_like |= {p for p in _symlinks(_section(output, _SYMLINKS, _END)) if p in paths}
    out.paths = list(paths)
    return out


def _symlinks(listing: str) -> list[str]:
    fields = listing.lstrip("\n").split("\0")
    return [_rel(p) for p in fields[0::2] if p]
