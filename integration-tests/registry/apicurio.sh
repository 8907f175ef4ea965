#!/usr/bin/env bash
# A local Confluent-compatible Schema Registry (Apicurio Registry, in-memory storage) for
# streamstate's Avro / schema-registry tests. Needs Java 21+ and curl; the registry itself
# is one Maven Central tarball, fetched once into the state dir.
#
#   apicurio.sh start   fetch if missing, start, wait until the ccompat API answers
#   apicurio.sh stop    SIGTERM by pid, wait for exit (SIGKILL after STREAMSTATE_REGISTRY_STOP_TIMEOUT)
#   apicurio.sh kill    SIGKILL now (the in-memory registry forgets every schema)
#   apicurio.sh status  exit 0 and print the pid if running and answering, exit 1 otherwise
#   apicurio.sh url     print the Confluent-compatible API base URL
#                       (http://127.0.0.1:$STREAMSTATE_REGISTRY_PORT/apis/ccompat/v7)
#   apicurio.sh fetch   only download + extract the registry (e.g. to warm a CI cache)
#
# Environment:
#   STREAMSTATE_REGISTRY_HOME           state dir (default /var/tmp/streamstate-registry):
#                                       the tarball, dist/ (extracted), registry.log, registry.pid
#   STREAMSTATE_REGISTRY_PORT           HTTP port on 127.0.0.1 (default 19081)
#   STREAMSTATE_REGISTRY_MGMT_PORT      Quarkus management port on 127.0.0.1 (default 19082)
#   STREAMSTATE_REGISTRY_JAVA           Java 21+ binary (default /usr/lib/jvm/temurin-25-jdk-amd64/bin/java)
#   STREAMSTATE_REGISTRY_HEAP_OPTS      registry heap (default "-Xms64m -Xmx512m")
#   STREAMSTATE_REGISTRY_START_TIMEOUT  seconds to wait for the API to answer (default 120)
#   STREAMSTATE_REGISTRY_STOP_TIMEOUT   seconds to wait for a graceful stop (default 30)
#
# Storage is in memory (Apicurio's default): a stop or kill forgets every schema and id.
set -euo pipefail

# Pinned; bump deliberately, together with the SHA-1 (the .sha1 file Maven Central serves
# next to the tarball).
REGISTRY_VERSION="3.3.3"
REGISTRY_SHA1="71e7918455480cbce405ad45552254eb47ec932d"
REGISTRY_TARBALL_NAME="apicurio-registry-app-$REGISTRY_VERSION-all.tar.gz"
REGISTRY_TARBALL_URL="https://repo1.maven.org/maven2/io/apicurio/apicurio-registry-app/$REGISTRY_VERSION/$REGISTRY_TARBALL_NAME"

REGISTRY_HOME_DIR="${STREAMSTATE_REGISTRY_HOME:-/var/tmp/streamstate-registry}"
REGISTRY_PORT="${STREAMSTATE_REGISTRY_PORT:-19081}"
REGISTRY_MGMT_PORT="${STREAMSTATE_REGISTRY_MGMT_PORT:-19082}"
REGISTRY_JAVA="${STREAMSTATE_REGISTRY_JAVA:-/usr/lib/jvm/temurin-25-jdk-amd64/bin/java}"
REGISTRY_HEAP_OPTS="${STREAMSTATE_REGISTRY_HEAP_OPTS:--Xms64m -Xmx512m}"
REGISTRY_START_TIMEOUT="${STREAMSTATE_REGISTRY_START_TIMEOUT:-120}"
REGISTRY_STOP_TIMEOUT="${STREAMSTATE_REGISTRY_STOP_TIMEOUT:-30}"

TARBALL="$REGISTRY_HOME_DIR/$REGISTRY_TARBALL_NAME"
DIST_DIR="$REGISTRY_HOME_DIR/dist"
FETCH_MARKER="$DIST_DIR/.streamstate-fetched"
LOG_FILE="$REGISTRY_HOME_DIR/registry.log"
PID_FILE="$REGISTRY_HOME_DIR/registry.pid"
LOCK_FILE="$REGISTRY_HOME_DIR/.apicurio.sh.lock"
BASE_URL="http://127.0.0.1:$REGISTRY_PORT"
CCOMPAT_URL="$BASE_URL/apis/ccompat/v7"

log() { printf 'apicurio.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

with_lock() {
    mkdir -p "$REGISTRY_HOME_DIR"
    exec 9>"$LOCK_FILE"
    flock -w 600 9 || die "timed out waiting for $LOCK_FILE (another apicurio.sh running?)"
}

need_curl() {
    command -v curl >/dev/null 2>&1 || die "curl not found (Debian: apt-get install curl)"
}

# ---------------------------------------------------------------- java / fetch

check_java() {
    [[ -x "$REGISTRY_JAVA" ]] \
        || die "Java 21+ not found at $REGISTRY_JAVA (Apicurio Registry $REGISTRY_VERSION needs Java 21+): install one or set STREAMSTATE_REGISTRY_JAVA"
    local spec
    spec="$("$REGISTRY_JAVA" -XshowSettings:properties -version 2>&1 \
        | sed -n 's/^ *java\.specification\.version = *//p' | head -n1)"
    [[ "$spec" =~ ^[0-9]+$ ]] || die "cannot determine Java version of '$REGISTRY_JAVA' (got '$spec')"
    (( spec >= 21 )) || die "Apicurio Registry $REGISTRY_VERSION needs Java 21+, '$REGISTRY_JAVA' is Java $spec (set STREAMSTATE_REGISTRY_JAVA)"
}

expected_marker() {
    printf 'apicurio-registry-app=%s sha1=%s\n' "$REGISTRY_VERSION" "$REGISTRY_SHA1"
}

# The Quarkus fast-jar launcher inside the extracted tarball (its lib/, app/, quarkus/
# sit next to it).
find_run_jar() {
    local jar
    jar="$(find "$1" -type f -name quarkus-run.jar 2>/dev/null | sort | head -n1)"
    [[ -n "$jar" ]] || return 1
    printf '%s' "$jar"
}

dist_present() {
    [[ -f "$FETCH_MARKER" ]] && [[ "$(cat "$FETCH_MARKER")" == "$(expected_marker)" ]] \
        && find_run_jar "$DIST_DIR" >/dev/null
}

sha1_ok() {
    [[ "$(sha1sum "$1" | cut -d' ' -f1)" == "$REGISTRY_SHA1" ]]
}

ensure_dist() {
    if dist_present; then
        return 0
    fi
    need_curl
    mkdir -p "$REGISTRY_HOME_DIR"
    # Leftovers of an interrupted fetch (we hold the lock, so none is in progress).
    rm -rf "$TARBALL".part.* "$REGISTRY_HOME_DIR"/dist.extract.*
    if [[ -f "$TARBALL" ]] && ! sha1_ok "$TARBALL"; then
        log "discarding $TARBALL: SHA-1 mismatch"
        rm -f "$TARBALL"
    fi
    if [[ ! -f "$TARBALL" ]]; then
        # Cross-check the pinned SHA-1 with the one Maven Central publishes, so a bump of
        # REGISTRY_VERSION without its SHA-1 fails here with a clear message.
        local served
        served="$(curl -fsSL --retry 3 --max-time 60 "$REGISTRY_TARBALL_URL.sha1" | tr -dc '0-9a-f' | cut -c1-40)" \
            || die "cannot fetch $REGISTRY_TARBALL_URL.sha1 (is Maven Central reachable?)"
        [[ "$served" == "$REGISTRY_SHA1" ]] \
            || die "Maven Central's SHA-1 for $REGISTRY_TARBALL_NAME is '$served', the pinned one is $REGISTRY_SHA1"
        log "downloading Apicurio Registry $REGISTRY_VERSION (~158 MB, one-time) from $REGISTRY_TARBALL_URL"
        # A temp name, renamed only once complete and verified: an interrupted download is
        # never taken for a good one.
        local part="$TARBALL.part.$$"
        if ! curl -fSL --retry 3 --connect-timeout 30 --max-time 1800 -sS -o "$part" "$REGISTRY_TARBALL_URL"; then
            rm -f "$part"
            die "download of $REGISTRY_TARBALL_URL failed"
        fi
        if ! sha1_ok "$part"; then
            rm -f "$part"
            die "downloaded $REGISTRY_TARBALL_NAME does not have SHA-1 $REGISTRY_SHA1"
        fi
        mv "$part" "$TARBALL"
    fi
    local tmp="$REGISTRY_HOME_DIR/dist.extract.$$" jar
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! tar --no-same-owner -xzf "$TARBALL" -C "$tmp"; then
        rm -rf "$tmp"
        die "cannot extract $TARBALL"
    fi
    jar="$(find_run_jar "$tmp")" || { rm -rf "$tmp"; die "$TARBALL has no quarkus-run.jar"; }
    expected_marker >"$tmp/.streamstate-fetched"
    rm -rf "$DIST_DIR"
    mv "$tmp" "$DIST_DIR"
    log "extracted into $DIST_DIR (launcher ${jar#"$tmp"/})"
}

# ---------------------------------------------------------------- process

read_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(tr -dc '0-9' <"$PID_FILE")"
    [[ -n "$pid" ]] || return 1
    printf '%s' "$pid"
}

# True when pid is alive (not a zombie) and is our registry JVM on our port (guards
# against pid reuse and a stale pid file).
pid_is_registry() {
    local pid="$1" state cmdline
    [[ -r "/proc/$pid/stat" ]] || return 1
    state="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
    [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]] || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
    [[ "$cmdline" == *"-Dquarkus.http.port=$REGISTRY_PORT "* && "$cmdline" == *"quarkus-run.jar"* ]]
}

running_pid() {
    local pid
    pid="$(read_pid)" || return 1
    pid_is_registry "$pid" || return 1
    printf '%s' "$pid"
}

wait_for_exit() {
    local pid="$1" deadline=$((SECONDS + $2))
    while pid_is_registry "$pid"; do
        (( SECONDS < deadline )) || return 1
        sleep 0.1
    done
    return 0
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Ready = the Confluent-compatible API lists subjects.
answers_http() {
    [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$CCOMPAT_URL/subjects" 2>/dev/null)" == "200" ]]
}

print_log_tail() {
    if [[ -f "$LOG_FILE" ]]; then
        log "last 60 lines of $LOG_FILE:"
        tail -n 60 "$LOG_FILE" >&2 || true
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) at $CCOMPAT_URL"
        return 0
    fi
    rm -f "$PID_FILE"
    need_curl
    check_java
    ensure_dist
    if port_open "$REGISTRY_PORT" || port_open "$REGISTRY_MGMT_PORT"; then
        die "port $REGISTRY_PORT or $REGISTRY_MGMT_PORT on 127.0.0.1 is already in use by another process (not our registry); set STREAMSTATE_REGISTRY_PORT / STREAMSTATE_REGISTRY_MGMT_PORT"
    fi
    local jar
    jar="$(find_run_jar "$DIST_DIR")" || die "no quarkus-run.jar under $DIST_DIR"

    local t0=$SECONDS
    printf '\n===== apicurio.sh start %s (Apicurio Registry %s, %s) =====\n' \
        "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$REGISTRY_VERSION" "$BASE_URL" >>"$LOG_FILE"
    # setsid: own session, so the registry outlives the caller's process group. The inner
    # bash records its own pid, changes to the state dir (anything the JVM writes to its
    # working directory stays out of the checkout) and then execs java, so the pid file
    # names the JVM. fd 9 (our lock) is closed for the registry.
    rm -f "$PID_FILE.new"
    # shellcheck disable=SC2016,SC2086  # $$ is for the inner bash; heap opts are meant to split
    setsid bash -c 'echo $$ >"$1"; cd "$2"; shift 2; exec "$@"' apicurio-registry "$PID_FILE.new" "$REGISTRY_HOME_DIR" \
        "$REGISTRY_JAVA" $REGISTRY_HEAP_OPTS \
        -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$REGISTRY_PORT" \
        -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$REGISTRY_MGMT_PORT" \
        -jar "$jar" \
        </dev/null >>"$LOG_FILE" 2>&1 9>&- &
    disown $! 2>/dev/null || true
    local _
    for _ in $(seq 1 50); do
        [[ -s "$PID_FILE.new" ]] && break
        sleep 0.1
    done
    [[ -s "$PID_FILE.new" ]] || die "registry launcher did not record a pid"
    mv "$PID_FILE.new" "$PID_FILE"
    pid="$(read_pid)"
    log "started registry pid $pid, waiting up to ${REGISTRY_START_TIMEOUT}s for $CCOMPAT_URL/subjects to answer"

    local deadline=$((SECONDS + REGISTRY_START_TIMEOUT))
    until answers_http; do
        if ! pid_is_registry "$pid"; then
            print_log_tail
            rm -f "$PID_FILE"
            die "registry process $pid exited during start-up"
        fi
        if (( SECONDS >= deadline )); then
            print_log_tail
            log "registry did not answer within ${REGISTRY_START_TIMEOUT}s; killing pid $pid"
            kill -KILL "$pid" 2>/dev/null || true
            wait_for_exit "$pid" 10 || true
            rm -f "$PID_FILE"
            exit 1
        fi
        sleep 0.2
    done
    log "registry ready at $CCOMPAT_URL (pid $pid, $((SECONDS - t0))s)"
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping registry pid $pid (SIGTERM)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for_exit "$pid" "$REGISTRY_STOP_TIMEOUT"; then
        log "WARNING: registry pid $pid still running after ${REGISTRY_STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_for_exit "$pid" 10 || die "registry pid $pid survived SIGKILL"
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

cmd_kill() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "killing registry pid $pid (SIGKILL)"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for_exit "$pid" 10 || die "registry pid $pid survived SIGKILL"
    rm -f "$PID_FILE"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        if answers_http; then
            printf '%s\n' "$pid"
            return 0
        fi
        log "pid $pid is running but $CCOMPAT_URL/subjects does not answer"
        return 1
    fi
    log "not running"
    return 1
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

case "${1:-}" in
    start) with_lock; cmd_start ;;
    stop) with_lock; cmd_stop ;;
    kill) with_lock; cmd_kill ;;
    status) cmd_status ;;
    url) printf '%s\n' "$CCOMPAT_URL" ;;
    fetch) with_lock; ensure_dist ;;
    -h|--help|help) usage ;;
    *)
        [[ -z "${1:-}" ]] || log "unknown command: $1"
        usage
        ;;
esac
