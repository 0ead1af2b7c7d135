#!/usr/bin/env bash
# Installs the Debian packages listed in hack/apt-packages.txt (or in the
# list file given as the only argument) that are missing.
# Runs `apt-get update` only when something is missing, so a warm machine pays nothing.
# Usage: hack/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  SUDO="sudo"
fi

mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^[[:space:]]*$/d' \
  "${1:-${HACK_DIR}/apt-packages.txt}" | awk '{print $1}')

missing=()
for pkg in "${wanted[@]}"; do
  # "install ok installed" is the only state that means the package is usable.
  if [[ "$(dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("${pkg}")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "[install-deps] all ${#wanted[@]} packages present"
  exit 0
fi

echo "[install-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
${SUDO} apt-get update -qq
${SUDO} apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "[install-deps] done"
