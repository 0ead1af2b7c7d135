#!/bin/bash
# Device check for issue 29: the node check from Facet's image root with the
# host's driver at /driver-root, and MPS measured with PyTorch.
set -u
O=${OUT:-/tmp/out}
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
D=$(cd "$(dirname "$0")" && pwd)
T0=$SECONDS
t() { echo; echo "=== [$((SECONDS - T0))s] $*"; }
PHASES="${PHASES:-recon hami nc20 ctx nc50}"
has() { [[ " $PHASES " == *" $1 "* ]]; }

t recon
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,mig.mode.current,compute_mode --format=csv
ls /usr/local/nvidia /usr/local/nvidia/bin 2>&1 | tr '\n' ' '; echo
ldconfig -p | grep -E "libcuda.so|libnvidia-ml.so" ; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
head -2 /etc/os-release; ldd --version | head -1; uname -r
command -v gcc cmake nvcc python3
ls /usr/local/cuda/include/cuda.h /usr/local/cuda/include/nvml.h /usr/local/cuda/lib64/stubs/ 2>&1 | tr '\n' ' '; echo
findmnt -no TARGET,FSTYPE,OPTIONS / /usr/local/nvidia /dev/shm /tmp 2>&1
ps -eo pid,comm | grep -i mps || true

# The host as a driver-in-/ node: NVML and libcuda in the loader cache, MPS's
# programs in /usr/local/bin, where Facet looks for them under a root.
ldconfig -p | grep -q libnvidia-ml.so.1 || { echo /usr/local/nvidia/lib64 >/etc/ld.so.conf.d/000-nvidia.conf; ldconfig; echo "added /usr/local/nvidia/lib64 to the loader cache"; }
for p in nvidia-cuda-mps-control nvidia-cuda-mps-server nvidia-smi; do
  [[ -e /usr/local/bin/$p ]] || ln -s /usr/local/nvidia/bin/$p /usr/local/bin/$p
done

HAMI=/tmp/hc/libvgpu.so
if has hami; then
  t "HAMi-core 5091a2fb build (as its build.sh: Debug, the four hooks on)"
  mkdir -p /tmp/hc && tar -xzf "$D/hami-core.tar.gz" -C /tmp/hc && cd /tmp/hc && mkdir -p build/config
  printf '#define MULTIPROCESS_LIMIT_ENABLE\n#define DLSYM_HOOK_ENABLE\n#define HOOK_MEMINFO_ENABLE\n#define HOOK_NVML_ENABLE\nextern size_t GIT_HASH_5091a2fb;\nextern size_t GIT_BRANCH_main;\n' >build/config/static_config.h
  # Keep glibc 2.38's C23 strtol redirects out: the library must load under
  # the image's Debian 12 glibc (2.36), as HAMi's own build (Ubuntu 20.04) does.
  printf '#include <features.h>\n#undef __GLIBC_USE_C2X_STRTOL\n#define __GLIBC_USE_C2X_STRTOL 0\n#undef __GLIBC_USE_C23_STRTOL\n#define __GLIBC_USE_C23_STRTOL 0\n' >prelude.h
  S="src/libvgpu.c src/utils.c src/log_utils.c src/nvml/nvml_entry.c src/nvml/hook.c src/cuda/context.c src/cuda/device.c src/cuda/hook.c src/cuda/event.c src/cuda/memory.c src/cuda/stream.c src/cuda/graph.c src/allocator/allocator.c src/multiprocess/multiprocess_memory_limit.c src/multiprocess/multiprocess_utilization_watcher.c"
  gcc -shared -fPIC -g -D_GNU_SOURCE -w -include prelude.h -I/usr/local/cuda/include -Isrc -Ibuild/config $S -o $HAMI \
    -L/usr/local/cuda/lib64/stubs -lcuda -lnvidia-ml -lpthread -ldl -lrt || echo "HAMI BUILD FAILED"
  objdump -T $HAMI 2>/dev/null | grep -o "GLIBC_2\.[0-9]*" | sort -t. -k2 -n -u | tail -3 | tr '\n' ' '; echo "(newest glibc versions libvgpu.so needs)"
  cd "$D"
fi

R=/tmp/img
if has nc20 || has nc50; then
  t "image root"
  mkdir -p $R && tar -xzf "$D/rootfs.tar.gz" -C $R
  # A container's root is a mount point; a bare chroot's is not, and Go's
  # CLONE_NEWNS (making / private) then fails with EINVAL.
  mount --bind $R $R
  mkdir -p $R/driver-root $R/dev $R/proc $R/sys $R/var/lib/facet-hami-core $R/tmp
  mount --rbind / $R/driver-root && mount -o remount,bind,ro $R/driver-root || echo "read-only remount of /driver-root failed"
  mount --rbind /dev $R/dev; mount -t proc proc $R/proc; mount --rbind /sys $R/sys
  cp $HAMI $R/var/lib/facet-hami-core/libvgpu.so
  ls $R/usr/bin; $R/lib64/ld-linux-x86-64.so.2 --version | head -1
fi
nc() {
  local label=$1; shift
  t "node check $label, from the image root"
  timeout 120 env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ TMPDIR=/tmp \
    chroot $R /usr/bin/facetctl node-check --gpu 0 --driver-root /driver-root --dev-root / \
    --nvidia-cdi-hook /usr/bin/nvidia-cdi-hook --hami-library /var/lib/facet-hami-core/libvgpu.so "$@"
  echo "node-check exit $?"
  tail -n 20 /tmp/facet-node-check-*/mps/*/log/control.log 2>/dev/null
  pgrep -a nvidia-cuda-mps || echo "no MPS process left"
}
has nc20 && nc "20 %" --share-cores 20 --share-memory 2000Mi --seconds 8 --slots 4
if has py; then
  t "PyTorch under MPS"
  timeout 200 env PYTHONUNBUFFERED=1 python3 "$D/mps_measure.py"
  echo "py exit $?"
  echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsm/pipe timeout 10 /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null
  pgrep -a nvidia-cuda-mps || echo "no MPS process left"
fi
if has ctx; then
  t "MPS context memory by active thread percentage"
  timeout 90 env PYTHONUNBUFFERED=1 python3 "$D/mps_measure.py" ctx; echo "ctx exit $?"
  echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsm/pipe timeout 10 /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null
fi
has nc50 && nc "50 %" --share-cores 50 --share-memory 4000Mi --seconds 8 --slots 2
# The driver under a prefix of its own (docs/driver-roots.md): its root has
# no loader, libc, /tmp or /dev/shm to chroot MPS into.
if has ncprefix; then
  t "node check with --driver-root at the driver's prefix"
  timeout 60 env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ TMPDIR=/tmp \
    chroot $R /usr/bin/facetctl node-check --gpu 0 --driver-root /driver-root/usr/local/nvidia --dev-root / \
    --nvidia-cdi-hook /usr/bin/nvidia-cdi-hook --hami-library /var/lib/facet-hami-core/libvgpu.so --seconds 0
  echo "node-check exit $?"
fi
t done
pkill -f nvidia-cuda-mps || true
