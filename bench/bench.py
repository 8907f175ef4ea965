#!/usr/bin/env python3
"""Runs the benchmark contenders on one broker and writes BENCHMARKS.md and a plot.

Called by bench/run.sh (which builds, starts the broker and fills the inputs); see
bench/README.md. Workloads: S (bench/rules.json) on the main input, S-zipf (the same on
the Zipf input), D (dedup, bench/rules-d.json), W (tumbling event-time windows,
bench/rules-w.json), SEQ (one sequence rule, bench/rules-seq.json, in processing and
in event time) and AVRO (J and S-EO beside J-avro and S-EO-avro, which read the main
input's Avro twin) on the main input. Within a workload every contender reads the same
input topic from offset 0 into its own output topic, pinned to its own CPU; the order is
A-B-C-A-B-C per repeat. A contender is done when its consumer group's committed offsets
reach the input's end offsets (its output is then committed too, in the same transaction
for streamstate, Kafka Streams and Quix; Flink commits its source offsets and its sink's
transaction on the same completed checkpoint, so its run goes on a few seconds unmeasured
before it is stopped, as do W runs, whose last windows close on the last events).

Figures per run: events/s and events per CPU-second of the contender process
(utime+stime from /proc/<pid>/stat, all threads), both over the window from the first
committed progress to the end, so process start-up (JVM, restore) is not counted;
streamstate's checkpoint durations from its /metrics; the checker's verdict.
"""

import argparse
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import machine

HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def cpu_seconds(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_ticks(cpu):
    """(busy, total) jiffies of one CPU so far (busy: all but idle and iowait); None when
    `cpu` is not one CPU's number (a taskset list)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                return sum(v) - v[3] - v[4], sum(v)
    return None


def children_cpu_s():
    """CPU seconds of this process's children that have been waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# Output topics stamp records with the broker's append time. Windows (W) are emitted with
# their event time as the record timestamp by Flink, Kafka Streams and Quix, and the
# input's event times are from 2023: with CreateTime the broker's 7-day retention deleted
# the oldest output segments during a run (the first window's records vanished from a
# Flink W run before the checker read them).
OUTPUT_TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}

# The latency reader ends an output burst (one commit's epoch, drained) at a gap this long
# without records: below every checkpoint interval the runs use.
BURST_GAP_MS = 50


def ensure_topic(bootstrap, topic, partitions, config=None):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for _, fut in admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})]).items():
        try:
            fut.result(30)
        except Exception as e:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic} did not get {partitions} partitions")


def drop_topics(bootstrap, app):
    """Deletes every topic of one run: its output and dead-letter topics, a latency run's
    input, and the changelog and repartition topics Kafka Streams and Quix name after their
    application id (`app` is unique per run). A full run writes tens of GB of topics; kept,
    they filled the disk quota during a run's state sweep. Best effort: a failure is
    logged, the run's figures stand."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        names = [t for t in admin.list_topics(timeout=30).topics if app in t]
        for topic, fut in (admin.delete_topics(names, operation_timeout=30).items() if names else ()):
            try:
                fut.result(60)
            except Exception as e:  # noqa: BLE001 - one undeleted topic only costs disk
                log(f"could not delete topic {topic}: {e}")
    except Exception as e:  # noqa: BLE001
        log(f"could not list the topics of {app}: {e}")


class Progress:
    """Committed offsets of a group on the input topic, summed."""

    def __init__(self, bootstrap, group, topic, partitions):
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                           "enable.auto.commit": False})
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]

    def committed(self):
        try:
            got = self.c.committed(self.tps, timeout=5)
        except Exception:  # noqa: BLE001 - the coordinator may still be loading
            return 0
        return sum(max(tp.offset, 0) for tp in got)

    def close(self):
        self.c.close()


def input_end(bootstrap, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                   for p in range(partitions))
    finally:
        c.close()


def streamstate_config(a, run_dir, app, input_topic, output, function, interval, guarantee="exactly_once",
                       rules_topic=None, event_time=False, avro=False, backend="rocksdb"):
    admin_port = a.admin_port
    rules_topic = rules_topic or a.rules_topic
    # W, S-EO-seq-et: event time from the event's `ts`, watermark = slowest partition's
    # newest - 2 s.
    time_cfg = 'timestamp = "/ts"\nmax_out_of_orderness = "2s"' if event_time else ""
    # J-avro, S-EO-avro: Avro input (Confluent wire format), schemas from the registry.
    format_cfg = 'format = "avro"' if avro else ""
    registry_cfg = f'[schema_registry]\nurls = ["{a.schema_registry}"]\n\n' if avro else ""
    body = f'''[kafka]
bootstrap_servers = "{a.bootstrap}"
app_id = "{app}"
input_topics = ["{input_topic}"]
output_topic = "{output}"
dead_letter_topic = "{output}-dlq"
{'control_topic = "' + rules_topic + '"' if function == "rules" else ""}
transaction_timeout = "60s"

[job]
key = "/user_id"
function = "{function}"
guarantee = "{guarantee}"
{time_cfg}
{format_cfg}

{registry_cfg}[state]
backend = "{backend}"
dir = "{run_dir}/state"

[checkpoint]
interval = "{interval}"
storage = "file://{run_dir}/checkpoints"

[admin]
listen = "127.0.0.1:{admin_port}"
'''
    path = run_dir / "streamstate.toml"
    path.write_text(body)
    return path


# Workload -> (output contract of check.py, contenders that can express it). S-zipf is S
# on the Zipf input; P and J (no state) only run beside S. S-EO-grouped is S-EO with one
# `group_by` rule in place of the four filtered sums (bench/rules-grouped.json, the same
# outputs); S-EO-console is S-EO with the web console open in headless Chromium. SEQ is
# one sequence rule (bench/rules-seq.json) in processing time (S-EO-seq) and in event
# time (S-EO-seq-et, as W's `ts` and 2 s): what event-time sequence matching costs. AVRO
# is J and S-EO beside J-avro and S-EO-avro, the same jobs on the main input's Avro twin
# (`format = "avro"`, the same events at the same offsets): what decoding Avro costs.
WORKLOADS = {
    "S": ("workload", ("P", "J", "S-EO", "S-EO-base", "S-ALO", "S-EO-10s", "S-EO-heap", "S-EO-grouped", "S-EO-console",
                       "KS", "Q", "F")),
    "S-zipf": ("workload", ("S-EO", "KS", "Q", "F")),
    "D": ("dedup", ("S-EO", "KS", "Q", "F")),
    "W": ("window", ("S-EO", "KS", "Q", "F")),
    "SEQ": ("sequence", ("S-EO-seq", "S-EO-seq-et")),
    "AVRO": ("workload", ("J", "J-avro", "S-EO", "S-EO-avro")),
}

# Contenders that read the Avro twin of their workload's input (a.avro_input); check.py
# builds their model from the JSON topic (--events-from).
AVRO_CONTENDERS = ("J-avro", "S-EO-avro")

# Flink 2 on Java 17 needs these packages open (Flink's own launch scripts pass the same
# through env.java.opts.all); without them Kryo and the memory manager fail reflectively.
FLINK_JVM_OPENS = [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
    "java.lang", "java.lang.reflect", "java.io", "java.net", "java.nio", "sun.nio.ch", "java.text",
    "java.time", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
    "java.util.concurrent.locks")] + ["--add-exports=java.base/sun.net.util=ALL-UNNAMED"]


def contenders(a, workload="S", interval=None):
    """name -> (contract, at_least_once, launcher) for one workload. A launcher returns
    (argv, env). `interval`: streamstate's checkpoint interval in place of --interval."""
    contract = WORKLOADS[workload][0]
    # S-zipf and AVRO run the S job.
    code = "SEQ" if workload == "SEQ" else "S" if workload == "AVRO" else workload[0]
    rules_topic = {"S": a.rules_topic, "D": a.rules_topic_d, "W": a.rules_topic_w,
                   "SEQ": a.rules_topic_seq}[code]
    rules_topic_grouped = a.rules_topic_grouped if code == "S" else None
    interval_ms = str(int(parse_secs(a.interval) * 1000))

    def ss(function, interval, guarantee="exactly_once", rules=None, event_time=code == "W", avro=False,
           backend="rocksdb", binary=None):
        def launch(run_dir, app, input_topic, output):
            cfg = streamstate_config(a, run_dir, app, input_topic, output, function, interval, guarantee,
                                     rules_topic=rules or rules_topic, event_time=event_time, avro=avro,
                                     backend=backend)
            # One INFO line per checkpoint (its phases), so every run's log can say where
            # its checkpoints' time went.
            return [binary or a.streamstate, "run", "--config", str(cfg)], {"RUST_LOG": "warn,streamstate::job=info"}
        return launch

    table = {}
    if code == "S":
        table.update({
            "P": ("passthrough", False, ss("passthrough", a.interval)),
            "J": ("json", False, ss("json", a.interval)),
            "S-EO-10s": ("workload", False, ss("rules", "10s")),
            "S-ALO": ("workload", True, ss("rules", a.interval, "at_least_once")),
        })
        if rules_topic:
            # S-EO on the `hashmap` backend: state on the heap, full snapshots.
            table["S-EO-heap"] = ("workload", False, ss("rules", a.interval, backend="hashmap"))
        if a.avro_input and a.schema_registry:
            table["J-avro"] = ("json", False, ss("json", a.interval, avro=True))
            if rules_topic:
                table["S-EO-avro"] = ("workload", False, ss("rules", a.interval, avro=True))
    if code == "SEQ" and rules_topic:
        # check.py's `sequence` and `sequence-et` contracts (event time: late events in the
        # dead-letter topic).
        table.update({
            "S-EO-seq": (contract, False, ss("rules", a.interval)),
            "S-EO-seq-et": (contract + "-et", False, ss("rules", a.interval, event_time=True)),
        })
    elif rules_topic:
        table["S-EO"] = (contract, False, ss("rules", interval or a.interval))
        if code == "S" and a.console_script:
            table["S-EO-console"] = (contract, False, ss("rules", a.interval))
        if code == "S" and a.base_streamstate:
            # An A/B of a change: S-EO on another build, interleaved with this one's runs.
            table["S-EO-base"] = (contract, False, ss("rules", a.interval, binary=a.base_streamstate))
    if rules_topic_grouped:
        table["S-EO-grouped"] = (contract, False, ss("rules", a.interval, rules=rules_topic_grouped))
    if a.kstreams_jar:
        def ks(run_dir, app, input_topic, output):
            return (["java", "-Xmx1g", "-jar", a.kstreams_jar, a.bootstrap, app, input_topic, output,
                     str(run_dir / "state"), interval_ms, code], {})
        table["KS"] = (contract, False, ks)
    if a.quix_python:
        def quix(run_dir, app, input_topic, output):
            return ([a.quix_python, str(HERE / "quix" / "app.py"), a.bootstrap, app, input_topic, output,
                     str(run_dir / "state"), str(parse_secs(a.interval)), code], {})
        table["Q"] = (contract, False, quix)
    if a.flink_classpath:
        def flink(run_dir, app, input_topic, output):
            return (["java", "-Xmx1g", *FLINK_JVM_OPENS, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                     # a WARN per checkpoint about a metric name the sink registers twice
                     "-Dorg.slf4j.simpleLogger.log.org.apache.flink.metrics.MetricGroup=error",
                     "-cp", a.flink_classpath, "streamstate.bench.flink.Workload", code, a.bootstrap, app,
                     input_topic, output, str(run_dir), interval_ms, str(a.flink_rest_port)], {})
        table["F"] = (contract, False, flink)
    allowed = WORKLOADS[workload][1]
    return {n: spec for n, spec in table.items() if n in allowed}


def parse_secs(s):
    return float(s[:-2]) / 1000 if s.endswith("ms") else float(s.rstrip("s"))


def scrape(port):
    """Every sample of streamstate's /metrics: name{labels} -> value."""
    import urllib.request
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def histogram_quantile(samples, name, q):
    """Upper bound of the bucket holding quantile q (Prometheus cumulative buckets)."""
    buckets = sorted((float(k.split('le="')[1].split('"')[0]), v) for k, v in samples.items()
                     if k.startswith(name + "_bucket"))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    return next(le for le, c in buckets if c >= q * total)


CHECKPOINT_LINE = re.compile(r"checkpoint completed .*?bytes=(\d+) bytes_written=(\d+) ms=(\d+)"
                             r"(?: pause_ms=(\d+))?(?: snapshot_ms=(\d+))?(?: flush_ms=(\d+))?"
                             r"(?: upload_ms=(\d+) commit_ms=(\d+))?(?: materialize_ms=(\d+))?")


def logged_checkpoints(path):
    """(bytes, bytes_written, ms, pause_ms, snapshot_ms, flush_ms, upload_ms, commit_ms,
    materialize_ms) of
    every checkpoint a streamstate log reports (INFO). The job-thread pause is `pause_ms`
    (state snapshot + producer flush; upload and commit run on the committer thread);
    builds that logged no `pause_ms` were synchronous, their pause being `ms`."""
    out = []
    with open(path, errors="replace") as f:
        for m in map(CHECKPOINT_LINE.search, f):
            if m:
                c = [None if x is None else int(x) for x in m.groups()]
                if c[3] is None:
                    c[3] = c[2]
                out.append(tuple(c))
    return out


def exact_quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def state_sweep(checkpoints, sizes_mb):
    """Checkpoint figures per state size: the checkpoints whose total size was within
    ±25% of each size: job-thread pause and end-to-end duration, and the phases."""
    out = []
    for mb in sizes_mb:
        band = [c for c in checkpoints if 0.75 * mb * 1e6 <= c[0] <= 1.25 * mb * 1e6]
        row = {"state_mb": mb, "checkpoints": len(band)}
        if band:
            ms, pause = [c[2] for c in band], [c[3] for c in band]
            row.update({"p50_ms": exact_quantile(pause, 0.5), "p99_ms": exact_quantile(pause, 0.99),
                        "max_ms": max(pause), "duration_p50_ms": exact_quantile(ms, 0.5),
                        "duration_p99_ms": exact_quantile(ms, 0.99),
                        "median_bytes": statistics.median(c[0] for c in band),
                        "median_incremental_bytes": statistics.median(c[1] for c in band)})
            for i, phase in ((4, "snapshot"), (5, "flush"), (6, "upload"), (7, "commit")):
                row[f"{phase}_p50_ms"] = exact_quantile([c[i] for c in band if c[i] is not None], 0.5)
        out.append(row)
    return out


def run_recovery(a, spec):
    """S-EO on the sweep input (the main one without it) until its checkpoints reach the
    largest size of the state sweep (or half the input without a sweep; at most 90% of
    it, so there is something to catch up), SIGKILL, restart, and time the reopen
    (restore) and the catch-up. Every checkpoint's size and duration come from the
    contender's INFO log."""
    _, _, launch = spec
    input_topic = a.sweep_input or a.input
    keys = a.sweep_keys or a.keys
    total = input_end(a.bootstrap, input_topic, a.partitions)
    tag = f"recovery-{uuid.uuid4().hex[:6]}"
    app, output = f"bench-{tag}", f"bench-{tag}-out"
    run_dir = Path(a.work) / tag
    run_dir.mkdir(parents=True)
    # Nothing reads this output (the figures are timings), and 20M events write about
    # 15 GB of it (three outputs per event): the broker may drop old segments as it goes.
    ensure_topic(a.bootstrap, output, a.partitions,
                 {**OUTPUT_TOPIC_CONFIG, "retention.bytes": str(512 << 20), "segment.bytes": str(128 << 20)})
    ensure_topic(a.bootstrap, output + "-dlq", 1)
    progress = Progress(a.bootstrap, app, input_topic, a.partitions)
    result = {}
    info = {"RUST_LOG": "warn,streamstate::job=info"}
    kill_bytes = max(a.state_sweep_mb) * 1e6 if a.state_sweep_mb else None
    proc, logf = start(a, "S-EO", launch, run_dir, app, input_topic, output, info, "contender-before-kill.log")
    def kill_due():
        done = progress.committed()
        if kill_bytes is None:
            return done >= total // 2
        return done >= 0.9 * total or scrape(a.admin_port).get("streamstate_last_checkpoint_size_bytes", 0) >= kill_bytes

    try:
        wait_for(a, proc, "S-EO before the kill", kill_due)
        before = scrape(a.admin_port)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        logf.close()
        killed_at = progress.committed()
        state_bytes = sum(f.stat().st_size for f in (run_dir / "state").rglob("*") if f.is_file())
        checkpoints = logged_checkpoints(run_dir / "contender-before-kill.log")
        restarted = time.monotonic()
        proc, logf = start(a, "S-EO", launch, run_dir, app, input_topic, output, info, "contender-after-kill.log")
        wait_committed(a, proc, progress, killed_at + 1, "S-EO first commit after restart")
        first_commit = time.monotonic() - restarted
        wait_committed(a, proc, progress, total, "S-EO catch-up")
        caught_up = time.monotonic() - restarted
        after = scrape(a.admin_port)
        ms, pause = [c[2] for c in checkpoints], [c[3] for c in checkpoints]
        # Distinct keys among the events processed (uniform keys; Zipf: unknown).
        uniform = a.sweep_input is not None or a.dist == "uniform"  # run.sh's sweep input is uniform
        seen = keys * (1 - math.exp(-killed_at / keys)) if uniform else None
        entries = before.get("streamstate_state_keys")
        result = {
            "input": input_topic, "input_events": total, "keys": keys,
            "killed_at_events": killed_at,
            "local_state_bytes_at_kill": state_bytes,
            "restore_s": after.get("streamstate_restore_duration_seconds_sum"),
            "restore_bytes": after.get("streamstate_restore_size_bytes"),
            "first_commit_after_restart_s": first_commit,
            "catch_up_s": caught_up,
            "checkpoint_p50_ms": exact_quantile(ms, 0.5),
            "checkpoint_p99_ms": exact_quantile(ms, 0.99),
            "checkpoint_max_ms": max(ms) if ms else None,
            "pause_p50_ms": exact_quantile(pause, 0.5),
            "pause_p99_ms": exact_quantile(pause, 0.99),
            "pause_max_ms": max(pause) if pause else None,
            "checkpoints_before_kill": len(checkpoints),
            "last_checkpoint_bytes": before.get("streamstate_last_checkpoint_size_bytes"),
            "last_checkpoint_incremental_bytes": before.get("streamstate_last_checkpoint_incremental_size_bytes"),
            "state_size_bytes_metric": before.get("streamstate_state_size_bytes"),
            "keys_seen": seen,
            "disk_bytes_per_key": state_bytes / seen if seen else None,
            "state_entries": entries,
            "disk_bytes_per_entry": state_bytes / entries if entries else None,
            "disk_bytes_per_event": state_bytes / killed_at if killed_at else None,
            "sweep": state_sweep(checkpoints, a.state_sweep_mb),
        }
    except (RuntimeError, TimeoutError) as e:
        result["error"] = str(e)
    finally:
        progress.close()
        stop(proc, logf)
        drop_state(run_dir)
        drop_topics(a.bootstrap, app)
    log(json.dumps(result))
    return result


def flink_checkpoints(port):
    """Checkpoint figures of the (one) job of a Flink MiniCluster, from its REST API:
    completed count, end-to-end duration avg/p50/p99/max (ms), the mean and largest
    checkpointed size (what each checkpoint wrote: the incremental part, bytes) and the
    largest full state size. {} when unreachable."""
    import urllib.request

    def get(path):
        return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read())
    try:
        jobs = get("/jobs/overview")["jobs"]
        running = [j for j in jobs if j.get("state") == "RUNNING"] or jobs
        ck = get(f"/jobs/{running[0]['jid']}/checkpoints")
    except (OSError, ValueError, KeyError, IndexError):
        return {}
    summary = ck.get("summary", {})
    d = summary.get("end_to_end_duration", {})
    written, size = summary.get("checkpointed_size", {}), summary.get("state_size", {})
    return {"flink_checkpoints_completed": ck.get("counts", {}).get("completed"),
            "flink_checkpoint_avg_ms": d.get("avg"), "flink_checkpoint_p50_ms": d.get("p50"),
            "flink_checkpoint_p99_ms": d.get("p99"), "flink_checkpoint_max_ms": d.get("max"),
            "flink_checkpointed_size_avg_bytes": written.get("avg"),
            "flink_checkpointed_size_max_bytes": written.get("max"),
            "flink_state_size_max_bytes": size.get("max")}


def run_one(a, name, spec, repeat, total, workload="S", input_topic=None, events_from=None):
    """`events_from`: the JSON topic whose events `input_topic` holds in another encoding
    (the Avro contenders): check.py builds its model from it."""
    contract, alo, launch = spec
    input_topic = input_topic or a.input
    tag = f"{workload.lower()}-{name.lower()}-{repeat}-{uuid.uuid4().hex[:6]}"
    app, output = f"bench-{tag}", f"bench-{tag}-out"
    run_dir = Path(a.work) / tag
    run_dir.mkdir(parents=True)
    ensure_topic(a.bootstrap, output, a.partitions, OUTPUT_TOPIC_CONFIG)
    ensure_topic(a.bootstrap, output + "-dlq", 1)
    argv, env = launch(run_dir, app, input_topic, output)
    argv = ["taskset", "-c", a.contender_cpu] + argv
    logf = open(run_dir / "contender.log", "w")
    progress = Progress(a.bootstrap, app, input_topic, a.partitions)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **env},
                            start_new_session=True)
    first = None  # (t, committed, cpu) at the first committed progress
    result = {"workload": workload, "contender": name, "repeat": repeat, "ok": False}
    metrics = {}
    console = None
    try:
        deadline = started + a.timeout
        if name == "S-EO-console":
            console = open_console(a, proc, run_dir, deadline)
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {run_dir}/contender.log")
            if console is not None and console[0].poll() is not None:
                raise RuntimeError(f"the console's browser exited with {console[0].returncode}; see {run_dir}/console.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not finish within {a.timeout}s")
            done = progress.committed()
            now, cpu = time.monotonic(), cpu_seconds(proc.pid)
            if first is None and done > 0:
                first = (now, done, cpu)
            if done >= total:
                break
            time.sleep(0.1)
        if first[1] >= total:
            # The whole input committed at the first observation (a tiny input): the
            # window is the whole run, start-up included.
            first = (started, 0, 0.0)
        if name.startswith(("P", "J", "S")):
            samples = scrape(a.admin_port)
            metrics = {k: samples.get(k) for k in (
                "streamstate_checkpoint_duration_seconds_sum", "streamstate_checkpoint_duration_seconds_count",
                "streamstate_last_checkpoint_size_bytes", "streamstate_state_size_bytes")}
            metrics["checkpoint_p99_s"] = histogram_quantile(samples, "streamstate_checkpoint_duration_seconds", 0.99)
        if name == "F":
            metrics = flink_checkpoints(a.flink_rest_port)
        events = total - first[1]
        secs, cpu_used = now - first[0], cpu - first[2]
        result.update({
            "wall_s": now - started, "window_events": events, "window_s": secs, "cpu_s": cpu_used,
            "events_per_s": events / secs if secs > 0 else None,
            "events_per_cpu_s": events / cpu_used if cpu_used > 0 else None,
            "checkpoints": metrics,
        })
        # Not measured: W's last windows (and S-EO-seq-et's last matches) close on the
        # last events and Flink commits its sink's transaction beside (not with) its
        # source offsets, so they get a few more checkpoints before the stop, for the
        # checker to see every output committed.
        if workload == "W" or name == "F" or contract == "sequence-et":
            linger_until = time.monotonic() + 3 * parse_secs(a.interval) + 2
            while time.monotonic() < linger_until:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {run_dir}/contender.log")
                time.sleep(0.2)
    except (RuntimeError, TimeoutError) as e:
        result["error"] = str(e)
        log(result["error"])
    finally:
        progress.close()
        if console is not None:
            result["console"] = close_console(console, run_dir)
        stop(proc, logf)
        drop_state(run_dir)
    if "error" not in result:
        dlq = ["--dead-letter", output + "-dlq"] if contract.startswith("sequence") else []
        check = subprocess.run([sys.executable, str(HERE / "check.py"), "--bootstrap", a.bootstrap,
                                "--input", input_topic, "--output", output, "--contract", contract]
                               + (["--at-least-once"] if alo else []) + dlq
                               + (["--events-from", events_from] if events_from else []),
                               capture_output=True, text=True)
        try:
            result["check"] = json.loads(check.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            result["check"] = {"ok": False, "error": check.stderr[-500:]}
        result["ok"] = bool(result["check"].get("ok"))
    if result["ok"]:
        drop_topics(a.bootstrap, app)  # a failed run's output stays, to be looked at
    log(json.dumps({k: v for k, v in result.items() if k != "checkpoints"}))
    return result


def open_console(a, proc, run_dir, deadline):
    """Headless Chromium (on the broker's CPU) with the console's Overview open on the
    contender's admin port, polling as a person's tab does; returns once the page loaded,
    before the run's measured window begins (its first committed progress comes after)."""
    url = f"http://127.0.0.1:{a.admin_port}"
    while not scrape(a.admin_port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the contender's admin port never answered")
        time.sleep(0.05)
    out = open(run_dir / "console.log", "w+")
    browser = subprocess.Popen(["taskset", "-c", a.broker_cpu, "node", a.console_script, url, str(a.timeout)],
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    while "console open" not in (run_dir / "console.log").read_text():
        if browser.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the console did not open; see {run_dir}/console.log")
        time.sleep(0.05)
    return browser, out


def close_console(console, run_dir):
    """Ends the browser; the number of /metrics scrapes the page made, from its last line."""
    browser, out = console
    if browser.poll() is None:
        browser.terminate()  # node closes its browser and prints the count
        try:
            browser.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(browser.pid, signal.SIGKILL)  # anything of Chromium's left over
    except ProcessLookupError:
        pass
    browser.wait()
    out.close()
    m = re.search(r"(\d+) /metrics scrapes", (run_dir / "console.log").read_text())
    return {"metrics_scrapes": int(m.group(1)) if m else None}


def start(a, name, launch, run_dir, app, input_topic, output, extra_env=None, log_name="contender.log"):
    argv, env = launch(run_dir, app, input_topic, output)
    env = {**env, **(extra_env or {})}
    logf = open(run_dir / log_name, "w")
    proc = subprocess.Popen(["taskset", "-c", a.contender_cpu] + argv, stdout=logf, stderr=subprocess.STDOUT,
                            env={**os.environ, **env}, start_new_session=True)
    return proc, logf


def stop(proc, logf):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    logf.close()


def drop_state(run_dir):
    """A run's local state and checkpoints are measured, then deleted (only the logs stay):
    a full run would otherwise fill the disk. RocksDB's own LOG is kept beside the
    contender's: its flush and compaction events, timed, explain a slow upload."""
    for i, rocks_log in enumerate(sorted((run_dir / "state").glob("**/LOG"))):
        shutil.copyfile(rocks_log, run_dir / f"rocksdb-{i}.LOG")
    for d in ("state", "checkpoints"):
        shutil.rmtree(run_dir / d, ignore_errors=True)


def wait_for(a, proc, what, ready):
    """Polls `ready()` until it holds; fails when the contender exits or `a.timeout` passes."""
    deadline = time.monotonic() + a.timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: contender exited with {proc.returncode}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done within {a.timeout}s")
        time.sleep(0.1)


def wait_committed(a, proc, progress, target, what):
    wait_for(a, proc, what, lambda: progress.committed() >= target)


def run_latency(a, name, spec, load, max_eps):
    """Open loop at `load` x the contender's own max: the generator sends at a fixed rate,
    stamping each record with its intended send time; a read_committed reader measures
    now - intended for every output that carries it (S: the dedup outputs)."""
    _, _, launch = spec
    rate = max(1, int(load * max_eps))
    tag = f"lat-{name.lower()}-{int(load * 100)}-{uuid.uuid4().hex[:6]}"
    app, input_topic, output = f"bench-{tag}", f"bench-{tag}-in", f"bench-{tag}-out"
    run_dir = Path(a.work) / tag
    run_dir.mkdir(parents=True)
    for t, n, cfg in ((input_topic, a.partitions, None), (output, a.partitions, OUTPUT_TOPIC_CONFIG),
                      (output + "-dlq", 1, None)):
        ensure_topic(a.bootstrap, t, n, cfg)
    result = {"contender": name, "load": load, "rate": rate}
    proc, logf = start(a, name, launch, run_dir, app, input_topic, output)
    progress = Progress(a.bootstrap, app, input_topic, a.partitions)
    gen = lambda *extra: subprocess.run(  # noqa: E731
        ["taskset", "-c", a.broker_cpu, a.generator, "--bootstrap", a.bootstrap, "--topic", input_topic,
         "--partitions", str(a.partitions), "--keys", str(a.keys), "--dist", a.dist, *extra],
        check=True, capture_output=True, text=True)
    reader = None
    try:
        # Priming: the contender is up and processing before the measured load starts.
        gen("--events", "1000", "--seed", "7")
        wait_committed(a, proc, progress, 1000, f"{name} priming")
        done = run_dir / "done"
        # --latency-input: the reader also times the input records, to split a miss
        # between the rig (before the contender can read) and the contender.
        reader_started = time.monotonic()
        reader = subprocess.Popen(["taskset", "-c", a.broker_cpu, a.latency, "--bootstrap", a.bootstrap,
                                   "--topic", output, "--done", str(done), "--burst-gap-ms", str(BURST_GAP_MS)]
                                  + (["--input-topic", input_topic] if a.latency_input else []),
                                  stdout=subprocess.PIPE, text=True)
        # The rig's own CPU over the load: the generator and the reader share the broker's
        # CPU, so a miss can be the rig's (bench/README.md, "The rig's own CPU").
        rig0, children0 = cpu_ticks(a.broker_cpu), children_cpu_s()
        gen("--events", str(rate * a.latency_secs), "--rate", str(rate), "--seed", "8")
        rig1, children1 = cpu_ticks(a.broker_cpu), children_cpu_s()
        wait_committed(a, proc, progress, input_end(a.bootstrap, input_topic, a.partitions), f"{name} latency")
        done.touch()
        out, _ = reader.communicate(timeout=a.timeout)
        result.update(json.loads(out.strip().splitlines()[-1]))
        reader_s = time.monotonic() - reader_started
        if rig0 and rig1 and rig1[1] > rig0[1]:
            load_s = (rig1[1] - rig0[1]) / CLK_TCK
            result.update({"broker_cpu_busy": (rig1[0] - rig0[0]) / (rig1[1] - rig0[1]),
                           "generator_cpu_share": (children1 - children0) / load_s,
                           # Over the reader's whole life: the load, the drain and its idle tail.
                           "reader_cpu_share": (children_cpu_s() - children1) / reader_s})
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError, subprocess.TimeoutExpired,
            json.JSONDecodeError, IndexError) as e:
        result["error"] = str(e)
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        progress.close()
        stop(proc, logf)
        drop_state(run_dir)
        drop_topics(a.bootstrap, app)
    # streamstate's own account of where the latency went: its checkpoints' durations.
    checkpoints = logged_checkpoints(run_dir / "contender.log")
    if checkpoints:
        result["checkpoints"] = len(checkpoints)
        for field, i in (("checkpoint", 2), ("pause", 3), ("upload", 6), ("commit", 7), ("materialize", 8)):
            values = [c[i] for c in checkpoints if c[i] is not None]
            for q, tag in ((0.5, "p50"), (0.99, "p99")):
                result[f"{field}_{tag}_ms"] = exact_quantile(values, q)
    log(json.dumps(result))
    return result


def median_spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.median(values), (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def fmt(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


def summarize(results):
    """(workload, contender) -> medians ± half ranges of one set of runs."""
    by = {}
    for r in results:
        by.setdefault((r.get("workload", "S"), r["contender"]), []).append(r)
    summary = {}
    for key, rs in by.items():
        eps, eps_sd = median_spread([r.get("events_per_s") for r in rs])
        epc, epc_sd = median_spread([r.get("events_per_cpu_s") for r in rs])
        chk = [r["checkpoints"] for r in rs if (r.get("checkpoints") or {}).get("streamstate_checkpoint_duration_seconds_count")]
        means = [c["streamstate_checkpoint_duration_seconds_sum"] / c["streamstate_checkpoint_duration_seconds_count"]
                 for c in chk]
        # Flink: the REST API's mean end-to-end checkpoint duration.
        means += [r["checkpoints"]["flink_checkpoint_avg_ms"] / 1000 for r in rs
                  if (r.get("checkpoints") or {}).get("flink_checkpoint_avg_ms") is not None]
        summary[key] = {"eps": eps, "eps_spread": eps_sd, "epc": epc, "epc_spread": epc_sd,
                        "runs": len(rs), "ok": sum(1 for r in rs if r["ok"]),
                        "checkpoint_mean_s": median_spread(means)[0]}
    return summary


def report(a, results, total, gen, latencies, recovery, parts=None, reference=None):
    """`parts`: workload -> {"generated", "commit", "input", "total", "order"} of the run each
    workload's figures come from (this one, or an earlier part merged with --merge); `reference`:
    the run `machine` compares this machine with."""
    summary = summarize(results)
    by_name = {f"{w}/{n}": v for (w, n), v in summary.items()}  # as BENCHMARKS.json keeps it
    machine_rows = machine.compare(by_name, latencies, reference) if reference else []
    for label, now, then, change, flagged in machine_rows:
        if flagged:
            log(f"machine: {label} {now:,.0f} against the reference run's {then:,.0f} ({change:+.0%})")

    def ratio(w, x, y, key):
        sx, sy = summary.get((w, x)), summary.get((w, y))
        if sx and sy and sx[key] and sy[key]:
            return sx[key] / sy[key]
        return None

    def extra_us(w, x, y, key):
        """What x spends per event more than y, in µs: 1/rate(x) − 1/rate(y) of the medians
        (`eps`: wall-clock, `epc`: CPU time)."""
        sx, sy = summary.get((w, x)), summary.get((w, y))
        if sx and sy and sx[key] and sy[key]:
            return (1 / sx[key] - 1 / sy[key]) * 1e6
        return None

    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu_model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    parts = parts or {}
    workloads = [w for w in WORKLOADS if w in parts]
    def describe(g, n):
        return (f"{n:,} records ({g.get('bytes', 0) / max(n, 1):.0f} bytes avg), {g.get('keys')} keys, "
                f"{g.get('dist')}, seed {g.get('seed')}, {g.get('duplicates')} duplicates, {a.partitions} partitions")
    lines = [
        "# Benchmarks", "",
        f"Generated by `bench/run.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit `{commit}`.",
        f"{a.label}" if a.label else "",
        "",
        f"- Machine: {cpu_model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
        f"broker pinned to CPU {a.broker_cpu}, contender to CPU {a.contender_cpu}.",
        f"- Checkpoint (Kafka Streams, Quix: commit) interval {a.interval} (S-EO-10s: 10s); {a.repeats} repeats, "
        "contenders in the order of each table per repeat; median ± half range.",
        "- Throughput and CPU are taken from the first committed progress to the last record committed "
        "(start-up not counted); CPU = utime+stime of the contender process.",
        "- Workloads: **S** (count, dedup, sum per type: `bench/rules.json`) on the main input and, as **S-zipf**, "
        "on the Zipf input; **D** (dedup of `event_id` per key, 10 min TTL, first sighting only: "
        "`bench/rules-d.json`) and **W** (per key a tumbling 10 s event-time window on `ts`, count/sum/min/max of "
        "`amount` emitted when it closes, watermark = newest event time − 2 s: `bench/rules-w.json`) on the main "
        "input; **SEQ** (one sequence rule, view → cart → purchase within 24 h per key: `bench/rules-seq.json`) "
        "on the main input, in processing time (S-EO-seq) and in event time on `ts` with W's watermark "
        "(S-EO-seq-et); **AVRO** (J and S-EO on the main input beside J-avro and S-EO-avro on its Avro twin: "
        "the same events at the same offsets, Confluent wire format). Every output is checked by "
        "`bench/check.py` against its own model (the Avro contenders' from the JSON twin).",
        "- Contenders: P, J, S-EO, S-ALO, S-EO-10s streamstate; S-EO-base (when asked for) S-EO on another build; "
        "S-EO-heap S-EO with `state.backend = \"hashmap\"`; "
        "S-EO-grouped streamstate with one `group_by` rule "
        "for the four per-type sums (`bench/rules-grouped.json`, the same outputs); S-EO-console streamstate with "
        "its web console's Overview open in headless Chromium (on the broker's CPU) for the whole measured window; "
        "S-EO-seq / S-EO-seq-et streamstate with `bench/rules-seq.json` in processing / event time; "
        "J-avro / S-EO-avro J / S-EO with `format = \"avro\"` (schemas from a local Apicurio Registry); "
        "KS Kafka Streams; Q Quix Streams; F Apache Flink "
        "(local MiniCluster, parallelism 1, RocksDB incremental checkpoints, KafkaSink exactly-once). "
        "Mean checkpoint: streamstate's metrics, Flink's REST API (end-to-end duration).",
        "",
    ]
    for w in workloads:
        p = parts[w]
        where = "" if p.get("commit") == commit else f" (from the part run on {p.get('generated')}, commit `{p.get('commit')}`)"
        g = p.get("input") or {}
        twin = (f" J-avro and S-EO-avro read its Avro twin `{g['avro_topic']}` ({g.get('avro_bytes', 0) / max(p.get('total') or 0, 1):.0f} "
                f"bytes avg, schema id {g.get('avro_schema_id')}): the same events at the same partitions and offsets."
                if w == "AVRO" and g.get("avro_topic") else "")
        lines += [f"## Workload {w}{where}", "",
                  f"Input: {describe(g, p.get('total') or 0)}.{twin}", "",
                  "| contender | events/s | events per CPU-s | checker | mean checkpoint (s) |",
                  "|---|---|---|---|---|"]
        for name in p.get("order") or WORKLOADS[w][1]:
            sm = summary.get((w, name))
            if sm is None:
                continue
            lines.append(f"| {name} | {fmt(sm['eps'])} ± {fmt(sm['eps_spread'])} | {fmt(sm['epc'])} ± {fmt(sm['epc_spread'])} "
                         f"| {sm['ok']}/{sm['runs']} ok | {fmt(sm['checkpoint_mean_s'], 3)} |")
        lines += ["", "| ratio | value | target |", "|---|---|---|"]
        if w == "S":
            eo_alo = ratio(w, "S-EO", "S-ALO", "eps")
            p99_half = next((l.get("p99_ms") for l in latencies if l["contender"] == "S-EO" and l["load"] == 0.5), None)
            lines += [f"| S-EO / P (events/s) | {fmt(ratio(w, 'S-EO', 'P', 'eps'), 2)} | ≥ 0.5 with 1M keys |",
                      f"| S-EO / J (events/s) | {fmt(ratio(w, 'S-EO', 'J', 'eps'), 2)} | ≥ 0.5 |",
                      f"| J / P (events/s) | {fmt(ratio(w, 'J', 'P', 'eps'), 2)} | |",
                      f"| EO cost = 1 − S-EO / S-ALO | {fmt(None if eo_alo is None else 1 - eo_alo, 2)} | ≤ 0.05 |",
                      f"| S-EO-grouped / S-EO (events/s): one `group_by` rule for the four sums | "
                      f"{fmt(ratio(w, 'S-EO-grouped', 'S-EO', 'eps'), 2)} | |",
                      f"| S-EO-console / S-EO (events/s): the console open | "
                      f"{fmt(ratio(w, 'S-EO-console', 'S-EO', 'eps'), 2)} | 1.00 within the spread |"]
        if w == "AVRO":
            for x, y in (("J-avro", "J"), ("S-EO-avro", "S-EO")):
                lines += [f"| {x} / {y} (events/s) | {fmt(ratio(w, x, y, 'eps'), 2)} | |",
                          f"| {x} / {y} (per CPU-s) | {fmt(ratio(w, x, y, 'epc'), 2)} | |",
                          f"| decode cost per event, Avro − JSON ({y}): 1/events/s({x}) − 1/events/s({y}) (µs) | "
                          f"{fmt(extra_us(w, x, y, 'eps'), 2)} | |",
                          f"| the same in CPU time: 1/per CPU-s({x}) − 1/per CPU-s({y}) (µs of CPU per event) | "
                          f"{fmt(extra_us(w, x, y, 'epc'), 2)} | |"]
        elif w == "SEQ":
            lines += [f"| S-EO-seq-et / S-EO-seq (events/s): the sequence rule in event time | "
                      f"{fmt(ratio(w, 'S-EO-seq-et', 'S-EO-seq', 'eps'), 2)} | |",
                      f"| S-EO-seq-et / S-EO-seq (per CPU-s) | {fmt(ratio(w, 'S-EO-seq-et', 'S-EO-seq', 'epc'), 2)} | |"]
        else:
            lines += [f"| S-EO / F (per CPU-s) | {fmt(ratio(w, 'S-EO', 'F', 'epc'), 2)} | |",
                      f"| S-EO / F (events/s) | {fmt(ratio(w, 'S-EO', 'F', 'eps'), 2)} | |",
                      f"| S-EO / KS (per CPU-s) | {fmt(ratio(w, 'S-EO', 'KS', 'epc'), 2)} | {'≥ 4' if w == 'S' else ''} |",
                      f"| S-EO / Q (per CPU-s) | {fmt(ratio(w, 'S-EO', 'Q', 'epc'), 2)} | {'≥ 10' if w == 'S' else ''} |"]
        if w == "S":
            short = f"S-EO-{a.short_interval or '200ms'}"  # the row names the target's interval when none ran
            p99_short = next((l.get("p99_ms") for l in latencies if l["contender"] == short and l["load"] == 0.5), None)
            sweep = {x["state_mb"]: x for x in (recovery or {}).get("sweep") or []}
            pause_1g = (sweep.get(1000) or {}).get("p99_ms")
            lines += [f"| S-EO p99 latency at 50% load (ms) | {fmt(p99_half)} | ≤ interval + 100 ms = "
                      f"{fmt(parse_secs(a.interval) * 1000 + 100)} |",
                      f"| {short} p99 latency at 50% load (ms) | {fmt(p99_short)} | ≤ 400 |",
                      f"| job-thread pause p99 at 1 GB (ms) | {fmt(pause_1g)} | ≤ 10 |"]
        lines += ["", "`n/a`: the contender did not run (see bench/README.md).", ""]
    lines += machine.section(machine_rows, reference)
    flink_runs = [r for r in results if r["contender"] == "F" and (r.get("checkpoints") or {}).get("flink_checkpoints_completed")]
    if flink_runs:
        lines += ["## Flink's checkpoints (REST API, end-to-end duration)", "",
                  "Flink's RocksDB checkpoints are asynchronous: only their synchronous part (memtable flush, hard links) "
                  "pauses processing, so the end-to-end duration is not a pause (streamstate's are asynchronous too: its "
                  "pause is in the state section below).", "",
                  "| workload | repeat | checkpoints | avg / p50 / p99 / max (ms) | checkpointed (incremental) avg / max "
                  "| largest state size |",
                  "|---|---|---|---|---|---|"]
        mb = lambda v: "n/a" if v is None else f"{v / 1e6:,.1f} MB"  # noqa: E731
        for r in flink_runs:
            c = r["checkpoints"]
            lines.append(f"| {r.get('workload', 'S')} | {r['repeat']} | {c['flink_checkpoints_completed']} | "
                         f"{fmt(c.get('flink_checkpoint_avg_ms'))} / {fmt(c.get('flink_checkpoint_p50_ms'))} / "
                         f"{fmt(c.get('flink_checkpoint_p99_ms'))} / {fmt(c.get('flink_checkpoint_max_ms'))} | "
                         f"{mb(c.get('flink_checkpointed_size_avg_bytes'))} / {mb(c.get('flink_checkpointed_size_max_bytes'))} | "
                         f"{mb(c.get('flink_state_size_max_bytes'))} |")
        lines.append("")
    if latencies:
        lines += ["## End-to-end latency (open loop, read_committed reader)", "",
                  f"Each contender at a fixed rate of 50% and 80% of its own median max for {a.latency_secs} s; "
                  "latency = time a read_committed reader gets the output − the input's intended send time "
                  "(the generator's `ts`; for S: the dedup outputs, which carry the event; the generator sends "
                  "each record at most 1 ms after that time, never before). Generator and "
                  "reader share CPU " + a.broker_cpu + " with the broker. " + (f"S-EO-{a.short_interval}: S-EO with "
                  f"{a.short_interval} checkpoints at 50% of S-EO's max." if a.short_interval else ""), "",
                  "| contender | load | rate (events/s) | outputs measured | p50 ms | p99 ms | p99.9 ms | max ms |",
                  "|---|---|---|---|---|---|---|---|"]
        # p50, p99, p99.9 and max of one reader's consumer: "" the output, "input_" the input.
        quantiles = lambda l, p: " | ".join(fmt(l.get(f"{p}{q}_ms")) for q in ("p50", "p99", "p999", "max"))  # noqa: E731
        for l in latencies:
            if "error" in l:
                lines.append(f"| {l['contender']} | {l['load']:.0%} | {l['rate']:,} | error: {l['error'][:80]} | | | | |")
            else:
                lines.append(f"| {l['contender']} | {l['load']:.0%} | {l['rate']:,} | {l.get('records', 0):,} | "
                             f"{quantiles(l, '')} |")
        lines.append("")
        timed = [l for l in latencies if l.get("input_records")]
        if timed:
            lines += ["The same reader's second consumer on the input (read_uncommitted): when each event "
                      "became readable − its intended send time, i.e. the part before the contender could "
                      "read it (generator backlog, broker, fetch).", "",
                      "| contender | load | inputs measured | p50 ms | p99 ms | p99.9 ms | max ms |",
                      "|---|---|---|---|---|---|---|"]
            for l in timed:
                lines.append(f"| {l['contender']} | {l['load']:.0%} | {l['input_records']:,} | "
                             f"{quantiles(l, 'input_')} |")
            lines.append("")
        drained = [l for l in latencies if l.get("bursts")]
        if drained:
            lines += ["A commit makes its whole epoch readable at once, so the reader gets the output in "
                      f"bursts (a gap of {BURST_GAP_MS} ms or more ends one). Time from a burst's first record to each "
                      "record: the part of the latency spent draining the burst (the reader's fetches, on "
                      "the broker's CPU), after the commit.", "",
                      "| contender | load | bursts | p50 ms | p99 ms | p99.9 ms | max ms |",
                      "|---|---|---|---|---|---|---|"]
            for l in drained:
                lines.append(f"| {l['contender']} | {l['load']:.0%} | {l['bursts']:,} | {quantiles(l, 'burst_')} |")
            lines.append("")
        rig = [l for l in latencies if l.get("broker_cpu_busy") is not None]
        if rig:
            lines += [f"The rig while the generator sent: how busy CPU {a.broker_cpu} was (the broker, the "
                      "generator and the reader share it), and the generator's CPU as a share of one CPU "
                      "over that time, and the reader's over its own run (the load, the drain and its idle tail).", "",
                      f"| contender | load | CPU {a.broker_cpu} busy | generator | reader |",
                      "|---|---|---|---|---|"]
            for l in rig:
                lines.append(f"| {l['contender']} | {l['load']:.0%} | {l['broker_cpu_busy']:.0%} | "
                             f"{l['generator_cpu_share']:.0%} | {l['reader_cpu_share']:.0%} |")
            lines.append("")
        logged = [l for l in latencies if l.get("checkpoints")]
        if logged:
            lines += ["streamstate's checkpoints during those runs (its log): barrier to commit, the "
                      "job-thread pause, the upload, its first part (materialize: RocksDB's flush of the "
                      "barrier's memtables, its links, the new files' hashes; the rest is the synced copy "
                      "into checkpoint storage) and the commit, p50 / p99 in ms.", "",
                      "| contender | load | checkpoints | barrier to commit | pause | upload | of it, materialize | commit |",
                      "|---|---|---|---|---|---|---|---|"]
            for l in logged:
                cell = lambda f: f"{fmt(l.get(f + '_p50_ms'))} / {fmt(l.get(f + '_p99_ms'))}"  # noqa: E731
                lines.append(f"| {l['contender']} | {l['load']:.0%} | {l['checkpoints']:,} | {cell('checkpoint')} | "
                             f"{cell('pause')} | {cell('upload')} | {cell('materialize')} | {cell('commit')} |")
            lines.append("")
    if recovery:
        r = recovery
        mb = lambda v: "n/a" if v is None else f"{v / 1e6:,.1f} MB"  # noqa: E731
        where = ("the main input" if r.get("input", a.input) == a.input else
                 f"its own input ({r.get('input_events', 0):,} events, {r.get('keys', 0):,} keys, uniform)")
        lines += ["## State, checkpoints and recovery (S-EO)", "",
                  f"S-EO on {where} until its checkpoints reached the largest size of the state sweep "
                  "(or half the input; at most 90% of it), SIGKILLed, then restarted (checkpoint storage on the "
                  "local file system). Checkpoint sizes and durations are every checkpoint's own, from the "
                  "contender's log. The job thread pauses only for the state snapshot (a RocksDB memtable switch and the "
                  "operator state) and, rarely, the previous epoch's producer; the memtable flush, hard links, "
                  "upload and commit run off it while the next epoch is processed.", ""]
        if "error" in r:
            lines += [f"error: {r['error']}", ""]
        else:
            lines += ["| figure | value |", "|---|---|",
                      f"| local state at the kill (RocksDB dir) | {mb(r['local_state_bytes_at_kill'])} |",
                      f"| events processed at the kill | {fmt(r['killed_at_events'])} |",
                      f"| disk bytes per key seen ({fmt(r.get('keys_seen'))} of {r.get('keys', a.keys):,} keys; "
                      f"uniform estimate) | {fmt(r.get('disk_bytes_per_key'), 1)} |",
                      f"| disk bytes per state entry ({fmt(r.get('state_entries'))}, RocksDB's estimate) / per event | "
                      f"{fmt(r.get('disk_bytes_per_entry'), 1)} / {fmt(r.get('disk_bytes_per_event'), 1)} |",
                      f"| checkpoints before the kill | {fmt(r['checkpoints_before_kill'])} |",
                      f"| job-thread pause, p50 / p99 / max | "
                      f"{fmt(r.get('pause_p50_ms'))} / {fmt(r.get('pause_p99_ms'))} / {fmt(r.get('pause_max_ms'))} ms |",
                      f"| checkpoint duration (barrier to commit), p50 / p99 / max | "
                      f"{fmt(r['checkpoint_p50_ms'])} / {fmt(r['checkpoint_p99_ms'])} / {fmt(r['checkpoint_max_ms'])} ms |",
                      f"| last checkpoint: total vs incremental bytes | {mb(r['last_checkpoint_bytes'])} vs "
                      f"{mb(r['last_checkpoint_incremental_bytes'])} |",
                      f"| restore (reopen) after SIGKILL | {fmt(r['restore_s'], 2)} s for {mb(r['restore_bytes'])} |",
                      f"| restart to first commit | {fmt(r['first_commit_after_restart_s'], 2)} s |",
                      f"| restart to caught up ({r.get('input_events', total) - r['killed_at_events']:,} events left) | "
                      f"{fmt(r['catch_up_s'], 2)} s |",
                      ""]
            if r.get("sweep"):
                lines += ["Checkpoints by state size (those within ±25% of each size):", "",
                          "| state size | checkpoints | pause p50 / p99 / max (ms) | duration p50 / p99 (ms) "
                          "| p50 snapshot / flush / upload / commit (ms) | median total | median incremental |",
                          "|---|---|---|---|---|---|---|"]
                for w in r["sweep"]:
                    if w["checkpoints"]:
                        lines.append(f"| {w['state_mb']:,} MB | {w['checkpoints']} | {fmt(w['p50_ms'])} / "
                                     f"{fmt(w['p99_ms'])} / {fmt(w['max_ms'])} | {fmt(w.get('duration_p50_ms'))} / "
                                     f"{fmt(w.get('duration_p99_ms'))} | {fmt(w['snapshot_p50_ms'])} / "
                                     f"{fmt(w.get('flush_p50_ms'))} / {fmt(w['upload_p50_ms'])} / "
                                     f"{fmt(w['commit_p50_ms'])} | {mb(w['median_bytes'])} | "
                                     f"{mb(w['median_incremental_bytes'])} |")
                    else:
                        lines.append(f"| {w['state_mb']:,} MB | 0: not reached with this input (largest "
                                     f"checkpoint {mb(r['last_checkpoint_bytes'])}) | | | | | |")
                lines.append("")
    lines += ["## How to reproduce on your own hardware", "",
              "On a machine with 2 or more CPUs and nothing else running: `integration-tests/install-deps.sh`, "
              "then `bench/run.sh` (the S workload, about 90 minutes; it builds, starts its own broker and "
              "installs the other contenders' tools), then the parts of the full comparison: "
              "`BENCH_WORKLOADS=S-zipf,D BENCH_MERGE=BENCHMARKS.json bench/run.sh` (about 50 minutes) and "
              "`BENCH_WORKLOADS=W BENCH_MERGE=BENCHMARKS.json bench/run.sh` (about 50 minutes). Try it small "
              "first (`BENCH_EVENTS=20000 BENCH_REPEATS=1 BENCH_LOADS= BENCH_STATE_SWEEP_MB= "
              "BENCH_REPORT=/tmp/smoke.md bench/run.sh`). Compare ratios within one report, not absolute "
              "figures across machines. Details, knobs and the time each part takes: `bench/README.md`.", ""]
    Path(a.report).write_text("\n".join(lines))
    Path(a.report).with_suffix(".json").write_text(json.dumps(
        {"summary": by_name, "runs": results, "latency": latencies,
         "recovery": recovery, "input": gen, "parts": parts,
         "machine": [dict(zip(("figure", "this_run", "reference", "change", "flagged"), r)) for r in machine_rows]}, indent=1))
    plot(a, summary, latencies, [(w, parts[w].get("order") or WORKLOADS[w][1]) for w in workloads])
    log(f"wrote {a.report}")


def plot(a, summary, latencies, order):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    # One bar per (workload, contender), coloured by workload, F among them.
    keys = [(w, n) for w, names in order for n in names if summary.get((w, n), {}).get("eps")]
    colours = {w: f"C{i}" for i, (w, _) in enumerate(order)}
    labels = [f"{w}: {n}" for w, n in keys]
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for ax, field, title in ((axes[0], "eps", "events/s"), (axes[1], "epc", "events per CPU-second")):
        xs = range(len(keys))
        ax.bar(xs, [summary[k][field] or 0 for k in keys], yerr=[summary[k][f"{field}_spread"] or 0 for k in keys],
               color=[colours[w] for w, _ in keys])
        ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(title)
    ok = [l for l in latencies if "error" not in l and l.get("p99_ms") is not None]
    labels = [f"{l['contender']}@{l['load']:.0%}" for l in ok]
    xs = range(len(ok))
    axes[2].bar([x - 0.2 for x in xs], [l["p50_ms"] for l in ok], width=0.4, label="p50")
    axes[2].bar([x + 0.2 for x in xs], [l["p99_ms"] for l in ok], width=0.4, label="p99")
    axes[2].set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=8)
    axes[2].set_title("end-to-end latency (ms)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(a.plot, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--rules-topic", required=True, help="control topic holding bench/rules.json (S)")
    ap.add_argument("--rules-topic-d", default=None, help="control topic holding bench/rules-d.json (D)")
    ap.add_argument("--rules-topic-w", default=None, help="control topic holding bench/rules-w.json (W)")
    ap.add_argument("--rules-topic-seq", default=None, help="control topic holding bench/rules-seq.json (SEQ)")
    ap.add_argument("--rules-topic-grouped", default=None,
                    help="control topic holding bench/rules-grouped.json (S-EO-grouped)")
    ap.add_argument("--console-script", default=None,
                    help="integration-tests/console/hold-open.mjs with its playwright-core (S-EO-console)")
    ap.add_argument("--short-interval", default="200ms",
                    help="S-EO's extra latency run at 50%% load with this checkpoint interval; empty: none")
    ap.add_argument("--workloads", default="S,S-zipf,D,W", help=f"of {','.join(WORKLOADS)}")
    ap.add_argument("--avro-input", default=None, help="the main input's Avro twin (bench-generator --avro-topic): "
                    "the same events at the same offsets, read by J-avro and S-EO-avro")
    ap.add_argument("--schema-registry", default=None, help="Confluent-compatible registry URL holding --avro-input's "
                    "schema (J-avro, S-EO-avro)")
    ap.add_argument("--zipf-input", default=None, help="input topic of S-zipf")
    ap.add_argument("--zipf-summary", default="{}", help="the generator's summary line of --zipf-input")
    ap.add_argument("--merge", default=None, help="an earlier part's BENCHMARKS.json: its workloads that this "
                    "run does not run (and its latency and recovery figures, without S here) go into the report")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--streamstate", required=True)
    ap.add_argument("--base-streamstate", default="", help="another streamstate binary: adds S-EO-base, S-EO on "
                    "it (an A/B of a change in one invocation)")
    ap.add_argument("--kstreams-jar", default=None)
    ap.add_argument("--quix-python", default=None)
    ap.add_argument("--flink-classpath", default=None, help="classpath of bench/flink (bench/flink/build.sh)")
    ap.add_argument("--flink-rest-port", type=int, default=19481, help="the Flink MiniCluster's REST port")
    ap.add_argument("--contenders", default="P,J,S-EO", help="in the order of each repeat; each workload "
                    "runs those of them that can express it")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interval", default="1s")
    ap.add_argument("--contender-cpu", default="1")
    ap.add_argument("--broker-cpu", default="0")
    ap.add_argument("--admin-port", type=int, default=19464)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--work", required=True)
    ap.add_argument("--generator-summary", default="{}")
    ap.add_argument("--label", default="")
    ap.add_argument("--generator", required=True, help="the bench-generator binary")
    ap.add_argument("--latency", required=True, help="the bench-latency binary")
    ap.add_argument("--keys", type=int, default=1000000)
    ap.add_argument("--dist", default="uniform")
    ap.add_argument("--loads", default="0.5,0.8", help="latency runs at these shares of each max; empty: none")
    ap.add_argument("--latency-secs", type=int, default=30)
    ap.add_argument("--latency-input", action="store_true",
                    help="the latency reader also times the input (its own consumer, on the broker's CPU)")
    ap.add_argument("--recovery", type=int, default=1, help="1: the S-EO kill/restart run")
    ap.add_argument("--sweep-input", default=None, help="input topic of the state sweep and recovery run "
                    "(default: the main input)")
    ap.add_argument("--sweep-keys", type=int, default=None, help="key cardinality of --sweep-input")
    ap.add_argument("--state-sweep-mb", default="", help="checkpoint figures at these state sizes (MB), e.g. 100,1000; "
                    "the recovery run's kill waits for the largest")
    ap.add_argument("--reference", default=None, help="the BENCHMARKS.json of an earlier run on the machine "
                    "figures are compared with (machine.py): P, J and KS far from it flag a different or degraded machine")
    ap.add_argument("--report", default=str(HERE.parent / "BENCHMARKS.md"))
    ap.add_argument("--plot", default=str(HERE.parent / "bench" / "benchmarks.png"))
    a = ap.parse_args()
    a.state_sweep_mb = [int(x) for x in a.state_sweep_mb.split(",") if x]
    wanted = [c for c in a.contenders.split(",") if c]
    workloads = [w for w in a.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        log(f"unknown workloads {unknown}: known are {list(WORKLOADS)}")
        sys.exit(2)
    if "S-zipf" in workloads and not a.zipf_input:
        log("S-zipf needs --zipf-input: skipped")
        workloads.remove("S-zipf")
    gen = json.loads(a.generator_summary)
    # Read before this run's report may overwrite it.
    reference = machine.load(a.reference) if a.reference else None
    if a.reference and reference is None:
        log(f"no reference run at {a.reference}: the machine is not compared")
    elif reference and (why := machine.other_input(reference, gen)):
        log(f"the reference run at {a.reference} read another input ({why}): the machine is not compared")
        reference = None
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    now = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    results, parts, tables = [], {}, {}
    for w in workloads:
        table = contenders(a, w)
        order = [c for c in wanted if c in table]
        missing = [c for c in wanted if c in WORKLOADS[w][1] and c not in table]
        if missing:
            log(f"{w}: not available, skipped: {missing}")
        input_topic = a.zipf_input if w == "S-zipf" else a.input
        total = input_end(a.bootstrap, input_topic, a.partitions)
        parts[w] = {"generated": now, "commit": commit, "total": total, "order": order,
                    "input": json.loads(a.zipf_summary) if w == "S-zipf" else gen}
        tables[w] = table
        if any(c in AVRO_CONTENDERS for c in order):
            avro_total = input_end(a.bootstrap, a.avro_input, a.partitions)
            if avro_total != total:
                log(f"{w}: {a.avro_input} has {avro_total} records, {input_topic} {total}: not twins; "
                    f"skipped: {[c for c in order if c in AVRO_CONTENDERS]}")
                order = [c for c in order if c not in AVRO_CONTENDERS]
                parts[w]["order"] = order
        for repeat in range(1, a.repeats + 1):
            for name in order:
                if name in AVRO_CONTENDERS:
                    results.append(run_one(a, name, table[name], repeat, total, w, a.avro_input,
                                           events_from=input_topic))
                else:
                    results.append(run_one(a, name, table[name], repeat, total, w, input_topic))
                warning = machine.early_warning(results[-1], reference)
                if warning:
                    log(warning)
    latencies, recovery = [], None
    if "S" in workloads:
        for load in [float(x) for x in a.loads.split(",") if x]:
            # S-EO-grouped and S-EO-console are throughput variants of S-EO: no latency runs.
            for name in [n for n in parts["S"]["order"] if n not in ("S-EO-grouped", "S-EO-console")]:
                eps = median_spread([r.get("events_per_s") for r in results
                                     if r["contender"] == name and r["workload"] == "S"])[0]
                if eps:
                    latencies.append(run_latency(a, name, tables["S"][name], load, eps))
        seo = median_spread([r.get("events_per_s") for r in results
                             if r["contender"] == "S-EO" and r["workload"] == "S"])[0]
        if a.short_interval and seo:
            name = f"S-EO-{a.short_interval}"
            spec = ("workload", False, contenders(a, "S", interval=a.short_interval)["S-EO"][2])
            latencies.append(run_latency(a, name, spec, 0.5, seo))
        if a.recovery and "S-EO" in parts["S"]["order"]:
            recovery = run_recovery(a, tables["S"]["S-EO"])
    ran_ok = (all(r["ok"] for r in results) and not any("error" in l for l in latencies)
              and not (recovery or {}).get("error"))
    if a.merge:
        prev = json.loads(Path(a.merge).read_text())
        # A report from before workloads (S only) has no "parts".
        prev_parts = prev.get("parts") or {"S": {"input": prev.get("input"), "total": (prev.get("input") or {}).get("records"),
                                                 "generated": "an earlier run", "commit": "?"}}
        for w, p in prev_parts.items():
            if w in parts or w not in WORKLOADS:
                continue
            parts[w] = p
            results += [r for r in prev.get("runs", []) if r.get("workload", "S") == w]
            log(f"merged workload {w} from {a.merge} ({p.get('generated')}, commit {p.get('commit')})")
        if "S" not in workloads:
            latencies, recovery = prev.get("latency") or [], prev.get("recovery")
    report(a, results, parts.get("S", {}).get("total") or 0, gen, latencies, recovery, parts, reference)
    sys.exit(0 if ran_ok else 1)


if __name__ == "__main__":
    main()
