#!/usr/bin/env bash
# containerd's runc "BinaryName" for hack/cluster/up.sh (RUNTIME=containerd).
#
# Why: these VMs lack CAP_SYS_RESOURCE, so runc cannot lower a process's
# oom_score_adj. The kubelet gives containers negative oomScoreAdj values
# (e.g. -997 for Guaranteed pods, -998 for the sandbox), and runc then fails with
# "can't get final child's PID from pipe: EOF". Before `runc create`/`runc run`
# we rewrite any negative oomScoreAdj in the bundle's config.json to 0, then
# exec the real runc with the unchanged arguments.
set -euo pipefail

REAL_RUNC="${FACET_REAL_RUNC:-}"
if [[ -z "${REAL_RUNC}" ]]; then
  for c in /usr/sbin/runc /usr/bin/runc /usr/local/sbin/runc /usr/local/bin/runc; do
    if [[ -x "${c}" ]]; then REAL_RUNC="${c}"; break; fi
  done
fi
if [[ -z "${REAL_RUNC}" ]]; then
  echo "runc-wrapper: runc not found (apt-get install runc)" >&2
  exit 127
fi

# Find the subcommand and its --bundle/-b (default: the current directory, as runc does).
cmd="" bundle="." prev=""
for arg in "$@"; do
  case "${prev}" in
    --bundle|-b) bundle="${arg}"; prev=""; continue ;;
  esac
  case "${arg}" in
    --bundle=*) bundle="${arg#--bundle=}" ;;
    -b=*) bundle="${arg#-b=}" ;;
    create|run) [[ -z "${cmd}" ]] && cmd="${arg}" ;;
  esac
  prev="${arg}"
done

if [[ -n "${cmd}" && -f "${bundle}/config.json" ]]; then
  # containerd writes compact JSON: "oomScoreAdj":-998
  sed -i -E 's/"oomScoreAdj":[[:space:]]*-[0-9]+/"oomScoreAdj":0/g' "${bundle}/config.json"
fi

exec "${REAL_RUNC}" "$@"
