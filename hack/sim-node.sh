#!/usr/bin/env bash
# Lays out what a simulated GPU node needs on the host besides the plugin:
# the NVIDIA driver root (libraries, binaries, device nodes) for a machine
# file, and a stand-in for HAMi-core's libvgpu.so. It keeps a copy of the
# machine file as RUN_DIR/machine.yaml, where `facetctl mig-instances` finds
# it (with the plugin's RUN_DIR/facet-state) without flags.
#   hack/sim-node.sh RUN_DIR MACHINE_FILE
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="$1"
MACHINE="$2"
"${REPO}/bin/facetctl" sim-driver-root --machine "${MACHINE}" --root "${RUN_DIR}/driver-root" \
  --hami-library "${RUN_DIR}/hami/libvgpu.so"
mkdir -p "${RUN_DIR}"
cp "${MACHINE}" "${RUN_DIR}/machine.yaml"
