//! A Confluent-compatible Schema Registry client: fetch a schema by id, register or look
//! up a subject's schema. Blocking calls for the job thread, on a private current-thread
//! runtime as [`crate::checkpoint`]'s S3 storage does (call from a plain thread or
//! `spawn_blocking`, never from inside an async task).
//!
//! Transient failures (no connection, timeouts, 5xx, 429) are retried with backoff across
//! every configured URL for `retry_for`; only then does the caller see
//! [`RegistryError::Unavailable`], which the job answers with a rewind, never a dead letter.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;

use super::config::{Auth, RegistryConfig};
use super::metrics::FormatMetrics;
use crate::config::ConfigError;

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    /// Every URL failed for `retry_for`: not the record's fault.
    #[error("schema registry unavailable for {waited_ms} ms ({what}): {last}")]
    Unavailable {
        what: String,
        waited_ms: u64,
        last: String,
    },
    /// The registry answered, and the answer is final (4xx other than 404 and 429).
    #[error("schema registry refused {what}: HTTP {status}: {body}")]
    Refused {
        what: String,
        status: u16,
        body: String,
    },
}

/// What the registry keeps under a schema id.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisteredSchema {
    pub schema: String,
    /// `AVRO` when absent (the Confluent API's default), `PROTOBUF`, `JSON`.
    #[serde(default = "avro_type")]
    pub schema_type: String,
    /// Schemas this one imports by subject; not supported (the start or the record says so).
    #[serde(default)]
    pub references: Vec<serde_json::Value>,
}

impl RegisteredSchema {
    /// The source text, if this is a `schema_type` schema without references (which
    /// streamstate does not resolve); `format` names the job's format in the error.
    pub fn source_of(
        &self,
        id: u32,
        schema_type: &str,
        format: &str,
    ) -> Result<&str, crate::decode::DecodeError> {
        use crate::decode::DecodeError;
        if !self.schema_type.eq_ignore_ascii_case(schema_type) {
            return Err(DecodeError::SchemaMismatch(format!(
                "schema id {id} is a {} schema and job.format is {format}",
                self.schema_type
            )));
        }
        if !self.references.is_empty() {
            return Err(DecodeError::UnsupportedSchema(format!(
                "schema id {id} references other subjects, which streamstate does not resolve"
            )));
        }
        Ok(&self.schema)
    }
}

fn avro_type() -> String {
    "AVRO".into()
}

pub struct RegistryClient {
    urls: Vec<String>,
    auth: Auth,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    request_timeout: Duration,
    retry_for: Duration,
    metrics: FormatMetrics,
}

/// One request's result before retry policy: the body, a definite HTTP answer, or a
/// failure worth another try.
enum Attempt {
    Ok(Vec<u8>),
    NotFound,
    Final(u16, String),
    Transient(String),
}

impl RegistryClient {
    pub fn new(config: &RegistryConfig, metrics: FormatMetrics) -> Result<Self, ConfigError> {
        let invalid = |key, reason: String| ConfigError::Invalid { key, reason };
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout);
        if let Some(ca) = &config.ca_file {
            let pem = std::fs::read(ca).map_err(|e| {
                invalid(
                    "schema_registry.ca_file",
                    format!("cannot read {}: {e}", ca.display()),
                )
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                invalid(
                    "schema_registry.ca_file",
                    format!("{} is not a PEM bundle: {e}", ca.display()),
                )
            })?;
            builder = builder.tls_certs_merge(certs);
        }
        let http = builder.build().map_err(|e| {
            invalid(
                "schema_registry.urls",
                format!("cannot build the HTTP client: {e}"),
            )
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                invalid(
                    "schema_registry.urls",
                    format!("cannot start the I/O runtime: {e}"),
                )
            })?;
        Ok(Self {
            urls: config
                .urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect(),
            auth: config.auth()?,
            http,
            runtime,
            request_timeout: config.request_timeout,
            retry_for: config.retry_for,
            metrics,
        })
    }

    /// `GET /schemas/ids/{id}`: `Ok(None)` when the registry has no such id.
    pub fn schema_by_id(&self, id: u32) -> Result<Option<RegisteredSchema>, RegistryError> {
        let what = format!("schema id {id}");
        match self.call(
            &what,
            reqwest::Method::GET,
            &format!("/schemas/ids/{id}"),
            None,
        )? {
            None => Ok(None),
            Some(body) => {
                serde_json::from_slice(&body)
                    .map(Some)
                    .map_err(|e| RegistryError::Refused {
                        what,
                        status: 200,
                        body: format!("not a schema: {e}"),
                    })
            }
        }
    }

    /// `POST /subjects/{subject}/versions`: registers `schema` (or finds it registered)
    /// and returns its id.
    pub fn register(
        &self,
        subject: &str,
        schema: &str,
        schema_type: &str,
    ) -> Result<u32, RegistryError> {
        let what = format!("registering the schema under subject {subject}");
        let body = json!({"schema": schema, "schemaType": schema_type});
        let path = format!("/subjects/{}/versions", encode(subject));
        match self.call(&what, reqwest::Method::POST, &path, Some(&body))? {
            Some(b) => id_of(&what, &b),
            None => Err(RegistryError::Refused {
                what,
                status: 404,
                body: "not found".into(),
            }),
        }
    }

    /// `POST /subjects/{subject}`: the id of `schema` under `subject`, `None` if the
    /// subject does not hold it.
    pub fn lookup(
        &self,
        subject: &str,
        schema: &str,
        schema_type: &str,
    ) -> Result<Option<u32>, RegistryError> {
        let what = format!("looking up the schema under subject {subject}");
        let body = json!({"schema": schema, "schemaType": schema_type});
        let path = format!("/subjects/{}", encode(subject));
        match self.call(&what, reqwest::Method::POST, &path, Some(&body))? {
            Some(b) => id_of(&what, &b).map(Some),
            None => Ok(None),
        }
    }

    /// One logical request with retries: `Ok(None)` for a 404.
    fn call(
        &self,
        what: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Option<Vec<u8>>, RegistryError> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut last = String::new();
            for base in &self.urls {
                match self.attempt(method.clone(), &format!("{base}{path}"), body) {
                    Attempt::Ok(b) => {
                        self.metrics
                            .registry_requests
                            .with_label_values(&["ok"])
                            .inc();
                        return Ok(Some(b));
                    }
                    Attempt::NotFound => {
                        self.metrics
                            .registry_requests
                            .with_label_values(&["not_found"])
                            .inc();
                        return Ok(None);
                    }
                    Attempt::Final(status, body) => {
                        self.metrics
                            .registry_requests
                            .with_label_values(&["refused"])
                            .inc();
                        return Err(RegistryError::Refused {
                            what: what.to_string(),
                            status,
                            body,
                        });
                    }
                    Attempt::Transient(e) => {
                        self.metrics
                            .registry_requests
                            .with_label_values(&["unavailable"])
                            .inc();
                        last = format!("{base}: {e}");
                    }
                }
            }
            let waited = started.elapsed();
            if waited >= self.retry_for {
                return Err(RegistryError::Unavailable {
                    what: what.to_string(),
                    waited_ms: waited.as_millis() as u64,
                    last,
                });
            }
            tracing::warn!(what, error = %last, retry_in = ?backoff, "schema registry unavailable; retrying");
            std::thread::sleep(backoff.min(self.retry_for.saturating_sub(waited)));
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    fn attempt(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Attempt {
        let mut req = self
            .http
            .request(method, url)
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .timeout(self.request_timeout);
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
                .body(b.to_string());
        }
        req = match &self.auth {
            Auth::None => req,
            Auth::Basic { username, password } => req.basic_auth(username, Some(password.expose())),
            Auth::Bearer(t) => req.bearer_auth(t.expose()),
        };
        self.runtime.block_on(async {
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => return Attempt::Transient(e.to_string()),
            };
            let status = resp.status();
            let bytes = match resp.bytes().await {
                Ok(b) => b.to_vec(),
                Err(e) => return Attempt::Transient(e.to_string()),
            };
            match status.as_u16() {
                200..=299 => Attempt::Ok(bytes),
                404 => Attempt::NotFound,
                408 | 429 | 500..=599 => {
                    Attempt::Transient(format!("HTTP {status}: {}", snippet(&bytes)))
                }
                s => Attempt::Final(s, snippet(&bytes)),
            }
        })
    }
}

fn id_of(what: &str, body: &[u8]) -> Result<u32, RegistryError> {
    #[derive(Deserialize)]
    struct Id {
        id: u32,
    }
    serde_json::from_slice::<Id>(body)
        .map(|i| i.id)
        .map_err(|e| RegistryError::Refused {
            what: what.to_string(),
            status: 200,
            body: format!("no schema id in the answer: {e}"),
        })
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.chars().take(300).collect()
}

fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}
