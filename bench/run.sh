#!/usr/bin/env bash
# One command for streamstate's side-by-side benchmarks: builds, starts its own broker
# (pinned to CPU 0), fills the inputs once, runs each contender (pinned to CPU 1) from
# offset 0 into its own output topic, per workload, checks every output, writes
# BENCHMARKS.md and a PNG. A benchmark, never a test: it reports figures and fails only
# when a contender crashes or its output is wrong. See bench/README.md.
#
#   bench/run.sh                                   # the S workload (~90 min)
#   BENCH_WORKLOADS=S,S-zipf,D,W bench/run.sh      # the full comparison (~3 h), or in parts:
#   BENCH_WORKLOADS=S-zipf,D BENCH_MERGE=BENCHMARKS.json bench/run.sh   # part 2, merged
#   BENCH_WORKLOADS=W BENCH_MERGE=BENCHMARKS.json bench/run.sh          # part 3, merged
#   BENCH_WORKLOADS=SEQ BENCH_MERGE=BENCHMARKS.json bench/run.sh        # sequence rules, merged
#   BENCH_WORKLOADS=AVRO BENCH_MERGE=BENCHMARKS.json bench/run.sh       # Avro input beside JSON, merged
#
# Environment (defaults in brackets):
#   BENCH_EVENTS [1000000]  BENCH_KEYS [1000000]  BENCH_DIST [uniform|zipf]  BENCH_SEED [42]
#   BENCH_REPEATS [3]       BENCH_INTERVAL [1s]   BENCH_LABEL [""] (a line under the title)
#   BENCH_LOADS [0.5,0.8] (latency runs; empty: none)  BENCH_LATENCY_SECS [30]
#   BENCH_LATENCY_INPUT [""]  non-empty: the latency reader also times the input records
#   BENCH_SHORT_INTERVAL [200ms]  S-EO's extra latency run at 50% load with this checkpoint
#                           interval (empty: none)
#   BENCH_STATE_SWEEP_MB [100,1000] checkpoint figures at these state sizes, from the
#                           recovery run, whose SIGKILL waits for the largest; it reads its
#                           own input, BENCH_SWEEP_EVENTS [20000000] over BENCH_SWEEP_KEYS
#                           [100000000] keys (almost every event a new key: S-EO then keeps
#                           ~64 bytes per event on disk; the dedup TTL levels checkpoints off
#                           near 0.93 GB after ~10 min, and at most 90% of the input is read
#                           before the kill). Empty: the recovery run reads the main input
#                           and is killed at half of it
#   BENCH_WORKLOADS [S]  of S,S-zipf,D,W,SEQ,AVRO. S: bench/rules.json on the main input (+ latency runs
#                           and the state sweep); S-zipf: the same on BENCH_ZIPF_KEYS [100000] keys,
#                           Zipf(1.0), BENCH_EVENTS events; D: dedup (rules-d.json); W: tumbling
#                           event-time windows (rules-w.json); SEQ: one sequence rule
#                           (rules-seq.json) in processing time (S-EO-seq) and in event time
#                           (S-EO-seq-et, W's `ts` and 2 s), all on the main input; AVRO: J and
#                           S-EO beside J-avro and S-EO-avro, the same jobs on the main input's
#                           Avro twin (<input>-avro, written by the generator with it: the same
#                           events at the same offsets, schema registered with a local Apicurio
#                           Registry, integration-tests/registry/apicurio.sh, started for it and
#                           stopped at the end); SEQ and AVRO are in no default and have no
#                           latency runs or sweep
#   BENCH_MERGE [""]  an earlier part's BENCHMARKS.json: the workloads this run does not run
#                           are taken from it into the report (and its latency and sweep
#                           figures when this run has no S)
#   BENCH_REFERENCE [BENCHMARKS.json]  the run this machine is compared with (bench/machine.py):
#                           J and KS far below it, or P's and J's p99 far above, are logged
#                           as they happen and flagged in the report; only when both runs read
#                           the same input (events, keys, distribution, seed). Empty: no comparison
#   BENCH_CONTENDERS [P,J,S-EO,S-ALO,S-EO-10s,S-EO-heap,S-EO-grouped,S-EO-console,KS,Q,F,S-EO-seq,S-EO-seq-et,J-avro,S-EO-avro]
#                           (unavailable ones are skipped and named; each workload runs those
#                           that can express it: D, W and S-zipf S-EO, KS, Q, F; SEQ S-EO-seq
#                           and S-EO-seq-et only; AVRO J, J-avro, S-EO, S-EO-avro)
#   BENCH_BASE_BIN [""]  another streamstate binary: adds the contender S-EO-base (S-EO run by
#                           it) to S, for an A/B of a change in one invocation (name it in
#                           BENCH_CONTENDERS, e.g. S-EO,S-EO-base)
#   BENCH_WORK [/var/tmp/streamstate-bench]       run dirs, venv, broker home
#   BENCH_REPORT [BENCHMARKS.md]  BENCH_PLOT [bench/benchmarks.png]  where the report goes
#   BENCH_BUILD [1]  0: no cargo build; the streamstate, bench-generator and bench-latency
#                           binaries already in $CARGO_TARGET_DIR/release are used as they are
#   BENCH_CARGO_FEATURES [""]  extra features for the build (e.g. streamstate/failpoints, to
#                               reuse a test build; the crash points stay inert)
#   BENCH_ADMIN_PORT [19464]   streamstate's admin port during runs (metrics are read there)
#   BENCH_FLINK_REST_PORT [19481]  the Flink MiniCluster's REST API (checkpoint figures)
#   KAFKA_PORT [19792] KAFKA_CONTROLLER_PORT [19793] STREAMSTATE_KAFKA_HOME [$BENCH_WORK/kafka]
#   STREAMSTATE_REGISTRY_PORT [19083] STREAMSTATE_REGISTRY_MGMT_PORT [19084]
#   STREAMSTATE_REGISTRY_HOME [$BENCH_WORK/registry]  the AVRO workload's registry: its own
#                           port and home, apart from the integration tests' (19081), whose
#                           run.sh stops any registry of the default home when it starts
#   CARGO_TARGET_DIR [/var/tmp/streamstate-target]  (the README's and every script's: a
#                           first run reuses the RocksDB build instead of redoing it)
set -euo pipefail
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
EVENTS="${BENCH_EVENTS:-1000000}"
KEYS="${BENCH_KEYS:-1000000}"
DIST="${BENCH_DIST:-uniform}"
SEED="${BENCH_SEED:-42}"
REPEATS="${BENCH_REPEATS:-3}"
INTERVAL="${BENCH_INTERVAL:-1s}"
CONTENDERS="${BENCH_CONTENDERS:-P,J,S-EO,S-ALO,S-EO-10s,S-EO-heap,S-EO-grouped,S-EO-console,KS,Q,F,S-EO-seq,S-EO-seq-et,J-avro,S-EO-avro}"
WORKLOADS="${BENCH_WORKLOADS:-S}"  # the full comparison: S,S-zipf,D,W (~3 h)
ZIPF_KEYS="${BENCH_ZIPF_KEYS:-100000}"
WORK="${BENCH_WORK:-/var/tmp/streamstate-bench}"
export KAFKA_PORT="${KAFKA_PORT:-19792}" KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-19793}"
export STREAMSTATE_KAFKA_HOME="${STREAMSTATE_KAFKA_HOME:-$WORK/kafka}"
export STREAMSTATE_REGISTRY_PORT="${STREAMSTATE_REGISTRY_PORT:-19083}"
export STREAMSTATE_REGISTRY_MGMT_PORT="${STREAMSTATE_REGISTRY_MGMT_PORT:-19084}"
export STREAMSTATE_REGISTRY_HOME="${STREAMSTATE_REGISTRY_HOME:-$WORK/registry}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
TARGET="$CARGO_TARGET_DIR"
BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
log() { printf 'bench/run.sh: %s\n' "$*" >&2; }

(( $(nproc) >= 2 )) || { log "needs 2 CPUs (broker and contender pinned apart)"; exit 2; }
command -v taskset >/dev/null || { apt-get update -qq && apt-get install -y -qq util-linux >/dev/null; }
mkdir -p "$WORK"

if [[ "${BENCH_BUILD:-1}" != 0 ]]; then
    log "building (release)"
    features=()
    [[ -n "${BENCH_CARGO_FEATURES:-}" ]] && features=(--features "$BENCH_CARGO_FEATURES")
    (cd "$ROOT" && cargo build --release "${features[@]}" -p streamstate -p streamstate-bench-generator \
        --bin streamstate --bin bench-generator --bin bench-latency >&2)
fi
for bin in streamstate bench-generator bench-latency; do
    [[ -x "$TARGET/release/$bin" ]] || { log "$TARGET/release/$bin missing (BENCH_BUILD=0 needs it built)"; exit 2; }
done

log "python venv (confluent-kafka, matplotlib)"
VENV="$WORK/venv"
if ! "$VENV/bin/python" -c "import confluent_kafka, matplotlib" 2>/dev/null; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --disable-pip-version-check --quiet confluent-kafka==2.11.1 matplotlib >&2
fi

extra=()
if [[ ",$CONTENDERS," == *",KS,"* ]]; then
    if jar="$("$ROOT/bench/kstreams/build.sh" 2>&2 | tail -n1)" && [[ -f "$jar" ]]; then
        extra+=(--kstreams-jar "$jar")
    else
        log "Kafka Streams contender could not be built: skipped"
    fi
fi
if [[ ",$CONTENDERS," == *",F,"* ]]; then
    if fcp="$("$ROOT/bench/flink/build.sh" 2>&2 | tail -n1)" && [[ -n "$fcp" ]]; then
        extra+=(--flink-classpath "$fcp")
    else
        log "Apache Flink contender could not be built: skipped"
    fi
fi
if [[ ",$CONTENDERS," == *",S-EO-console,"* ]]; then
    # Debian's Chromium driven by the console test's playwright-core (web/node_modules).
    if ! command -v chromium >/dev/null; then
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null || true
    fi
    if [[ ! -d "$ROOT/web/node_modules/playwright-core" ]]; then
        (cd "$ROOT/web" && npm ci --no-audit --no-fund --cache /var/tmp/streamstate-npm-cache >&2) || true
    fi
    if command -v chromium >/dev/null && [[ -d "$ROOT/web/node_modules/playwright-core" ]]; then
        extra+=(--console-script "$ROOT/integration-tests/console/hold-open.mjs")
    else
        log "Chromium or playwright-core missing: S-EO-console skipped"
    fi
fi
if [[ ",$CONTENDERS," == *",Q,"* ]]; then
    if qpy="$("$ROOT/bench/quix/setup.sh" "$WORK/quix-venv" 2>&2 | tail -n1)" && [[ -x "$qpy" ]]; then
        extra+=(--quix-python "$qpy")
    else
        log "Quix Streams contender could not be set up: skipped"
    fi
fi

started_broker=0
if ! "$ROOT/integration-tests/kafka/kafka.sh" status >/dev/null 2>&1; then
    log "starting the broker on $BOOTSTRAP, pinned to CPU 0"
    taskset -c 0 "$ROOT/integration-tests/kafka/kafka.sh" start
    started_broker=1
fi
broker_pid="$("$ROOT/integration-tests/kafka/kafka.sh" status | grep -oE 'pid [0-9]+' | cut -d' ' -f2)"
taskset -a -p -c 0 "$broker_pid" >/dev/null
# A broker this script started is stopped and its data deleted (a full run writes tens of
# GB of topics); one that was already running is left as it was. The same for the
# registry (in memory: stopping it forgets the schema).
started_registry=0
REGISTRY="$ROOT/integration-tests/registry/apicurio.sh"
stop_broker() {
    if (( started_broker )); then
        "$ROOT/integration-tests/kafka/kafka.sh" stop || true
        "$ROOT/integration-tests/kafka/kafka.sh" reset || true
    fi
    if (( started_registry )); then
        "$REGISTRY" stop || "$REGISTRY" kill || true
    fi
}
trap stop_broker EXIT

# AVRO (J-avro, S-EO-avro): a Schema Registry for the Avro twin's schema, only then.
avro=()
if [[ ",$WORKLOADS," == *",AVRO,"* && ( ",$CONTENDERS," == *",J-avro,"* || ",$CONTENDERS," == *",S-EO-avro,"* ) ]]; then
    if ! "$REGISTRY" status >/dev/null 2>&1; then
        log "starting the schema registry (Apicurio, for the AVRO workload) on port $STREAMSTATE_REGISTRY_PORT"
        # The integration tests' download, when there is one, instead of a second one
        # (apicurio.sh checks its SHA-1 either way).
        tarball=apicurio-registry-app-3.3.3-all.tar.gz
        if [[ ! -f "$STREAMSTATE_REGISTRY_HOME/$tarball" && -f "/var/tmp/streamstate-registry/$tarball" ]]; then
            mkdir -p "$STREAMSTATE_REGISTRY_HOME"
            ln "/var/tmp/streamstate-registry/$tarball" "$STREAMSTATE_REGISTRY_HOME/$tarball" 2>/dev/null \
                || cp "/var/tmp/streamstate-registry/$tarball" "$STREAMSTATE_REGISTRY_HOME/$tarball"
        fi
        started_registry=1
        taskset -c 0 "$REGISTRY" start
    fi
    REGISTRY_URL="$("$REGISTRY" url)"
fi

run_id="$(date -u +%Y%m%d%H%M%S)"
INPUT="bench-in-$DIST-$KEYS-$EVENTS-$SEED-$run_id"
RULES_TOPIC="bench-rules-$run_id"
twin=()
if [[ -n "${REGISTRY_URL:-}" ]]; then
    # The same events in Avro to $INPUT-avro, each after its JSON record (same key, so the
    # same partition and offset); the generator registers its schema under $INPUT-avro-value.
    twin=(--avro-topic "$INPUT-avro" --schema-registry "$REGISTRY_URL")
    avro=(--avro-input "$INPUT-avro" --schema-registry "$REGISTRY_URL")
    log "generating $EVENTS events into $INPUT and, in Avro, $INPUT-avro"
else
    log "generating $EVENTS events into $INPUT"
fi
summary="$("$TARGET/release/bench-generator" --bootstrap "$BOOTSTRAP" --topic "$INPUT" --partitions 4 \
    --events "$EVENTS" --keys "$KEYS" --dist "$DIST" --seed "$SEED" \
    --rules "$ROOT/bench/rules.json" --control-topic "$RULES_TOPIC" "${twin[@]}" | tail -n1)"
log "input: $summary"
# S-EO-grouped's rules (S with one group_by rule), and D's, W's and SEQ's: each on its
# own control topic, published like rules.json.
if [[ ",$CONTENDERS," == *",S-EO-grouped,"* && ",$WORKLOADS," == *",S,"* ]]; then
    "$TARGET/release/bench-generator" --bootstrap "$BOOTSTRAP" --topic "$INPUT" --partitions 4 --events 0 \
        --rules "$ROOT/bench/rules-grouped.json" --control-topic "$RULES_TOPIC-grouped" >/dev/null
    extra+=(--rules-topic-grouped "$RULES_TOPIC-grouped")
fi
for w in D W SEQ; do
    if [[ ",$WORKLOADS," == *",$w,"* ]]; then
        lc="$(tr 'A-Z' 'a-z' <<<"$w")"
        "$TARGET/release/bench-generator" --bootstrap "$BOOTSTRAP" --topic "$INPUT" --partitions 4 --events 0 \
            --rules "$ROOT/bench/rules-$lc.json" --control-topic "$RULES_TOPIC-$lc" >/dev/null
        extra+=(--rules-topic-"$lc" "$RULES_TOPIC-$lc")
    fi
done
if [[ ",$WORKLOADS," == *",S-zipf,"* ]]; then
    ZIPF_TOPIC="bench-in-zipf-$ZIPF_KEYS-$EVENTS-$SEED-$run_id"
    log "generating $EVENTS events over $ZIPF_KEYS Zipf(1.0) keys into $ZIPF_TOPIC (S-zipf)"
    zsummary="$("$TARGET/release/bench-generator" --bootstrap "$BOOTSTRAP" --topic "$ZIPF_TOPIC" --partitions 4 \
        --events "$EVENTS" --keys "$ZIPF_KEYS" --dist zipf --seed "$SEED" | tail -n1)"
    extra+=(--zipf-input "$ZIPF_TOPIC" --zipf-summary "$zsummary")
fi
[[ -n "${BENCH_MERGE:-}" ]] && extra+=(--merge "$BENCH_MERGE")
[[ -n "${BENCH_REFERENCE-$ROOT/BENCHMARKS.json}" ]] && extra+=(--reference "${BENCH_REFERENCE-$ROOT/BENCHMARKS.json}")
sweep=()
if [[ -n "${BENCH_STATE_SWEEP_MB-100,1000}" && ",$CONTENDERS," == *",S-EO,"* && ",$WORKLOADS," == *",S,"* ]]; then
    SWEEP_TOPIC="bench-sweep-$run_id"
    log "generating ${BENCH_SWEEP_EVENTS:-20000000} events over ${BENCH_SWEEP_KEYS:-100000000} keys into $SWEEP_TOPIC (state sweep)"
    "$TARGET/release/bench-generator" --bootstrap "$BOOTSTRAP" --topic "$SWEEP_TOPIC" --partitions 4 \
        --events "${BENCH_SWEEP_EVENTS:-20000000}" --keys "${BENCH_SWEEP_KEYS:-100000000}" --dist uniform \
        --seed "$SEED" | tail -n1 >&2
    sweep=(--sweep-input "$SWEEP_TOPIC" --sweep-keys "${BENCH_SWEEP_KEYS:-100000000}")
fi

"$VENV/bin/python" "$ROOT/bench/bench.py" --bootstrap "$BOOTSTRAP" --input "$INPUT" \
    --rules-topic "$RULES_TOPIC" --streamstate "$TARGET/release/streamstate" \
    --contenders "$CONTENDERS" --workloads "$WORKLOADS" --repeats "$REPEATS" --interval "$INTERVAL" \
    --work "$WORK/runs/$run_id" --generator-summary "$summary" --label "${BENCH_LABEL:-}" \
    --generator "$TARGET/release/bench-generator" --latency "$TARGET/release/bench-latency" \
    --keys "$KEYS" --dist "$DIST" --admin-port "${BENCH_ADMIN_PORT:-19464}" \
    --flink-rest-port "${BENCH_FLINK_REST_PORT:-19481}" --loads "${BENCH_LOADS-0.5,0.8}" --latency-secs "${BENCH_LATENCY_SECS:-30}" \
    ${BENCH_LATENCY_INPUT:+--latency-input} ${BENCH_BASE_BIN:+--base-streamstate "$BENCH_BASE_BIN"} \
    --state-sweep-mb "${BENCH_STATE_SWEEP_MB-100,1000}" --short-interval "${BENCH_SHORT_INTERVAL-200ms}" \
    --report "${BENCH_REPORT:-$ROOT/BENCHMARKS.md}" --plot "${BENCH_PLOT:-$ROOT/bench/benchmarks.png}" \
    "${extra[@]}" "${sweep[@]}" "${avro[@]}"
