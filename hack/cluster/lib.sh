# Sourced by hack/cluster/up.sh and hack/cluster/add-node.sh: how a node's
# processes are started, waited for and reported on, and how its env.sh is
# written, in one place for both.
#
# The sourcing script sets, before it calls these:
#   FAIL_PREFIX    the prefix of failure lines, e.g. "[up]"
#   LOGS, PIDS     directories of the components' logs (NAME.log) and pid files
#   READY_TIMEOUT  seconds wait_for waits
#   CLEANUP        the command that cleans up, for the failure message
# and defines log MESSAGE. CURRENT names the component being worked on, for
# the ERR trap: trap 'fail "${CURRENT:-up.sh}" "..."' ERR.

# fail COMPONENT MESSAGE: say what broke, show the end of the component's log,
# exit non-zero. The other components are left running for inspection; the
# cleanup command stops them.
fail() {
  local comp="$1"; shift
  echo >&2
  echo "${FAIL_PREFIX} FAILED: ${comp}: $*" >&2
  if [[ -f "${LOGS}/${comp}.log" ]]; then
    echo "${FAIL_PREFIX} ---- last 40 lines of ${LOGS}/${comp}.log ----" >&2
    tail -n 40 "${LOGS}/${comp}.log" >&2
    echo "${FAIL_PREFIX} ---- end of ${comp}.log ----" >&2
  fi
  echo "${FAIL_PREFIX} logs: ${LOGS}/   clean up: ${CLEANUP}" >&2
  exit 1
}

# start NAME BINARY ARGS...: run in its own session (so it outlives this shell
# and the caller's Ctrl-C), log to LOGS/NAME.log, pid to PIDS/NAME.pid.
# The node's processes outlive the command that started it, so they must not
# inherit the e2e lock (RUN_DIR.lock: fd 9 in hack/e2e.sh, fd 3 under
# flock(1)): `flock /tmp/facet-e2e.lock make demo` would otherwise hold the
# lock until `make demo-down`, and a second flock'ed command would wait on it
# forever.
start() {
  local name="$1"; shift
  CURRENT="${name}"
  setsid "$@" >"${LOGS}/${name}.log" 2>&1 </dev/null 3>&- 9>&- &
  echo $! >"${PIDS}/${name}.pid"
}

alive() { kill -0 "$(cat "${PIDS}/$1.pid")" 2>/dev/null; }

# wait_for NAME WHAT CMD...: poll CMD until it succeeds; fail if NAME dies or
# READY_TIMEOUT passes.
wait_for() {
  local name="$1" what="$2"; shift 2
  local deadline=$((SECONDS + READY_TIMEOUT)) t=${SECONDS}
  CURRENT="${name}"
  until "$@" >/dev/null 2>&1; do
    alive "${name}" || fail "${name}" "process exited while waiting for ${what}"
    ((SECONDS < deadline)) || fail "${name}" "${what} not reached within ${READY_TIMEOUT}s"
    sleep 0.2
  done
  log "${name}: ${what} ($((SECONDS - t))s)"
}

# node_ready NODE KUBECTL...: whether the Node's Ready condition is True.
node_ready() {
  local node="$1"; shift
  [[ "$("$@" get node "${node}" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# write_env FILE COMMENT NAME=VALUE...: an env.sh to source, one
# `export NAME="VALUE"` line each (test/multinode reads them in that form).
# A VALUE must not hold a double quote, a backslash or a `$`.
write_env() {
  local file="$1" comment="$2" kv; shift 2
  {
    echo "# ${comment}"
    for kv in "$@"; do
      [[ "${kv#*=}" != *[\"\\\$]* ]] || { echo "write_env: ${kv%%=*} holds a quote, backslash or \$" >&2; return 1; }
      printf 'export %s="%s"\n' "${kv%%=*}" "${kv#*=}"
    done
  } >"${file}"
}
