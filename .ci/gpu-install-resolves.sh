#!/usr/bin/env bash
# Proves that the GPU-node install of docs/training.md resolves, without a GPU: the documented
# command, verbatim, with pip's --dry-run --report in a fresh virtualenv, then a check that the
# report pins what constraints/gpu.txt pins (torch, vllm, verl, transformers, ...).
#
# --use-feature=fast-deps reads each wheel's metadata with HTTP range requests. Where the index
# serves PEP 658 metadata (pypi.org) pip needs no wheel bodies anyway; on a mirror that doesn't
# (this machine's), plain pip would download every wheel in full (~3.7 GB: torch, vllm, CUDA
# libraries). It changes how metadata is read, not what is resolved.
#
# Env: PYTHON (default python3; verl 0.9.1 needs 3.10-3.12), PIP_VERSION (default 26.3).
set -euo pipefail
cd "$(dirname "$0")/.."

cmd="pip install -c constraints/gpu.txt -e '.[gpu]'"
grep -qF -- "$cmd" docs/training.md || { echo "docs/training.md no longer has: $cmd" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
"${PYTHON:-python3}" -m venv "$tmp/venv"
# shellcheck disable=SC1091
. "$tmp/venv/bin/activate"
export PIP_CACHE_DIR="$tmp/cache" PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q "pip==${PIP_VERSION:-26.3}"

report="$tmp/report.json"
echo "+ $cmd --dry-run --report ... --use-feature=fast-deps"
# (Without the machine's file:// extra indexes' "Location ... is ignored" lines, one per package.)
{ eval "$cmd --dry-run --quiet --report '$report' --use-feature=fast-deps" 2>&1; } |
  { grep -v "is ignored: it is neither a file nor a directory" || true; }

python - "$report" constraints/gpu.txt "$((SECONDS - start))" <<'EOF'
import json, re, sys

report, constraints, seconds = sys.argv[1], sys.argv[2], sys.argv[3]
must = ("torch", "vllm", "verl", "transformers")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


data = json.load(open(report))
got = {norm(i["metadata"]["name"]): i["metadata"] for i in data["install"]}
pins = {}
for line in open(constraints):
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line.split("#", 1)[0].strip())
    if m:
        pins[norm(m.group(1))] = m.group(2)

bad = [f"{name}: not pinned in {constraints}" for name in must if name not in pins]
# The pins are verl's own: where verl's GPU extras (vllm, fsdp and the sub-extras they pull in)
# declare `name==version` and the constraints file pins the same name, they must agree.
verl_extras = {"vllm", "fsdp", "verl-core", "flash-attn-cu130torch211", "cupy-cu130"}
for req in got.get("verl", {}).get("requires_dist", []):
    m = re.fullmatch(r'([A-Za-z0-9._-]+)\s*==\s*([^;\s]+)\s*;\s*extra\s*==\s*"([^"]+)"', req)
    if m and m.group(3) in verl_extras:
        name, want = norm(m.group(1)), m.group(2)
        if name in pins and pins[name] != want:
            bad.append(f"{constraints} pins {name}=={pins[name]}, verl[{m.group(3)}] {want}")
# Every pin that is part of the install is what was resolved; the four above must be there.
checked = []
for name, want in pins.items():
    have = got.get(name, {}).get("version")
    if have is None:
        if name in must:
            bad.append(f"{name}: not in the install, want {want}")
        continue
    # A local version label (2.11.0+cu130) still satisfies ==2.11.0.
    if have.split("+", 1)[0] != want:
        bad.append(f"{name}: resolved {have}, want {want}")
    checked.append(f"{name}=={have}")
if bad:
    sys.exit("gpu install check failed: " + "; ".join(bad))
print(
    f"gpu install resolves: {len(got)} packages, {' '.join(checked)} "
    f"(pip {data['pip_version']}, python {data['environment']['python_full_version']}, {seconds}s)"
)
EOF
