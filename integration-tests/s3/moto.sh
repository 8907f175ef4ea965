#!/usr/bin/env bash
# A local S3-compatible server (moto) for streamstate's s3:// checkpoint storage tests.
# Needs only python3 with venv; moto itself comes from PyPI into a private venv.
#
#   moto.sh start      install moto into the venv if missing, start, wait until it answers
#   moto.sh stop       SIGTERM by pid, wait for exit (SIGKILL after MOTO_STOP_TIMEOUT)
#   moto.sh status     exit 0 and print the pid if running, exit 1 otherwise
#   moto.sh endpoint   print the endpoint URL (http://127.0.0.1:$MOTO_PORT)
#   moto.sh python     install the venv if missing, print its interpreter (also has
#                      jsonschema, confluent-kafka and fastavro for the test helpers)
#
# Environment:
#   STREAMSTATE_MOTO_HOME  state dir (default /var/tmp/streamstate-moto): venv/, moto.log, moto.pid
#   MOTO_PORT              listen port on 127.0.0.1 (default 19000)
#   MOTO_START_TIMEOUT     seconds to wait for the server to answer (default 60)
#   MOTO_STOP_TIMEOUT      seconds to wait for a graceful stop (default 20)
#   PYTHON                 interpreter that creates the venv (default: python3 on PATH)
#
# Clients: any S3 client with path-style requests, e.g. AWS_ENDPOINT_URL="$(moto.sh endpoint)"
# AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1. moto keeps
# everything in memory: a stop forgets every bucket.
set -euo pipefail

# Pinned so every machine tests against the same server behaviour (conditional PUTs,
# multipart uploads); bump deliberately.
MOTO_VERSION="5.2.5"
# Also in the venv: the JSON Schema validator the rule-schema test uses, and the Kafka
# client + Avro codec of the independent Avro reader (integration-tests/registry/read_avro.py).
JSONSCHEMA_VERSION="4.26.0"
CONFLUENT_KAFKA_VERSION="2.16.1"
FASTAVRO_VERSION="1.13.1"

MOTO_HOME_DIR="${STREAMSTATE_MOTO_HOME:-/var/tmp/streamstate-moto}"
MOTO_PORT="${MOTO_PORT:-19000}"
MOTO_START_TIMEOUT="${MOTO_START_TIMEOUT:-60}"
MOTO_STOP_TIMEOUT="${MOTO_STOP_TIMEOUT:-20}"
PYTHON="${PYTHON:-python3}"

VENV="$MOTO_HOME_DIR/venv"
INSTALLED_MARKER="$VENV/.streamstate-moto-version"
# Everything pip installs into the venv; the marker records exactly this list, so a venv
# kept from an earlier run with fewer or other pins gets the missing ones installed.
VENV_PACKAGES=(
    "moto[server]==$MOTO_VERSION"
    "jsonschema==$JSONSCHEMA_VERSION"
    "confluent-kafka==$CONFLUENT_KAFKA_VERSION"
    "fastavro==$FASTAVRO_VERSION"
)
VENV_MARKER="${VENV_PACKAGES[*]}"
LOG_FILE="$MOTO_HOME_DIR/moto.log"
PID_FILE="$MOTO_HOME_DIR/moto.pid"
LOCK_FILE="$MOTO_HOME_DIR/.moto.sh.lock"
ENDPOINT="http://127.0.0.1:$MOTO_PORT"

log() { printf 'moto.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

with_lock() {
    mkdir -p "$MOTO_HOME_DIR"
    exec 9>"$LOCK_FILE"
    flock -w 300 9 || die "timed out waiting for $LOCK_FILE (another moto.sh running?)"
}

# ---------------------------------------------------------------- venv

# True when the venv has every pinned package (by the marker) and the helpers' ones import
# (moto itself is checked by its entry point: importing it takes ~0.5 s).
venv_complete() {
    [[ -x "$VENV/bin/moto_server" && "$(cat "$INSTALLED_MARKER" 2>/dev/null)" == "$VENV_MARKER" ]] \
        && "$VENV/bin/python" -c 'import jsonschema, confluent_kafka, fastavro' >/dev/null 2>&1
}

pip_install() {
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "${VENV_PACKAGES[@]}"
}

ensure_venv() {
    if venv_complete; then
        return 0
    fi
    # A venv kept from an earlier run (machines keep /var/tmp) with an older set of pins:
    # install what is missing into it; pip leaves packages already at their pin alone.
    if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
        log "updating $VENV to: ${VENV_PACKAGES[*]}"
        if pip_install && [[ -x "$VENV/bin/moto_server" ]]; then
            printf '%s' "$VENV_MARKER" >"$INSTALLED_MARKER"
            venv_complete && return 0
        fi
        log "updating $VENV failed; recreating it"
    fi
    command -v "$PYTHON" >/dev/null 2>&1 \
        || die "$PYTHON not found: install Python 3 (Debian: apt-get install python3 python3-venv) or set PYTHON"
    log "installing ${VENV_PACKAGES[*]} into $VENV (using $(command -v "$PYTHON"), $("$PYTHON" --version 2>&1))"
    rm -rf "$VENV"
    # Debian's python3 ships venv without ensurepip unless python3-venv is installed; the
    # error it prints then is easy to misread, so say what to do.
    if ! "$PYTHON" -m venv "$VENV" >"$MOTO_HOME_DIR/venv-create.log" 2>&1; then
        cat "$MOTO_HOME_DIR/venv-create.log" >&2
        rm -rf "$VENV"
        die "'$PYTHON -m venv' failed: on Debian/Ubuntu install the venv module (apt-get install python3-venv), or point PYTHON at an interpreter that has it"
    fi
    if ! pip_install; then
        rm -rf "$VENV"
        die "pip install ${VENV_PACKAGES[*]} failed (is PyPI reachable?)"
    fi
    [[ -x "$VENV/bin/moto_server" ]] || die "moto installed but $VENV/bin/moto_server is missing"
    printf '%s' "$VENV_MARKER" >"$INSTALLED_MARKER"
    venv_complete || die "installed ${VENV_PACKAGES[*]} into $VENV but they do not import"
}

# ---------------------------------------------------------------- process

read_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(tr -dc '0-9' <"$PID_FILE")"
    [[ -n "$pid" ]] || return 1
    printf '%s' "$pid"
}

# True when pid is alive and is our moto_server on our port (guards against pid reuse
# and a stale pid file).
pid_is_moto() {
    local pid="$1" state
    [[ -r "/proc/$pid/stat" ]] || return 1
    state="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
    [[ "$state" != "Z" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "moto_server -H 127.0.0.1 -p $MOTO_PORT"
}

running_pid() {
    local pid
    pid="$(read_pid)" || return 1
    pid_is_moto "$pid" || return 1
    printf '%s' "$pid"
}

wait_for_exit() {
    local pid="$1" deadline=$((SECONDS + $2))
    while pid_is_moto "$pid"; do
        (( SECONDS < deadline )) || return 1
        sleep 0.1
    done
    return 0
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# The server answers S3's ListBuckets on GET / once it is serving.
answers_http() {
    "$VENV/bin/python" - "$ENDPOINT/" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
}

print_log_tail() {
    if [[ -f "$LOG_FILE" ]]; then
        log "last 40 lines of $LOG_FILE:"
        tail -n 40 "$LOG_FILE" >&2 || true
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) at $ENDPOINT"
        return 0
    fi
    rm -f "$PID_FILE"
    ensure_venv
    port_open "$MOTO_PORT" && die "port $MOTO_PORT on 127.0.0.1 is already in use by another process (not our moto); set MOTO_PORT"

    local t0=$SECONDS
    printf '\n===== moto.sh start %s (moto %s, %s) =====\n' \
        "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$MOTO_VERSION" "$ENDPOINT" >>"$LOG_FILE"
    # setsid: own session, so the server outlives the caller's process group. The inner
    # bash records its own pid and then execs moto_server, so the pid file names the
    # server itself. fd 9 (our lock) is closed for the server.
    rm -f "$PID_FILE.new"
    # shellcheck disable=SC2016  # $$ is for the inner bash
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' moto-server "$PID_FILE.new" \
        "$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" \
        </dev/null >>"$LOG_FILE" 2>&1 9>&- &
    disown $! 2>/dev/null || true
    local _
    for _ in $(seq 1 50); do
        [[ -s "$PID_FILE.new" ]] && break
        sleep 0.1
    done
    [[ -s "$PID_FILE.new" ]] || die "moto launcher did not record a pid"
    mv "$PID_FILE.new" "$PID_FILE"
    pid="$(read_pid)"
    log "started moto pid $pid, waiting up to ${MOTO_START_TIMEOUT}s for $ENDPOINT to answer"

    local deadline=$((SECONDS + MOTO_START_TIMEOUT))
    until answers_http; do
        if ! pid_is_moto "$pid"; then
            print_log_tail
            rm -f "$PID_FILE"
            die "moto process $pid exited during start-up"
        fi
        if (( SECONDS >= deadline )); then
            print_log_tail
            log "moto did not answer within ${MOTO_START_TIMEOUT}s; killing pid $pid"
            kill -KILL "$pid" 2>/dev/null || true
            wait_for_exit "$pid" 10 || true
            rm -f "$PID_FILE"
            exit 1
        fi
        sleep 0.2
    done
    log "moto ready at $ENDPOINT (pid $pid, $((SECONDS - t0))s)"
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping moto pid $pid (SIGTERM)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for_exit "$pid" "$MOTO_STOP_TIMEOUT"; then
        log "WARNING: moto pid $pid still running after ${MOTO_STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_for_exit "$pid" 10 || die "moto pid $pid survived SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        printf '%s\n' "$pid"
        return 0
    fi
    log "not running"
    return 1
}

case "${1:-}" in
    start) with_lock; cmd_start ;;
    stop) with_lock; cmd_stop ;;
    status) cmd_status ;;
    endpoint) printf '%s\n' "$ENDPOINT" ;;
    python) with_lock; ensure_venv; printf '%s\n' "$VENV/bin/python" ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
