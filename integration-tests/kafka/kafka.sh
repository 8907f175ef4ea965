#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft, combined broker+controller) for streamstate's
# integration tests. Needs only Java 17+ and Maven (for the one-time jar fetch).
#
#   kafka.sh start      fetch jars if missing, format storage if new, start, wait until it answers
#   kafka.sh stop       SIGTERM, wait for exit (SIGKILL after KAFKA_STOP_TIMEOUT)
#   kafka.sh kill       SIGKILL (for fault-injection tests); data is kept
#   kafka.sh restart    stop + start on the same data (no reformat)
#   kafka.sh status     exit 0 and print the pid if running, exit 1 otherwise
#   kafka.sh bootstrap  print the bootstrap address (127.0.0.1:$KAFKA_PORT)
#   kafka.sh reset      stop and delete data + logs (keeps the jar cache)
#   kafka.sh fetch      only fetch the jars (e.g. to warm a CI cache)
#   kafka.sh run-class CLASS [ARGS...]
#                       run a Kafka CLI class on the broker classpath, e.g.
#                       kafka.sh run-class org.apache.kafka.tools.TopicCommand \
#                         --bootstrap-server "$(kafka.sh bootstrap)" --list
#   kafka.sh classpath  print the classpath (libs/*)
#
# Environment:
#   STREAMSTATE_KAFKA_HOME  state dir (default /var/tmp/streamstate-kafka):
#                           libs/ (jar cache), data/ (server.properties, log dirs),
#                           broker.log, gc.log (the JVM's pauses), broker.pid
#   KAFKA_PORT              PLAINTEXT listener port (default 19092)
#   KAFKA_CONTROLLER_PORT   CONTROLLER listener port (default 19093)
#   KAFKA_START_TIMEOUT     seconds to wait for the broker to answer (default 90)
#   KAFKA_STOP_TIMEOUT      seconds to wait for a graceful stop (default 60)
#   KAFKA_HEAP_OPTS         broker heap (default "-Xms256m -Xmx768m")
#   JAVA                    java binary (default: java on PATH, or $JAVA_HOME/bin/java)
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
POM="$SCRIPT_DIR/pom.xml"
BROKER_LOG4J="$SCRIPT_DIR/log4j2-broker.properties"
TOOLS_LOG4J="$SCRIPT_DIR/log4j2-tools.properties"

KAFKA_HOME_DIR="${STREAMSTATE_KAFKA_HOME:-/var/tmp/streamstate-kafka}"
KAFKA_PORT="${KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-19093}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-60}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"

LIBS_DIR="$KAFKA_HOME_DIR/libs"
DATA_DIR="$KAFKA_HOME_DIR/data"
LOG_DIRS="$DATA_DIR/kraft-logs"
SERVER_PROPS="$DATA_DIR/server.properties"
PROBE_PROPS="$DATA_DIR/probe-client.properties"
BROKER_LOG="$KAFKA_HOME_DIR/broker.log"
# GC pauses and safepoints: tells a stall of the JVM from one of the machine.
GC_LOG="$KAFKA_HOME_DIR/gc.log"
PID_FILE="$KAFKA_HOME_DIR/broker.pid"
LOCK_FILE="$KAFKA_HOME_DIR/.kafka.sh.lock"
FETCH_MARKER="$LIBS_DIR/.streamstate-fetched"
BOOTSTRAP="127.0.0.1:$KAFKA_PORT"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- java / jars

find_java() {
    if [[ -n "${JAVA:-}" ]]; then
        :
    elif command -v java >/dev/null 2>&1; then
        JAVA=java
    elif [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        JAVA="$JAVA_HOME/bin/java"
    else
        die "java not found (Kafka 4 needs Java 17+): install a JDK or set JAVA/JAVA_HOME"
    fi
    local spec
    spec="$("$JAVA" -XshowSettings:properties -version 2>&1 \
        | sed -n 's/^ *java\.specification\.version = *//p' | head -n1)"
    [[ "$spec" =~ ^[0-9]+$ ]] || die "cannot determine Java version of '$JAVA' (got '$spec')"
    (( spec >= 17 )) || die "Kafka 4 needs Java 17+, '$JAVA' is Java $spec"
}

pinned_version() {
    sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' "$POM" | head -n1
}

# Marker content: pinned Kafka version + hash of the pom, so any pom change re-fetches.
expected_marker() {
    printf 'kafka=%s pom-sha256=%s\n' "$(pinned_version)" "$(sha256sum "$POM" | cut -d' ' -f1)"
}

jars_present() {
    [[ -f "$FETCH_MARKER" ]] && [[ "$(cat "$FETCH_MARKER")" == "$(expected_marker)" ]]
}

ensure_jars() {
    if jars_present; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || die "mvn not found: needed once to fetch the Kafka jars into $LIBS_DIR"
    local version tmp
    version="$(pinned_version)"
    [[ -n "$version" ]] || die "no <kafka.version> in $POM"
    log "fetching Apache Kafka $version jars from Maven into $LIBS_DIR (one-time)"
    tmp="$KAFKA_HOME_DIR/libs.fetch.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # -B: no colours / progress bars in CI logs. Runs in the state dir so nothing
    # (target/, etc.) is ever written into the git checkout.
    # The sed strips the stray ANSI resets Debian's Maven 3.8 prints even with -B.
    if ! (cd "$KAFKA_HOME_DIR" && mvn -B -q -Dstyle.color=never -f "$POM" \
            dependency:copy-dependencies -DoutputDirectory="$tmp" -DincludeScope=runtime 2>&1) \
            | sed -e 's/\x1b\[[0-9;]*m//g' -e '/^[[:space:]]*$/d' >&2; then
        rm -rf "$tmp"
        die "maven failed to fetch the Kafka $version jars"
    fi
    ls "$tmp"/kafka_2.13-"$version".jar "$tmp"/kafka-tools-"$version".jar >/dev/null 2>&1 \
        || { rm -rf "$tmp"; die "maven ran but kafka_2.13/kafka-tools $version jars are missing"; }
    expected_marker >"$tmp/.streamstate-fetched"
    rm -rf "$LIBS_DIR"
    mv "$tmp" "$LIBS_DIR"
    log "fetched $(find "$LIBS_DIR" -name '*.jar' | wc -l) jars"
}

classpath() { printf '%s/*' "$LIBS_DIR"; }

# Run a Kafka CLI class (quiet logging on stderr, small fast-starting JVM).
run_class() {
    local cls="$1"
    shift
    "$JAVA" -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$TOOLS_LOG4J" \
        -cp "$(classpath)" "$cls" "$@"
}

# ---------------------------------------------------------------- process state

read_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(tr -dc '0-9' <"$PID_FILE")"
    [[ -n "$pid" ]] || return 1
    printf '%s' "$pid"
}

# Alive = exists, not a zombie (PID 1 in a container may never reap it), and is
# our broker (guards against pid reuse after a reboot / stale pid file).
pid_is_broker() {
    local pid="$1" state
    [[ -r "/proc/$pid/stat" ]] || return 1
    state="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
    [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $SERVER_PROPS"
}

running_pid() {
    local pid
    pid="$(read_pid)" || return 1
    pid_is_broker "$pid" || return 1
    printf '%s' "$pid"
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_for_exit() {
    local pid="$1" deadline=$((SECONDS + $2))
    while pid_is_broker "$pid"; do
        (( SECONDS < deadline )) || return 1
        sleep 0.2
    done
    return 0
}

with_lock() {
    mkdir -p "$KAFKA_HOME_DIR"
    exec 9>"$LOCK_FILE"
    flock -w 300 9 || die "timed out waiting for $LOCK_FILE (another kafka.sh running?)"
}

# ---------------------------------------------------------------- config / storage

write_config() {
    mkdir -p "$DATA_DIR" "$LOG_DIRS"
    # Regenerated on every start from the environment. The controller quorum is
    # the static controller.quorum.voters form, so changing KAFKA_CONTROLLER_PORT
    # between runs on the same data is fine (a --standalone dynamic quorum would
    # record the controller endpoint in the metadata log).
    cat >"$SERVER_PROPS.tmp" <<EOF
# Generated by streamstate integration-tests/kafka/kafka.sh - do not edit.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER

log.dirs=$LOG_DIRS
metadata.log.dir=$LOG_DIRS

num.partitions=4
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false

offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000

# After a SIGKILL the restarted node cannot register until the controller has
# fenced the dead incarnation (DUPLICATE_BROKER_REGISTRATION until the session
# times out; default 9 s), so a short session keeps kill+start quick. But a stall
# longer than the session fences this single node from itself: every partition
# goes leaderless until it registers again (CI, 2026-12-07: the JVM logged
# nothing for 6.5 s on 2 busy cores, the 5 s session then fenced it, and the
# partitions were back 14 s later, past the tests' checkpoint.timeout). 12 s
# rides out such a stall and costs a SIGKILL restart a few seconds.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=12000

# Small box (2 cores): fewer threads, smaller cleaner buffer.
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=2
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=33554432
EOF
    mv "$SERVER_PROPS.tmp" "$SERVER_PROPS"
    # Client config for the readiness probe: fail fast, retry from the loop.
    cat >"$PROBE_PROPS" <<EOF
request.timeout.ms=5000
default.api.timeout.ms=10000
socket.connection.setup.timeout.ms=2000
socket.connection.setup.timeout.max.ms=5000
EOF
}

is_formatted() {
    [[ -f "$LOG_DIRS/meta.properties" ]]
}

format_storage() {
    local cluster_id out
    cluster_id="$(run_class kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1 | tr -d '[:space:]')"
    [[ -n "$cluster_id" ]] || die "kafka.tools.StorageTool random-uuid produced no cluster id"
    log "formatting KRaft storage in $LOG_DIRS (cluster id $cluster_id)"
    if ! out="$(run_class kafka.tools.StorageTool format -t "$cluster_id" -c "$SERVER_PROPS" 2>&1)"; then
        printf '%s\n' "$out" >&2
        die "kafka.tools.StorageTool format failed"
    fi
}

# ---------------------------------------------------------------- readiness

probe() {
    local out
    out="$(timeout 30 "$JAVA" -Xms32m -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            -Dlog4j2.configurationFile="$TOOLS_LOG4J" -cp "$(classpath)" \
            org.apache.kafka.tools.BrokerApiVersionsCommand \
            --bootstrap-server "$BOOTSTRAP" --command-config "$PROBE_PROPS" 2>/dev/null)" || return 1
    grep -q '(id: 1 ' <<<"$out"
}

print_log_tail() {
    if [[ -f "$BROKER_LOG" ]]; then
        log "last 60 lines of $BROKER_LOG:"
        tail -n 60 "$BROKER_LOG" >&2 || true
    fi
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local pid
    if pid="$(running_pid)"; then
        log "already running (pid $pid) on $BOOTSTRAP"
        return 0
    fi
    rm -f "$PID_FILE"
    find_java
    ensure_jars
    if port_open "$KAFKA_PORT" || port_open "$KAFKA_CONTROLLER_PORT"; then
        die "port $KAFKA_PORT or $KAFKA_CONTROLLER_PORT on 127.0.0.1 is already in use by another process (not our broker); set KAFKA_PORT / KAFKA_CONTROLLER_PORT"
    fi
    write_config
    is_formatted || format_storage

    local t0=$SECONDS
    printf '\n===== kafka.sh start %s (Kafka %s, %s) =====\n' \
        "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$(pinned_version)" "$BOOTSTRAP" >>"$BROKER_LOG"
    # setsid: own session, so the broker outlives the caller's terminal / process
    # group. The inner bash writes its own pid and then execs java, so the
    # recorded pid is the JVM's. fd 9 (our lock) is closed for the broker.
    rm -f "$PID_FILE.new"
    # shellcheck disable=SC2016,SC2086  # $$ is for the inner bash; heap opts are meant to split
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' kafka-broker "$PID_FILE.new" \
        "$JAVA" $KAFKA_HEAP_OPTS \
        -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
        -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError \
        "-Xlog:gc,safepoint:file=$GC_LOG:time,uptime,level,tags:filecount=2,filesize=20m" \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$BROKER_LOG4J" \
        -cp "$(classpath)" kafka.Kafka "$SERVER_PROPS" \
        </dev/null >>"$BROKER_LOG" 2>&1 9>&- &
    disown $! 2>/dev/null || true   # not a job of this shell: no "Killed" notices
    local _
    for _ in $(seq 1 50); do
        [[ -s "$PID_FILE.new" ]] && break
        sleep 0.1
    done
    [[ -s "$PID_FILE.new" ]] || die "broker launcher did not record a pid"
    mv "$PID_FILE.new" "$PID_FILE"
    pid="$(read_pid)"
    log "started broker pid $pid, waiting up to ${KAFKA_START_TIMEOUT}s for $BOOTSTRAP to answer"

    local deadline=$((SECONDS + KAFKA_START_TIMEOUT))
    while :; do
        if ! pid_is_broker "$pid"; then
            print_log_tail
            rm -f "$PID_FILE"
            die "broker process $pid exited during start-up"
        fi
        if port_open "$KAFKA_PORT" && probe; then
            break
        fi
        if (( SECONDS >= deadline )); then
            print_log_tail
            log "broker did not answer within ${KAFKA_START_TIMEOUT}s; killing pid $pid"
            kill -KILL "$pid" 2>/dev/null || true
            wait_for_exit "$pid" 10 || true
            rm -f "$PID_FILE"
            exit 1
        fi
        sleep 0.5
    done
    log "broker ready on $BOOTSTRAP (pid $pid, $((SECONDS - t0))s)"
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping broker pid $pid (SIGTERM)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for_exit "$pid" "$KAFKA_STOP_TIMEOUT"; then
        log "WARNING: broker pid $pid still running after ${KAFKA_STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_for_exit "$pid" 10 || die "broker pid $pid survived SIGKILL"
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
    log "killing broker pid $pid (SIGKILL)"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for_exit "$pid" 10 || die "broker pid $pid survived SIGKILL"
    rm -f "$PID_FILE"
}

cmd_status() {
    local pid
    if pid="$(running_pid)"; then
        echo "running pid $pid on $BOOTSTRAP"
        return 0
    fi
    echo "not running"
    return 1
}

cmd_reset() {
    cmd_stop
    log "deleting $DATA_DIR and broker logs (keeping $LIBS_DIR)"
    rm -rf "$DATA_DIR" "$BROKER_LOG" "$GC_LOG" "$GC_LOG".* "$PID_FILE" "$PID_FILE.new"
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

main() {
    [[ $# -ge 1 ]] || usage
    local cmd="$1"
    shift
    case "$cmd" in
        start)     with_lock; cmd_start ;;
        stop)      with_lock; cmd_stop ;;
        kill)      with_lock; cmd_kill ;;
        restart)   with_lock; cmd_stop; cmd_start ;;
        status)    cmd_status ;;
        bootstrap) echo "$BOOTSTRAP" ;;
        reset)     with_lock; cmd_reset ;;
        fetch)     with_lock; find_java; ensure_jars ;;
        classpath) classpath; echo ;;
        run-class)
            [[ $# -ge 1 ]] || die "usage: kafka.sh run-class CLASS [ARGS...]"
            find_java
            jars_present || { with_lock; ensure_jars; exec 9>&-; }
            run_class "$@"
            ;;
        -h|--help|help) usage ;;
        *) log "unknown command: $cmd"; usage ;;
    esac
}

main "$@"
