"""machine.py against the figures of two real default runs: `8bc3431` on a healthy Intel Xeon
(the reference) and `77bf3a9` on a degraded one (bench/README.md, "Default run of
`77bf3a9`"), whose J, KS and p99 figures are taken from its results file."""

import json
import tempfile
import unittest
from pathlib import Path

import machine

REFERENCE = {
    "summary": {"S/J": {"eps": 108410.9}, "S/KS": {"epc": 22631.4}, "S/S-EO": {"eps": 64091.1}},
    "latency": [{"contender": "P", "load": 0.5, "p99_ms": 1023}, {"contender": "J", "load": 0.5, "p99_ms": 1024},
                {"contender": "P", "load": 0.8, "p99_ms": 1400}],
    "parts": {"S": {"commit": "8bc3431", "generated": "2026-12-07 11:29 UTC",
                    "input": {"records": 1000000, "keys": 1000000, "dist": "uniform", "seed": 42, "bytes": 250000000}}},
}


class MachineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        path = Path(self.dir.name) / "BENCHMARKS.json"
        path.write_text(json.dumps(REFERENCE))
        self.reference = machine.load(path)

    def tearDown(self):
        self.dir.cleanup()

    def test_flags_the_degraded_machine_and_names_each_figure(self):
        degraded = {"S/J": {"eps": 107177.0}, "S/KS": {"epc": 14336.0}}
        latency = [{"contender": "P", "load": 0.5, "p99_ms": 1554}, {"contender": "J", "load": 0.5, "p99_ms": 1449}]
        rows = {r[0]: r for r in machine.compare(degraded, latency, self.reference)}
        self.assertFalse(rows["J events/s"][4], "J lost 1%: within the tolerance")
        self.assertTrue(rows["KS events per CPU-s"][4], "KS lost 37%")
        self.assertTrue(rows["P p99 at 50% load, interval checkpoints (ms)"][4], "P's p99 rose 52%")
        self.assertTrue(rows["J p99 at 50% load, interval checkpoints (ms)"][4], "J's p99 rose 42%")
        text = "\n".join(machine.section(list(rows.values()), self.reference))
        self.assertIn("3 of 4 figures", text)
        self.assertIn("`8bc3431`", text)
        self.assertIn("| KS events per CPU-s | 14,336 | 22,631 | -37% | yes |", text)

    def test_a_healthy_machine_is_not_flagged_and_faster_is_never_worse(self):
        faster = {"S/J": {"eps": 140000.0}, "S/KS": {"epc": 21000.0}}
        latency = [{"contender": "P", "load": 0.5, "p99_ms": 900}, {"contender": "J", "load": 0.5, "p99_ms": 1100}]
        rows = machine.compare(faster, latency, self.reference)
        self.assertEqual(len(rows), 4)
        self.assertFalse(any(r[4] for r in rows), rows)
        self.assertIn("Every figure is within 15%", "\n".join(machine.section(rows, self.reference)))

    def test_figures_missing_on_either_side_are_left_out(self):
        rows = machine.compare({"S/J": {"eps": 100000.0}}, [], self.reference)
        self.assertEqual([r[0] for r in rows], ["J events/s"])
        self.assertEqual(machine.section([], self.reference), [])

    def test_early_warning_for_one_slow_run_of_a_yardstick_only(self):
        slow_ks = {"workload": "S", "contender": "KS", "repeat": 2, "events_per_cpu_s": 14025.0}
        warning = machine.early_warning(slow_ks, self.reference)
        self.assertIsNotNone(warning)
        self.assertIn("KS events per CPU-s 14,025 in repeat 2, 38% below", warning)
        self.assertIsNone(machine.early_warning({**slow_ks, "events_per_cpu_s": 21000.0}, self.reference))
        seo = {"workload": "S", "contender": "S-EO", "repeat": 1, "events_per_s": 1.0}
        self.assertIsNone(machine.early_warning(seo, self.reference), "S-EO is measured, not a yardstick")
        self.assertIsNone(machine.early_warning({**slow_ks, "workload": "D"}, self.reference), "other workloads differ")
        self.assertIsNone(machine.early_warning(slow_ks, None))

    def test_only_a_run_on_the_same_input_is_compared(self):
        same = {"records": 1000000, "keys": 1000000, "dist": "uniform", "seed": 42, "topic": "another-topic"}
        self.assertIsNone(machine.other_input(self.reference, same))
        smoke = {**same, "records": 20000}
        self.assertEqual(machine.other_input(self.reference, smoke), "records 20000 against 1000000")
        self.assertIn("dist zipf against uniform", machine.other_input(self.reference, {**same, "dist": "zipf"}))

    def test_no_reference_file_means_no_comparison(self):
        self.assertIsNone(machine.load(Path(self.dir.name) / "missing.json"))
        broken = Path(self.dir.name) / "broken.json"
        broken.write_text("{not json")
        self.assertIsNone(machine.load(broken))


if __name__ == "__main__":
    unittest.main()
