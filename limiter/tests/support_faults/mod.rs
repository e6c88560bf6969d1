//! What the fault tests against Redis and Postgres share: a store wrapper
//! that counts the calls reaching it, the three rule configurations under
//! test (fallback, fail open, fail closed), and a hang guard.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use limiter::memory::MemoryStore;
use limiter::{
    BreakerConfig, BreakerState, Capabilities, Decision, FailurePolicy, Limiter, ManualClock,
    Policy, Rule, Store, StoreError, Timestamp,
};

/// Every store call is bounded by this.
pub const TIMEOUT: Duration = Duration::from_millis(200);
/// Far above [`TIMEOUT`]: only a decision that ignores its timeout reaches
/// it. A guard against hangs, not a measurement.
pub const HANG_GUARD: Duration = Duration::from_millis(200 * 20);
/// Consecutive failures that open a breaker.
pub const FAILURES: u32 = 2;
/// How long a breaker stays open, on the manual clock.
pub const COOL_DOWN: Duration = Duration::from_secs(5);

/// Counts the calls that reach the wrapped store, so a test can prove that
/// an open breaker or a local refusal made none.
#[derive(Debug)]
pub struct Counted {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

impl Counted {
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Counted {
            inner,
            calls: AtomicU64::new(0),
        })
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Store for Counted {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn decide(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.decide(key, policy, cost, now).await
    }
}

/// The three answers to a failing shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A memory store answers the same policy (fail closed behind it, so
    /// that a missing fallback would show as refusals).
    Fallback,
    /// No fallback; admit.
    Open,
    /// No fallback; refuse.
    Closed,
}

pub const MODES: [Mode; 3] = [Mode::Fallback, Mode::Open, Mode::Closed];

/// One limiter under test: its rule's store (counted) and its fallback.
pub struct Case {
    pub mode: Mode,
    pub limiter: Limiter,
    pub shared: Arc<Counted>,
    pub fallback: Option<Arc<MemoryStore>>,
}

impl Case {
    /// A limiter with one rule named after `mode`, on `store`, with the
    /// short timeout and breaker of these tests.
    pub fn new(mode: Mode, store: Arc<dyn Store>, policy: Policy, clock: &ManualClock) -> Case {
        let shared = Counted::new(store);
        let name = match mode {
            Mode::Fallback => "fallback",
            Mode::Open => "open",
            Mode::Closed => "closed",
        };
        let mut rule = Rule::new(name, shared.clone(), policy)
            .unwrap()
            .with_timeout(TIMEOUT)
            .unwrap()
            .with_breaker(BreakerConfig::new(FAILURES, COOL_DOWN).unwrap());
        let mut fallback = None;
        rule = match mode {
            Mode::Fallback => {
                let memory = Arc::new(MemoryStore::new(1_000));
                fallback = Some(memory.clone());
                rule.with_fallback(memory)
                    .unwrap()
                    .on_failure(FailurePolicy::Closed)
            }
            Mode::Open => rule.on_failure(FailurePolicy::Open),
            Mode::Closed => rule.on_failure(FailurePolicy::Closed),
        };
        Case {
            mode,
            limiter: Limiter::builder()
                .clock(clock.clone())
                .rule(rule)
                .build()
                .unwrap(),
            shared,
            fallback,
        }
    }

    pub fn stats(&self) -> limiter::RuleStats {
        self.limiter.stats().remove(0)
    }

    /// One decision under the hang guard, with its wall time (printed by
    /// the tests, never asserted).
    pub async fn check(&self, key: &[u8]) -> (Decision, Duration) {
        guarded(self.limiter.check(key)).await
    }

    /// Asserts the decision is what this mode answers while the shared
    /// store cannot.
    pub fn assert_degraded_answer(&self, d: &Decision) {
        match self.mode {
            Mode::Fallback => {
                assert!(d.allowed, "{:?}: the fallback admits: {d:?}", self.mode);
                assert!(d.source.fallback, "{:?}: {d:?}", self.mode);
                assert!(!d.source.degraded, "{:?}: {d:?}", self.mode);
                assert_eq!(d.source.store, "memory", "{:?}: {d:?}", self.mode);
            }
            Mode::Open => {
                assert!(d.allowed, "fail open admits: {d:?}");
                assert!(d.source.degraded && !d.source.fallback, "{d:?}");
            }
            Mode::Closed => {
                assert!(!d.allowed, "fail closed refuses: {d:?}");
                assert!(d.source.degraded && !d.source.fallback, "{d:?}");
                assert_eq!(d.retry_after, Duration::from_secs(1), "{d:?}");
            }
        }
    }

    /// Asserts the decision came from the shared store `name`.
    pub fn assert_shared_answer(&self, d: &Decision, name: &str) {
        assert_eq!(d.source.store, name, "{:?}: {d:?}", self.mode);
        assert!(
            !d.source.fallback && !d.source.degraded,
            "{:?}: {d:?}",
            self.mode
        );
        assert!(d.allowed, "{:?}: {d:?}", self.mode);
    }

    /// After the server is back: moves the clock past the cool-down and
    /// decides for keys of its own until the store answers [`HEALTHY`]
    /// decisions in a row (the client may need a few attempts to reconnect,
    /// and a pool may hold several connections broken by the outage, each
    /// failing once). Returns the attempts.
    pub async fn recover(&self, clock: &ManualClock, name: &str) -> u32 {
        for attempt in 1..=100 {
            clock.advance(COOL_DOWN);
            let key = format!("recovery-probe-{attempt}");
            let mut healthy = 0;
            while healthy < HEALTHY {
                let (d, _) = self.check(key.as_bytes()).await;
                if d.source.store != name || d.source.fallback || d.source.degraded {
                    break;
                }
                healthy += 1;
            }
            if healthy == HEALTHY {
                assert_eq!(self.stats().breaker, BreakerState::Closed);
                return attempt;
            }
            // Waiting for the server and the client's reconnection, not for
            // the limiter's time, which the manual clock drives.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{:?}: the shared store never answered again after the restart: {:?}",
            self.mode,
            self.stats()
        );
    }
}

/// Consecutive answers from the shared store that count as recovered.
pub const HEALTHY: u32 = 8;

/// Runs `f` under [`HANG_GUARD`], returning its output and wall time.
pub async fn guarded<F: Future>(f: F) -> (F::Output, Duration) {
    let start = Instant::now();
    let out = tokio::time::timeout(HANG_GUARD, f)
        .await
        .expect("a decision waited far beyond its store timeout");
    (out, start.elapsed())
}

/// A one-line summary of wall times, for the test's output.
pub fn summary(label: &str, times: &[Duration]) -> String {
    let ms: Vec<String> = times
        .iter()
        .map(|t| format!("{:.1}", t.as_secs_f64() * 1000.0))
        .collect();
    format!("{label}: wall ms per decision [{}]", ms.join(", "))
}
