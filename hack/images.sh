#!/usr/bin/env bash
# Builds the two container images the local node needs, without any registry,
# as OCI image archives, and optionally loads them into containerd:
#   facet.local/busybox:1        busybox-static with its applets symlinked in /bin
#   registry.k8s.io/pause:3.10   a tiny static pause binary (hack/images/pause.c)
#
# Archives are cached in ${FACET_CACHE:-$HOME/.cache/facet}/images/<hash>/,
# keyed on this script, pause.c and the busybox binary.
#
# Usage:
#   hack/images.sh                          build (if needed); print the archive dir
#   hack/images.sh --load CTR SOCKET        also import into containerd's k8s.io namespace
#                                           (CTR: path to ctr; SOCKET: containerd's socket)
# Needs: busybox-static, gcc, libc6-dev, tar, coreutils (hack/install-deps.sh).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

BUSYBOX_IMAGE="facet.local/busybox:1"
PAUSE_IMAGE="registry.k8s.io/pause:3.10"
BUSYBOX_BIN="${BUSYBOX_BIN:-/bin/busybox}"

log() { echo "[images] $*" >&2; }

# (ldd exits 1 on a static binary, so look at its output, not its status.)
if [[ "$(ldd "${BUSYBOX_BIN}" 2>&1 || true)" != *"not a dynamic executable"* ]]; then
  log "${BUSYBOX_BIN} is not static: install busybox-static (hack/install-deps.sh)"
  exit 1
fi

ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
KEY="$( { cat "${BASH_SOURCE[0]}" "${HACK_DIR}/images/pause.c"; sha256sum "${BUSYBOX_BIN}"; echo "${ARCH}"; } \
  | sha256sum | cut -c1-12)"
OUT_DIR="${FACET_CACHE:-$HOME/.cache/facet}/images/${KEY}"

# Deterministic tar: same input, same digest, so the cache key means something.
det_tar() { # det_tar OUT.tar DIR
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$2" -cf "$1" .
}

# blob FILE LAYOUT_DIR -> prints "sha256:<hex> <size>" and stores FILE as a blob
blob() {
  local hex size
  hex="$(sha256sum "$1" | cut -d' ' -f1)"
  size="$(stat -c %s "$1")"
  mkdir -p "$2/blobs/sha256"
  cp "$1" "$2/blobs/sha256/${hex}"
  echo "sha256:${hex} ${size}"
}

# build_image NAME ROOTFS_DIR ENTRYPOINT_JSON CMD_JSON OUT_TAR
# Writes a single-platform OCI image layout (one uncompressed layer) as a tar
# that `ctr images import` understands; the name goes into the
# io.containerd.image.name annotation, which ctr uses as the image name.
build_image() {
  local name="$1" rootfs="$2" entrypoint="$3" cmd="$4" out="$5"
  local work layout ldig lsize cdig csize mdig msize
  work="$(mktemp -d)"
  layout="${work}/layout"
  mkdir -p "${layout}"

  det_tar "${work}/layer.tar" "${rootfs}"
  read -r ldig lsize < <(blob "${work}/layer.tar" "${layout}")

  cat >"${work}/config.json" <<EOF
{"architecture":"${ARCH}","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":${entrypoint},"Cmd":${cmd},"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["${ldig}"]},"history":[{"created_by":"facet hack/images.sh"}]}
EOF
  read -r cdig csize < <(blob "${work}/config.json" "${layout}")

  cat >"${work}/manifest.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"${cdig}","size":${csize}},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"${ldig}","size":${lsize}}]}
EOF
  read -r mdig msize < <(blob "${work}/manifest.json" "${layout}")

  cat >"${layout}/index.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"${mdig}","size":${msize},"platform":{"architecture":"${ARCH}","os":"linux"},"annotations":{"io.containerd.image.name":"${name}","org.opencontainers.image.ref.name":"${name##*:}"}}]}
EOF
  echo '{"imageLayoutVersion":"1.0.0"}' >"${layout}/oci-layout"

  det_tar "${out}.tmp" "${layout}"
  mv -f "${out}.tmp" "${out}"
  rm -rf "${work}"
  log "built ${name} -> ${out} (manifest ${mdig})"
}

build_busybox() {
  local root
  root="$(mktemp -d)"
  chmod 755 "${root}"  # mktemp makes it 0700; it becomes the image's /
  mkdir -p "${root}"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,root,var,run}
  install -d -m 1777 "${root}/tmp"
  cp "${BUSYBOX_BIN}" "${root}/bin/busybox"
  # Every applet as a symlink in /bin (sh, env, ls, cat, sleep, mount, grep, ...).
  local applet
  for applet in $("${BUSYBOX_BIN}" --list); do
    [[ "${applet}" == busybox ]] && continue
    ln -sf busybox "${root}/bin/${applet}"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"${root}/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"${root}/etc/group"
  build_image "${BUSYBOX_IMAGE}" "${root}" 'null' '["sh"]' "${OUT_DIR}/busybox.tar"
  rm -rf "${root}"
}

build_pause() {
  local root
  root="$(mktemp -d)"
  chmod 755 "${root}"  # mktemp makes it 0700; it becomes the image's /
  gcc -static -Os -s -o "${root}/pause" "${HACK_DIR}/images/pause.c"
  build_image "${PAUSE_IMAGE}" "${root}" '["/pause"]' 'null' "${OUT_DIR}/pause.tar"
  rm -rf "${root}"
}

mkdir -p "${OUT_DIR}"
[[ -s "${OUT_DIR}/busybox.tar" ]] || build_busybox
[[ -s "${OUT_DIR}/pause.tar" ]] || build_pause

if [[ "${1:-}" == "--load" ]]; then
  CTR="${2:?usage: $0 --load CTR SOCKET}"
  SOCK="${3:?usage: $0 --load CTR SOCKET}"
  for tarball in busybox pause; do
    # k8s.io is the namespace the CRI plugin (and so the kubelet) sees.
    # Quiet on success (ctr also warns about cgroup v1 on every call).
    if ! out="$("${CTR}" --address "${SOCK}" -n k8s.io images import "${OUT_DIR}/${tarball}.tar" 2>&1)"; then
      echo "${out}" >&2
      log "importing ${tarball}.tar failed"
      exit 1
    fi
  done
  log "loaded ${BUSYBOX_IMAGE} and ${PAUSE_IMAGE} into containerd (${SOCK})"
fi

echo "${OUT_DIR}"
