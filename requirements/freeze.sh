#!/usr/bin/env bash
# Writes a lock: the exact versions installed in an environment that has just passed the suite.
#   requirements/freeze.sh PYTHON OUT [EXTRA_PINS_FILE ...]
# `pip freeze` of the tested environment rather than pip-compile: the lock is then exactly what
# ran, including torch's local CPU build, which a resolver working from the index alone would not
# pick. Local labels are dropped (`torch==2.13.0` matches `2.13.0+cpu` and never names an index);
# setuptools and wheel are left to the venv (they are build tools, not what the suite runs on).
set -euo pipefail
python=$1 out=$2
shift 2
pins=$("$python" -m pip freeze --all --exclude-editable)
if [ "$#" -gt 0 ]; then pins=$(printf '%s\n' "$pins"; cat "$@"); fi
if grep -vE '^[A-Za-z0-9._-]+==[^ ]+$' <<<"$pins"; then
	echo "freeze.sh: the lines above are not plain name==version pins; refusing to write $out" >&2
	exit 1
fi
version=$("$python" -c 'import platform; print(platform.python_version())')
{
	echo "# Exact pins, written by \`make lock\` on $(date -u +%F) from an environment that had just"
	echo "# passed \`make test\` and \`make test-vllm\` (Python $version, CPU). Do not edit: run \`make lock\`."
	grep -vE '^(setuptools|wheel)==' <<<"$pins" | sed -E 's/\+[A-Za-z0-9.]+$//' | LC_ALL=C sort -f
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out ($(grep -vc '^#' "$out") pins)"
