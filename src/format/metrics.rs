//! The formats' metrics, on the job's registry. Labels are fixed sets.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct FormatMetrics {
    /// Schema Registry requests by `outcome` (`ok`, `not_found`, `refused`, `unavailable`).
    pub registry_requests: IntCounterVec,
    /// Records whose schema id was already decoded in this process.
    pub cache_hits: IntCounter,
    /// Schema ids fetched from the registry (or refetched after a not-found expired).
    pub cache_misses: IntCounter,
    /// Schemas held decoded.
    pub cache_entries: IntGauge,
}

impl FormatMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.registry_requests.clone()))?;
        registry.register(Box::new(m.cache_hits.clone()))?;
        registry.register(Box::new(m.cache_misses.clone()))?;
        registry.register(Box::new(m.cache_entries.clone()))?;
        Ok(m)
    }

    /// For tools and tests that keep no registry.
    pub fn unregistered() -> Result<Self, prometheus::Error> {
        Ok(Self {
            registry_requests: IntCounterVec::new(
                Opts::new(
                    "streamstate_schema_registry_requests_total",
                    "Schema Registry HTTP requests, by outcome (ok, not_found, refused, unavailable).",
                ),
                &["outcome"],
            )?,
            cache_hits: IntCounter::new(
                "streamstate_schema_cache_hits_total",
                "Records whose schema id was already cached.",
            )?,
            cache_misses: IntCounter::new(
                "streamstate_schema_cache_misses_total",
                "Schema ids fetched from the registry.",
            )?,
            cache_entries: IntGauge::new(
                "streamstate_schema_cache_entries",
                "Schemas held decoded by this process.",
            )?,
        })
    }
}
