#!/usr/bin/env bash
# Repeated code in the Jinja2 templates.  The `duplicates` tool (the tool library's) reads
# source files by their ending and skips .j2, so this copies each template to a scratch
# folder as C (MLIR's `//` comments and braces read alike), runs it there, and names the
# templates back.  Exits 1 when it reports any pair, so it can gate a change:
#     scripts/template_duplicates.sh [extra duplicates options, e.g. --most 40]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
command -v duplicates >/dev/null || { echo "duplicates: not installed here (the tool library's command)" >&2; exit 2; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$root/templates" && find . -name '*.mlir.j2' -type f) | while read -r f; do
  f="${f#./}"
  cp "$root/templates/$f" "$scratch/$(printf '%s' "${f%.mlir.j2}" | sed 's#/#@#g').c"
done
out="$(duplicates --repo "$scratch" --most 200 "$@" | sed -E 's#([A-Za-z0-9_@]+)\.c:#templates/\1.mlir.j2:#g; s#@#/#g')"
printf '%s\n' "$out"
case "$out" in "no duplicates"*) exit 0 ;; *) exit 1 ;; esac
