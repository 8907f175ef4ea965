//! The per-record counters' handles, fetched once per partition and topic.
//!
//! Why: `with_label_values` hashes its labels and takes the vector's lock, and the loop
//! called it for every record consumed and every record produced. A job reads a few
//! partitions and writes a few topics, so a scan of the handles fetched so far is cheaper.

use std::cell::RefCell;

use prometheus::IntCounter;

use crate::metrics::Metrics;

pub(super) struct RecordCounters {
    metrics: Metrics,
    consumed: Vec<((String, i32), IntCounter)>,
    /// Behind a `RefCell`: records are sent from `&self` paths (timers, rule updates).
    produced: RefCell<Vec<(String, IntCounter)>>,
}

impl RecordCounters {
    pub(super) fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            consumed: Vec::new(),
            produced: RefCell::new(Vec::new()),
        }
    }

    /// `streamstate_records_consumed_total{topic, partition}` + 1.
    pub(super) fn consumed(&mut self, topic: &str, partition: i32) {
        let found = self
            .consumed
            .iter()
            .find(|((t, p), _)| *p == partition && t == topic);
        match found {
            Some((_, c)) => c.inc(),
            None => {
                let c = self
                    .metrics
                    .records_consumed
                    .with_label_values(&[topic, &partition.to_string()]);
                c.inc();
                self.consumed.push(((topic.to_string(), partition), c));
            }
        }
    }

    /// `streamstate_records_produced_total{topic}` + 1.
    pub(super) fn produced(&self, topic: &str) {
        let mut produced = self.produced.borrow_mut();
        match produced.iter().find(|(t, _)| t == topic) {
            Some((_, c)) => c.inc(),
            None => {
                let c = self.metrics.records_produced.with_label_values(&[topic]);
                c.inc();
                produced.push((topic.to_string(), c));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_partition_and_topic_under_its_own_labels() {
        let metrics = Metrics::new().expect("metrics");
        let mut counters = RecordCounters::new(metrics.clone());
        for (topic, partition) in [("in", 0), ("in", 1), ("in", 0), ("other", 0)] {
            counters.consumed(topic, partition);
        }
        counters.produced("out");
        counters.produced("out");
        counters.produced("dlq");
        let consumed = |t: &str, p: &str| metrics.records_consumed.with_label_values(&[t, p]).get();
        assert_eq!(
            [
                consumed("in", "0"),
                consumed("in", "1"),
                consumed("other", "0")
            ],
            [2, 1, 1]
        );
        let produced = |t: &str| metrics.records_produced.with_label_values(&[t]).get();
        assert_eq!([produced("out"), produced("dlq")], [2, 1]);
    }
}
