//! Routes librdkafka's logs and client errors into `tracing`, once per distinct message.
//!
//! librdkafka reports an unreachable broker dozens of times a second; repeating that to
//! the log buries the one line that says what is wrong. This context logs an error when
//! it differs from the previous one and counts the repeats.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::ProducerContext;
use tracing::{debug, info, warn};

#[derive(Default)]
pub struct LogContext {
    last_error: Mutex<Option<(String, u64)>>,
    /// Records the producer gave up on; the at-least-once sink refuses to commit offsets
    /// past them.
    delivery_failures: AtomicU64,
}

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => self.once(format!("{fac}: {message}")),
            RDKafkaLogLevel::Warning => warn!(target: "librdkafka", "{fac}: {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", "{fac}: {message}")
            }
            RDKafkaLogLevel::Debug => debug!(target: "librdkafka", "{fac}: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.once(format!("{error}: {reason}"));
    }
}

impl LogContext {
    /// Deliveries that failed since the client was created.
    pub fn delivery_failures(&self) -> u64 {
        self.delivery_failures.load(Ordering::SeqCst)
    }

    fn once(&self, text: String) {
        let Ok(mut last) = self.last_error.lock() else {
            return;
        };
        match last.as_mut() {
            Some((prev, repeats)) if *prev == text => *repeats += 1,
            _ => {
                if let Some((prev, repeats)) = last.take()
                    && repeats > 0
                {
                    warn!(target: "librdkafka", repeats, "previous kafka client error repeated: {prev}");
                }
                warn!(target: "librdkafka", "kafka client: {text}");
                *last = Some((text, 0));
            }
        }
    }
}

impl ConsumerContext for LogContext {}

impl ProducerContext for LogContext {
    type DeliveryOpaque = ();
    /// A failed delivery also fails the transaction's commit, which ends the epoch (or,
    /// at least once, the sink's next commit); the log line says which record class
    /// failed first.
    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        if let Err((e, _)) = result {
            self.delivery_failures.fetch_add(1, Ordering::SeqCst);
            self.once(format!("delivery failed: {e}"));
        }
    }
}
