"""Is this machine the one the reference run ran on? The contenders that do not depend on
streamstate's state path (P and J keep no state, Kafka Streams is another engine) should
run as fast as they did in the reference run (the last adopted BENCHMARKS.json) when the
machine is the same. When they do not, the machine differs (another CPU, a noisy
neighbour, a slow disk), and figures from this run and the reference are not comparable:
only ratios within one run are. A default run on a degraded machine looked like a
regression of streamstate until P, J and KS were compared by hand (bench/README.md,
"Default run of `77bf3a9`"); this does that comparison in every run.
"""

import json
from pathlib import Path

# A figure this far from the reference's median is flagged: more than the half range of
# three repeats in the adopted run of `8bc3431` (J 1.5%, KS 4.4%), less than a machine
# that was visibly degraded (KS −37%, P's p99 +52%).
TOLERANCE = 0.15

# What makes two runs' inputs the same for these figures (the generator's summary line).
INPUT_FIELDS = ("records", "keys", "dist", "seed")

# The yardsticks' throughput, compared in the report and for each run as it finishes (so a
# degraded machine shows in the log long before the report):
# contender -> (label, the summary's key, the same field of one run's result).
THROUGHPUT = {"J": ("J events/s", "eps", "events_per_s"),
              "KS": ("KS events per CPU-s", "epc", "events_per_cpu_s")}

# (label, how to read it from a summary and latency rows, True when higher is better)
FIGURES = [(label, lambda s, lat, c=c, key=key: (s.get(f"S/{c}") or {}).get(key), True)
           for c, (label, key, _) in THROUGHPUT.items()] + [
    (f"{c} p99 at 50% load, interval checkpoints (ms)", lambda s, lat, c=c: p99(lat, c), False) for c in ("P", "J")]


def p99(latencies, contender):
    return next((l.get("p99_ms") for l in latencies or []
                 if l.get("contender") == contender and l.get("load") == 0.5), None)


def load(path):
    """The reference run's figures, or None when there is none to compare with."""
    try:
        ref = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    s = (ref.get("parts") or {}).get("S") or {}
    return {"summary": ref.get("summary") or {}, "latency": ref.get("latency") or [],
            "commit": s.get("commit", "?"), "generated": s.get("generated", "?"), "input": s.get("input") or {}}


def other_input(reference, generator_summary):
    """Why this run's S input cannot be compared with the reference's, or None when it can:
    a smaller input or other keys change every figure without the machine changing."""
    differ = [f"{f} {generator_summary.get(f)} against {reference['input'].get(f)}" for f in INPUT_FIELDS
              if generator_summary.get(f) != reference["input"].get(f)]
    return ", ".join(differ) or None


def off(value, reference, higher_is_better):
    """The relative distance from the reference in the bad direction, or None."""
    if value is None or not reference:
        return None
    change = value / reference - 1
    return -change if higher_is_better else change


def compare(summary, latencies, reference):
    """Rows (label, this run, reference, change, flagged) for the report."""
    rows = []
    for label, read, higher in FIGURES:
        now, then = read(summary, latencies), read(reference["summary"], reference["latency"])
        if now is None or not then:
            continue
        bad = off(now, then, higher)
        rows.append((label, now, then, now / then - 1, bad > TOLERANCE))
    return rows


def early_warning(result, reference):
    """A log line when one finished run of a yardstick contender is far from the reference."""
    if not reference or result.get("workload", "S") != "S" or result["contender"] not in THROUGHPUT:
        return None
    label, key, field = THROUGHPUT[result["contender"]]
    now = result.get(field)
    then = (reference["summary"].get(f"S/{result['contender']}") or {}).get(key)
    bad = off(now, then, True)
    if bad is None or bad <= TOLERANCE:
        return None
    return (f"machine: {label} {now:,.0f} in repeat {result['repeat']}, {bad:.0%} below the reference run's "
            f"{then:,.0f} (commit {reference['commit']}, {reference['generated']}): this machine is slower "
            "than that one; compare ratios within this run, not figures across runs")


def section(rows, reference):
    """The report's lines; none without a reference or a figure to compare."""
    if not rows:
        return []
    flagged = [r for r in rows if r[4]]
    verdict = (f"**{len(flagged)} of {len(rows)} figures are more than {TOLERANCE:.0%} worse than the reference "
               "run's: this machine is not the reference's, or not in the same health. Compare ratios within "
               "this report, not its figures with another run's.**" if flagged else
               f"Every figure is within {TOLERANCE:.0%} of the reference run's, or better.")
    lines = ["## The machine against the reference run", "",
             "Contenders whose speed does not depend on streamstate's state path, against the same figures "
             f"of the reference run (commit `{reference['commit']}`, {reference['generated']}; `BENCH_REFERENCE`). "
             + verdict, "",
             "| figure | this run | reference | change | flagged |", "|---|---:|---:|---:|---|"]
    for label, now, then, change, flag in rows:
        lines.append(f"| {label} | {now:,.0f} | {then:,.0f} | {change:+.0%} | {'yes' if flag else ''} |")
    return lines + [""]
