#!/usr/bin/env bash
# Builds NVIDIA's nvidia-cdi-hook (the version hack/tools/cdihook pins), which
# the CDI specs' hooks run on the host, as a static executable: it links
# go-nvml's cgo bindings (never used by the hooks Facet's specs name), and a
# node's glibc may be older than the build machine's. The same flags in
# `make build` and hack/image.sh let the two share Go's build cache.
#   hack/build-cdi-hook.sh OUT [GOARCH [CC]]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(realpath -m "$1")"
GO="${GO:-go}"
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
cd "${REPO}/hack/tools/cdihook"
version="$("${GO}" list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)"
# glibc warns that a static executable calling dlopen needs the shared
# libraries of its own version at run time: the hooks never call it.
GOOS=linux GOARCH="${2:-$("${GO}" env GOARCH)}" CGO_ENABLED=1 CC="${3:-gcc}" \
  "${GO}" build -trimpath -tags netgo,osusergo \
  -ldflags "-s -w -linkmode external -extldflags -static -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${version}" \
  -o "${OUT}" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook 2>&1 |
  { grep -v -e "statically linked applications requires at runtime" -e "in function .*dlopen" \
      -e "^# github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook$" >&2 || true; }
if [[ "${2:-$("${GO}" env GOARCH)}" == "$("${GO}" env GOARCH)" ]] && ! "${OUT}" --version >/dev/null; then
  echo "build-cdi-hook: ${OUT} does not run" >&2
  exit 1
fi
