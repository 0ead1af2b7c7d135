#!/usr/bin/env bash
# Adds a simulated GB200 NVL72-class rack to the cluster that
# hack/cluster/up.sh runs in RUN_DIR: nodes of demo/machines/gb200-nvl72-tray.yaml
# (4 GPUs each, plugin in exclusive mode) that share the machine file's
# fabric cluster UUID, grouped into NVLink cliques, each node added with
# hack/cluster/add-node.sh on the fake CRI.
#
# Usage:
#   hack/cluster/add-rack.sh FIRST_INDEX SIZE [SIZE...]
#   e.g. hack/cluster/add-rack.sh 4 4 2   # hack/multinode.sh's rack
# One SIZE per clique: the first clique is gb200-a1..gb200-a<SIZE> with the
# machine file's clique ID (32766), the second gb200-b1.. with the next ID,
# and so on. The nodes take add-node.sh's INDEX FIRST_INDEX onwards (ports;
# INDEX ends at 9). With 4 2, a 4-node ComputeDomain fits clique a only and
# a 5-node one fits no clique, though the rack has 6 nodes.
#
# It writes RUN_DIR/rack.txt, one line per node, "NAME CLIQUE" with CLIQUE
# as the GPUs publish it (<fabricClusterUUID>.<fabricCliqueID>), for tests.
# Each clique's machine file is RUN_DIR/machines/gb200-nvl72-tray-<ID>.yaml.
# Extra plugin flags: FACET_RACK_PLUGIN_FLAGS (words).
#
# The fake CRI of each node runs Facet's simulator image's containers as
# host processes (add-node.sh), so a DaemonSet of facet-imex --simulate
# really runs on the rack. Environment: RUN_DIR (as up.sh). Needs root, a
# running up.sh cluster and `make build`.
set -Eeuo pipefail
CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${CLUSTER_DIR}/../.." && pwd)"
MACHINE="${REPO}/demo/machines/gb200-nvl72-tray.yaml"
RUN_DIR="${RUN_DIR:-${FACET_RUN_DIR:-/tmp/facet-run}}"

if [[ $# -lt 2 ]]; then
  echo "usage: $0 FIRST_INDEX SIZE [SIZE...]" >&2
  exit 2
fi
first="$1"; shift
[[ "${first}" =~ ^[1-9]$ ]] || { echo "FIRST_INDEX must be 1-9: ${first}" >&2; exit 2; }
total=0
for size in "$@"; do
  [[ "${size}" =~ ^[1-9][0-9]*$ ]] || { echo "SIZE must be a positive number: ${size}" >&2; exit 2; }
  total=$((total + size))
done
((first + total - 1 <= 9)) || { echo "${total} nodes from INDEX ${first} pass add-node.sh's last INDEX, 9" >&2; exit 2; }
(($# <= 26)) || { echo "at most 26 cliques (a-z)" >&2; exit 2; }

# The machine file's fabric: one cluster UUID, the first clique's ID.
uuid="$(sed -n 's/^  clusterUUID: *"\([^"]*\)"$/\1/p' "${MACHINE}")"
clique0="$(sed -n 's/^  cliqueID: *\([0-9][0-9]*\)$/\1/p' "${MACHINE}")"
[[ -n "${uuid}" && -n "${clique0}" ]] ||
  { echo "no fabric clusterUUID and cliqueID lines in ${MACHINE}" >&2; exit 1; }

T0=${SECONDS}
mkdir -p "${RUN_DIR}/machines"
: >"${RUN_DIR}/rack.txt.tmp"
read -r -a plugin_flags <<<"${FACET_RACK_PLUGIN_FLAGS:-}"
index="${first}"
letters=abcdefghijklmnopqrstuvwxyz
c=0
for size in "$@"; do
  id=$((clique0 + c))
  letter="${letters:c:1}"
  machine="${RUN_DIR}/machines/gb200-nvl72-tray-${id}.yaml"
  sed "s/^  cliqueID: *${clique0}\$/  cliqueID: ${id}/" "${MACHINE}" >"${machine}"
  grep -q "^  cliqueID: ${id}\$" "${machine}" || { echo "could not set clique ID ${id} in ${machine}" >&2; exit 1; }
  for n in $(seq 1 "${size}"); do
    name="gb200-${letter}${n}"
    "${CLUSTER_DIR}/add-node.sh" "${name}" "${index}" "${machine}" --mode exclusive "${plugin_flags[@]}"
    echo "${name} ${uuid}.${id}" >>"${RUN_DIR}/rack.txt.tmp"
    index=$((index + 1))
  done
  c=$((c + 1))
done
mv "${RUN_DIR}/rack.txt.tmp" "${RUN_DIR}/rack.txt"
echo "[add-rack] ${total} nodes in $# cliques of fabric cluster ${uuid} added in $((SECONDS - T0))s"
