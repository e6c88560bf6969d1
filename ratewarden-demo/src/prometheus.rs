//! `GET /metrics`: the limiter's metrics in the Prometheus text format.
//!
//! The limiter reports through the `metrics` facade (the `metrics` feature
//! of the `ratewarden` crate); this module installs a Prometheus recorder and
//! renders it on the demo's own router, on the same port, so the demo needs
//! no second listener. The series are the library's (`ratewarden_core`'s
//! docs, Metrics); the memory stores' (`store="primary"`, `"local"`) are
//! reported (`MemoryStore::report_metrics`) when `/metrics` is scraped, so
//! they cost the request path nothing.
//!
//! The endpoint is not rate limited and says which keys a store holds only
//! by count; put it behind the network boundary a scraper reaches, as any
//! metrics endpoint.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use ratewarden::memory::MemoryStore;

/// The upper bounds of the store-call latency histogram, in seconds: from
/// an in-datacenter round trip to past the default 250 ms timeout.
pub const STORE_CALL_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The Prometheus recorder of this process and the memory stores whose
/// size it reports.
#[derive(Debug, Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
    memory: Vec<(&'static str, Arc<MemoryStore>)>,
}

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// How often the recorder folds recorded histogram samples into buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Keeps the recorder behind `handle` on a thread of its own, for the life
/// of the process: every awaited store call records a histogram sample,
/// which the recorder holds until upkeep folds it into the buckets. Left to
/// scrapes, a demo nobody scraped grew by every call it made to its store.
fn keep(handle: PrometheusHandle) -> Result<(), String> {
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                handle.run_upkeep();
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the metrics upkeep thread: {e}"))
}

impl Metrics {
    /// Installs the Prometheus recorder as the process's `metrics`
    /// recorder, the first time it is called; later calls share it.
    /// Refuses if another recorder was installed first.
    pub fn install() -> Result<Self, String> {
        let handle = HANDLE.get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("ratewarden_store_call_seconds".into()),
                    STORE_CALL_BUCKETS,
                )
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| format!("cannot install the Prometheus recorder: {e}"))?;
            keep(handle.clone())?;
            Ok(handle)
        });
        let handle = handle.clone()?;
        describe();
        Ok(Metrics {
            handle,
            memory: Vec::new(),
        })
    }

    /// Reports `store`'s key count, capacity and evictions under the label
    /// `store="{name}"`.
    pub fn watch_memory(&mut self, name: &'static str, store: Arc<MemoryStore>) {
        self.memory.push((name, store));
    }

    /// The current metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        for (name, store) in &self.memory {
            store.report_metrics(name);
        }
        self.handle.render()
    }

    /// A router answering `GET /metrics`.
    pub fn router(self) -> Router {
        let metrics = Arc::new(self);
        Router::new().route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    (
                        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                        metrics.render(),
                    )
                }
            }),
        )
    }
}

/// The `# HELP` lines.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "ratewarden_decisions_total",
        "Decisions by rule, outcome and the store that answered"
    );
    describe_counter!(
        "ratewarden_store_errors_total",
        "Failed store calls, by kind"
    );
    describe_counter!(
        "ratewarden_breaker_transitions_total",
        "Circuit breaker openings and closings"
    );
    describe_counter!(
        "ratewarden_fallbacks_total",
        "Decisions answered by a rule's fallback store"
    );
    describe_histogram!(
        "ratewarden_store_call_seconds",
        Unit::Seconds,
        "Latency of awaited store calls, timeouts included"
    );
    describe_gauge!(
        "ratewarden_breaker_open",
        "1 while a rule's store has its circuit breaker open, 0 once closed"
    );
    describe_gauge!("ratewarden_memory_keys", "Keys a memory store holds");
    describe_gauge!("ratewarden_memory_capacity", "Keys a memory store may hold");
    describe_counter!(
        "ratewarden_memory_evictions_total",
        "Keys a memory store evicted to stay within its capacity"
    );
}
