#!/usr/bin/env bash
# Builds Facet's OCI image, without Docker and without a registry: the Go
# binaries cross-compiled here, a glibc taken from Debian's .deb packages, and
# hack/tools/image (go-containerregistry) to assemble a multi-platform image
# index into an OCI archive that `ctr -n k8s.io images import` loads.
#
#   hack/image.sh          facet.local/facet:<version>      -> _output/facet-image.tar
#   hack/image.sh --sim    facet.local/facet:<version>-sim  -> _output/facet-image-sim.tar
#
# --sim builds facet-kubeletplugin with -tags facetsim (the simulator and
# --machine, for the demo and the e2e node); never ship that image. It also
# plays HAMi's image for the chart's hami-core DaemonSet (a stand-in
# libvgpu.so at /k8s-vgpu/lib/nvidia/libvgpu.so), carries a static busybox
# for the simulated driver root's MPS stand-in, and Debian 12's dash for it.
#
# Contents (/usr/bin): facet-kubeletplugin, facet-webhook, facetctl,
# facet-preemptor, facet-controller, facet-mps (the MPS daemons' keeper: static, it links no
# NVML and runs the driver's MPS programs chrooted into the driver root),
# facet-imex (a ComputeDomain's IMEX daemon: static, it runs nvidia-imex
# chrooted into the driver root, or its stand-in in the --sim image),
# facet-install (static: the chart's hami-core DaemonSet copies it into an
# emptyDir and runs it in HAMi's image, whatever libc that has, to install
# libvgpu.so without a shell of that image), and NVIDIA's nvidia-cdi-hook (hack/tools/cdihook), which
# the chart's init container copies onto nodes without the NVIDIA Container
# Toolkit (`facetctl install-cdi-hook`), where the CDI specs' hooks run it;
# it is static (hack/build-cdi-hook.sh). The webhook, facet-mps, facet-imex
# and facet-install are static (CGO_ENABLED=0); in the --sim image they are
# linked like the rest, below, which leaves facet-install static all the
# same: it imports no package with cgo (its TestStatic), and the build
# checks it.
# The plugin, facetctl, facet-preemptor and facet-controller (through
# pkg/cluster/occupancy's MIG profile tables) link go-nvml, whose bindings dlopen
# libnvidia-ml.so.1 through cgo: they are linked dynamically against glibc,
# which must then be in the image, since a static glibc binary cannot safely
# dlopen a library that needs the shared libc. The glibc is Debian 12's
# (libc6 on amd64, libc6-arm64-cross on arm64: the same
# source package and version), only its shared objects. arm64 cross-compiles
# with aarch64-linux-gnu-gcc (hack/apt-image-packages.txt, installed here on
# demand so that CI, which builds no arm64 image, does not pay for it).
#
# The image runs as 65532:65532 by default (the webhook, facetctl and
# facet-preemptor need no more); the chart runs the plugin as root and privileged (NVML's MIG calls,
# device nodes, mounts).
#
# Environment:
#   VERSION     image tag (default: the chart's appVersion)
#   IMAGE_REPO  default facet.local/facet (the chart's default image.repository)
#   PLATFORMS   default "linux/amd64 linux/arm64" (--sim: the host's only)
#   OUT_DIR     default _output
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"

SIM=false
[[ "${1:-}" == --sim ]] && SIM=true
GO="${GO:-go}"
# go-nvml's cgo bindings use NVML calls NVIDIA marked deprecated (as in the Makefile).
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
VERSION="${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deployments/helm/facet/Chart.yaml)}"
IMAGE_REPO="${IMAGE_REPO:-facet.local/facet}"
OUT_DIR="${OUT_DIR:-${REPO}/_output}"
CACHE="${FACET_CACHE:-$HOME/.cache/facet}"
HOST_PLATFORM="linux/$("${GO}" env GOARCH)"
if ${SIM}; then
  PLATFORMS="${PLATFORMS:-${HOST_PLATFORM}}"
  TAG="${VERSION}-sim"; ARCHIVE="${OUT_DIR}/facet-image-sim.tar"; TAGS=(-tags facetsim)
else
  PLATFORMS="${PLATFORMS:-linux/amd64 linux/arm64}"
  TAG="${VERSION}"; ARCHIVE="${OUT_DIR}/facet-image.tar"; TAGS=()
fi
NAME="${IMAGE_REPO}:${TAG}"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain 2>/dev/null)" ]]; then REVISION="${REVISION}-dirty"; fi
CREATED="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
SOURCE="${IMAGE_SOURCE:-https://github.com/facet-gpu/facet}"
mkdir -p "${OUT_DIR}"
# One build of an archive at a time (hack/e2e.sh builds the simulator image
# beside its round, make image-sim by hand): they share the work directory.
exec 8>"${ARCHIVE}.lock"
flock 8
T0=${SECONDS}
log() { printf '[image %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

# glibc_root ARCH DIR: Debian's glibc shared objects for ARCH, laid out as on
# a Debian system, from the .deb (downloaded once into the cache).
glibc_root() {
  local arch="$1" dir="$2" pkg triplet src ld
  case "${arch}" in
    amd64) pkg=libc6; triplet=x86_64-linux-gnu; ld=/lib64/ld-linux-x86-64.so.2 ;;
    arm64) pkg=libc6-arm64-cross; triplet=aarch64-linux-gnu; ld=/lib/ld-linux-aarch64.so.1 ;;
    *) echo "no glibc recipe for ${arch}" >&2; return 1 ;;
  esac
  local debs="${CACHE}/image-debs"
  mkdir -p "${debs}"
  if ! compgen -G "${debs}/${pkg}_*.deb" >/dev/null; then
    log "apt-get download ${pkg}"
    (cd "${debs}" && apt-get download "${pkg}" >/dev/null 2>&1)
  fi
  local x; x="$(mktemp -d)"
  dpkg-deb -x "$(ls "${debs}/${pkg}"_*.deb | tail -n1)" "${x}"
  if [[ "${arch}" == amd64 ]]; then src="${x}/lib/${triplet}"; else src="${x}/usr/${triplet}/lib"; fi
  mkdir -p "${dir}/lib/${triplet}" "${dir}$(dirname "${ld}")"
  local f
  for f in ld-linux-*.so.* libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 \
    libnss_files.so.2 libnss_dns.so.2; do
    cp -a "${src}"/${f} "${dir}/lib/${triplet}/"
  done
  [[ -e "${dir}${ld}" ]] || ln -s "/lib/${triplet}/$(basename "${ld}")" "${dir}${ld}"
  rm -rf "${x}"
}

# dash_bin ARCH DIR: Debian's dash at DIR/bin/dash, from the .deb (downloaded
# once into the cache). The simulated driver root's MPS stand-in
# (internal/mps/mpssim.WriteRoot, which the plugin's layout runs in the
# container) copies a dynamically linked shell into the root, to run there
# chrooted with the root's own loader and libc; the image's busybox is
# static and its /bin/sh is busybox.
dash_bin() {
  local arch="$1" dir="$2" debs="${CACHE}/image-debs"
  mkdir -p "${debs}"
  if ! compgen -G "${debs}/dash_*_${arch}.deb" >/dev/null; then
    log "apt-get download dash:${arch}"
    (cd "${debs}" && apt-get download "dash:${arch}" >/dev/null 2>&1)
  fi
  local x; x="$(mktemp -d)"
  dpkg-deb -x "$(ls "${debs}"/dash_*_"${arch}".deb | tail -n1)" "${x}"
  mkdir -p "${dir}/bin"
  cp "${x}/bin/dash" "${dir}/bin/dash"
  rm -rf "${x}"
}

# base_root DIR: /etc/passwd and /etc/group with root and nonroot (65532), /tmp.
base_root() {
  local dir="$1"
  mkdir -p "${dir}/etc" "${dir}/tmp" "${dir}/var/lib/facet"
  chmod 1777 "${dir}/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"${dir}/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"${dir}/etc/group"
  printf 'hosts: files dns\n' >"${dir}/etc/nsswitch.conf"
}

WORK="${OUT_DIR}/image-work"
${SIM} && WORK="${OUT_DIR}/image-work-sim"
if [[ " ${PLATFORMS} " == *" linux/arm64 "* && "${HOST_PLATFORM}" != linux/arm64 ]]; then
  "${REPO}/hack/install-deps.sh" "${REPO}/hack/apt-image-packages.txt"
fi
rm -rf "${WORK}"
mkdir -p "${WORK}"
layers=()
for platform in ${PLATFORMS}; do
  arch="${platform#linux/}"
  case "${arch}" in
    amd64) cc=x86_64-linux-gnu-gcc ;;
    arm64) cc=aarch64-linux-gnu-gcc ;;
    *) echo "unsupported platform ${platform}" >&2; exit 2 ;;
  esac
  [[ "${platform}" == "${HOST_PLATFORM}" ]] && cc=gcc
  command -v "${cc}" >/dev/null || { echo "missing ${cc} for ${platform}: run hack/install-deps.sh" >&2; exit 1; }
  base="${WORK}/${arch}/base"; app="${WORK}/${arch}/app"
  mkdir -p "${base}" "${app}/usr/bin"
  base_root "${base}"
  glibc_root "${arch}" "${base}"
  ldflags="-s -w"
  # -trimpath keeps this machine's paths out of the shipped binaries. The
  # simulator image is for this machine's demo and tests only, and without
  # it its build shares every compiled package with make build's (the same
  # tags and cgo): on a cold cache that is a whole compile of Facet and its
  # dependencies saved.
  # For the same reason its webhook is linked as make build links it (cgo,
  # against the image's glibc) instead of statically, which would compile
  # client-go and the rest without cgo once more. The shipped webhook is
  # static.
  if ${SIM}; then
    log "${platform}: go build (cgo: facet-kubeletplugin, facetctl, facet-preemptor, facet-controller, facet-webhook, facet-mps, facet-imex; facet-install)"
    GOOS=linux GOARCH="${arch}" CGO_ENABLED=1 CC="${cc}" \
      "${GO}" build "${TAGS[@]}" -ldflags "${ldflags}" -o "${app}/usr/bin/" \
      ./cmd/facet-kubeletplugin ./cmd/facetctl ./cmd/facet-preemptor ./cmd/facet-controller ./cmd/facet-webhook ./cmd/facet-mps ./cmd/facet-imex ./cmd/facet-install
  else
    log "${platform}: go build (cgo: facet-kubeletplugin, facetctl, facet-preemptor, facet-controller; static: facet-webhook, facet-mps, facet-imex, facet-install)"
    GOOS=linux GOARCH="${arch}" CGO_ENABLED=1 CC="${cc}" \
      "${GO}" build -trimpath -ldflags "${ldflags}" -o "${app}/usr/bin/" ./cmd/facet-kubeletplugin ./cmd/facetctl ./cmd/facet-preemptor ./cmd/facet-controller
    GOOS=linux GOARCH="${arch}" CGO_ENABLED=0 \
      "${GO}" build -trimpath -ldflags "${ldflags}" -o "${app}/usr/bin/" ./cmd/facet-webhook ./cmd/facet-mps ./cmd/facet-imex ./cmd/facet-install
  fi
  # The hami-core DaemonSet runs facet-install in HAMi's image: a dynamic
  # one would fail there with "no such file or directory" (its loader).
  # (readelf, of gcc's binutils, reads any architecture's headers.)
  if readelf -l "${app}/usr/bin/facet-install" | grep -q "program interpreter"; then
    echo "image: ${app}/usr/bin/facet-install is dynamically linked; it must run in images without Facet's glibc" >&2
    exit 1
  fi
  log "${platform}: go build nvidia-cdi-hook (static, hack/build-cdi-hook.sh)"
  GO="${GO}" "${REPO}/hack/build-cdi-hook.sh" "${app}/usr/bin/nvidia-cdi-hook" "${arch}" "${cc}"
  if ${SIM}; then
    # The demo's machine files, for --machine=/usr/share/facet/machines/<name>.yaml.
    mkdir -p "${app}/usr/share/facet/machines"
    cp demo/machines/*.yaml "${app}/usr/share/facet/machines/"
    # The image also stands in for HAMi's, whose libvgpu.so the chart's
    # hami-core DaemonSet installs on the node with facet-install: the
    # demo's stand-in libvgpu.so at HAMi's path.
    sim_root="$(mktemp -d)"
    "${app}/usr/bin/facetctl" sim-driver-root --machine demo/machines/dgx-h100.yaml --root "${sim_root}" \
      --hami-library "${app}/k8s-vgpu/lib/nvidia/libvgpu.so" >/dev/null
    rm -rf "${sim_root}"
    # A static busybox (hack/images.sh checks that /bin/busybox is static)
    # for the simulated driver root's nvidia-cuda-mps-control stand-in
    # (internal/mps/mpssim), which the plugin runs.
    mkdir -p "${app}/bin"
    cp "${BUSYBOX_BIN:-/bin/busybox}" "${app}/bin/busybox"
    for applet in sh cp chmod mv cmp cat date id kill mkdir mkfifo rm setsid sleep; do ln -sf busybox "${app}/bin/${applet}"; done
    dash_bin "${arch}" "${app}"
  fi
  layers+=(--layer "${platform}=${base}" --layer "${platform}=${app}")
done

TOOL="${CACHE}/bin/facet-image-tool"
log "building hack/tools/image"
(cd hack/tools/image && "${GO}" build -o "${TOOL}" .)
mkdir -p "${OUT_DIR}"
variant="shipped"; ${SIM} && variant="simulator (-tags facetsim): demo and e2e only"
args=(--name "${NAME}" --created "${CREATED}" "${layers[@]}"
  --label "org.opencontainers.image.title=facet"
  --label "org.opencontainers.image.version=${TAG}"
  --label "org.opencontainers.image.revision=${REVISION}"
  --label "org.opencontainers.image.source=${SOURCE}"
  --label "dev.facet.image.variant=${variant}"
  --cmd facetctl)
# The archive is reproducible: the same layers (every file's path, mode,
# link target and content) and arguments give the same bytes. So an archive
# whose key matches is kept instead of compressed again (hack/e2e.sh asks
# for it once per round; a warm call takes 19 s instead of 35 s).
key="$({
  printf '%s\n' "${args[@]}"
  sha256sum "${TOOL}" | cut -d' ' -f1
  (cd "${WORK}" && find . -printf '%P %m %l\n' | LC_ALL=C sort &&
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
} | sha256sum | cut -c1-16)"
if [[ -f "${ARCHIVE}" && "$(cat "${ARCHIVE}.key" 2>/dev/null)" == "${key}" ]]; then
  rm -rf "${WORK}"
  log "${NAME} -> ${ARCHIVE}: unchanged (key ${key}), kept"
  echo "${ARCHIVE}"
  exit 0
fi
rm -f "${ARCHIVE}.key"
# Written aside and renamed: a round reading the archive never sees half of it.
"${TOOL}" --out "${ARCHIVE}.tmp" "${args[@]}" >&2
mv -f "${ARCHIVE}.tmp" "${ARCHIVE}"
echo "${key}" >"${ARCHIVE}.key"
for platform in ${PLATFORMS}; do
  arch="${platform#linux/}"
  log "${platform}: $(du -sb "${WORK}/${arch}" | cut -f1) bytes unpacked ($(du -sb "${WORK}/${arch}/app" | cut -f1) binaries)"
done
rm -rf "${WORK}"
log "${NAME} -> ${ARCHIVE} ($(stat -c %s "${ARCHIVE}") bytes)"
echo "${ARCHIVE}"
