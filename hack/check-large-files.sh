#!/usr/bin/env bash
# Fails when git tracks a file over 1 MiB that is not on the allow-list
# below: build output (an executable, an image tarball) belongs in bin/ or
# _output/, never in git. A clone stays small, and the working tree fits the
# 64 MiB that travels to a GPU machine. make lint runs it.
#
#   hack/check-large-files.sh [LIMIT_BYTES]   (default 1048576)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
limit="${1:-1048576}"
# Paths allowed past the limit, one per line, each with the reason. None
# today; the largest tracked files are golden ResourceSlices of ~0.5 MiB.
allow=(
)
bad=0
while IFS= read -r -d '' f; do
  [[ -f "${f}" ]] || continue
  size=$(stat -c '%s' "${f}")
  (( size > limit )) || continue
  for a in "${allow[@]}"; do [[ "${f}" == "${a}" ]] && continue 2; done
  echo "tracked file over ${limit} bytes: ${f} (${size} bytes); remove it from git and ignore it, or add it to hack/check-large-files.sh's allow-list with a reason" >&2
  bad=1
done < <(git ls-files -z)
exit "${bad}"
