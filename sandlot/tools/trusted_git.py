"""A git that runs nothing of the repository's: every git command of an evaluation and of
``submit`` goes through :class:`TrustedGit`.

The repository's ``.git`` is not the caller's to trust: the model had a shell in the agent's
sandbox, and a hook, ``core.fsmonitor``, ``core.pager``, a ``filter``/``diff`` driver or an
``include.path`` in ``.git/config`` run whatever it planted the moment git is called (and a
clean filter rewrites what ``git add`` stores); ``assume-unchanged``/``skip-worktree`` bits in
its index hide changes. So git never runs on the repository's own git directory. The trusted
git runs with:

* its own git directory (``GIT_DIR``, a fresh directory with a random name under the caller's
  scratch directory): a minimal ``config`` of its own, no hooks directory, ``HEAD`` and an
  index built from ``base_commit`` (``git read-tree``), and the repository's object store as
  an alternate (the only thing read from ``.git``; new objects go to its own store);
* ``GIT_WORK_TREE`` the repository, so ``core.worktree`` cannot move it;
* no system, global or user configuration (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL``
  = a file of its own holding only ``safe.directory=*``, ``HOME``/``XDG_CONFIG_HOME`` = its
  directory), no other ``GIT_*`` variable of the environment, ``GIT_NO_REPLACE_OBJECTS``;
* ``$GIT_DIR/info/attributes`` (which outranks every ``.gitattributes`` and
  ``core.attributesFile``) unsetting ``text``, ``eol``, ``filter``, ``merge``, ``ident``,
  ``working-tree-encoding`` and making ``diff`` unspecified: files are compared, diffed and
  restored byte for byte, no filter or diff driver can be selected, and whether a file is
  binary is decided from its bytes;
* ``-c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.pager=cat`` and the other
  overrides of :data:`GIT_OPTIONS`, and ``--no-pager``, as a second fence.

Scripts use plain ``git``: :meth:`TrustedGit.script` prepends the shell that defines ``git`` as
a function running the guarded command, so a snippet cannot forget the guard. The shell is bash.
"""

from __future__ import annotations

import secrets
import shlex

# Overrides given on the command line of every call (they outrank every configuration file).
GIT_OPTIONS = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "core.editor=:",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.fileMode=true",
    "core.symlinks=true",
    "core.ignoreCase=false",
    "core.quotePath=false",
    "core.sparseCheckout=false",
    "core.splitIndex=false",
    "core.protectNTFS=true",
    "core.protectHFS=true",
    "diff.noprefix=false",
    "status.showUntrackedFiles=all",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "safe.directory=*",
)

# Highest-precedence attributes: raw bytes, no filter, no diff or merge driver (diff left
# unspecified: binary is decided from the content, so a text diff stays a text diff).
_ATTRIBUTES = "* -text !eol -filter !diff -merge -ident !working-tree-encoding -crlf\n"


class TrustedGit:
    """The guarded git of one evaluation or submission (one private git directory in the
    sandbox).

    Args:
        workdir: the repository (work tree) inside the sandbox, an absolute path.
        base_commit: the full hash of the commit the private index and ``HEAD`` start from.
        scratch: the sandbox directory the private git directory is created in.
    """

    def __init__(self, workdir: str, base_commit: str, *, scratch: str) -> None:
        self.workdir = workdir
        self.base_commit = base_commit
        self.scratch = scratch
        self.git_dir = f"{scratch}/git-{secrets.token_hex(8)}"
        self._created = False

    def script(self, body: str) -> str:
        """``body`` (shell) preceded by the guard; the first script also creates the git dir.

        In ``body``, ``git`` is the guarded function; ``$SANDLOT_GIT_DIR`` is the private git
        directory (a place for the caller's own scratch files).
        """
        setup = "" if self._created else self._setup()
        self._created = True
        return self.preamble() + setup + body

    def preamble(self) -> str:
        """Shell exporting the guarded environment and defining ``git``."""
        d, w = shlex.quote(self.git_dir), shlex.quote(self.workdir)
        options = " ".join(f"-c {shlex.quote(o)}" for o in GIT_OPTIONS)
        return (
            'for _v in $(compgen -e); do case "$_v" in GIT_*) unset "$_v";; esac; done\n'
            f"export SANDLOT_GIT_DIR={d} GIT_DIR={d} GIT_WORK_TREE={w} "
            f"GIT_INDEX_FILE={d}/index GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL={d}/global "
            f"HOME={d} XDG_CONFIG_HOME={d} GIT_ATTR_NOSYSTEM=1 GIT_NO_REPLACE_OBJECTS=1 "
            "GIT_OPTIONAL_LOCKS=0 GIT_TERMINAL_PROMPT=0 GIT_PAGER=cat PAGER=cat GIT_EDITOR=: "
            "GIT_CEILING_DIRECTORIES=/\n"
            f'git() {{ command git --no-pager {options} "$@"; }}\n'
        )

    def _setup(self) -> str:
        d = shlex.quote(self.git_dir)
        objects = shlex.quote(f"{self.workdir}/.git/objects")
        steps = [
            "umask 077",
            f"mkdir -p {shlex.quote(self.scratch)}",
            f"mkdir {d} {d}/objects {d}/objects/info {d}/refs {d}/info",
            f"[ -d {objects} ]",
            f"printf '%s\\n' {objects} > {d}/objects/info/alternates",
            f"printf '%s\\n' {shlex.quote(self.base_commit)} > {d}/HEAD",
            f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n' > {d}/config",
            f"printf '[safe]\\n\\tdirectory = *\\n' > {d}/global",
            f"printf %s {shlex.quote(_ATTRIBUTES)} > {d}/info/attributes",
            f"git read-tree {shlex.quote(self.base_commit)}",
        ]
        return (
            "( " + " &&\n  ".join(steps) + " ) || { echo 'sandlot: cannot set up the "
            "trusted git directory (no repository at the work directory?)' >&2; exit 97; }\n"
        )
