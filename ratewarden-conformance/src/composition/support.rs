//! Test doubles for compositions: a store and an abuse sink whose health a
//! scenario switches, counting the calls they get, and a store that keeps a
//! ledger of the units it counted.

use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use ratewarden_core::{
    AbuseEvent, AbuseSink, Decision, ErrorKind, Key, Policy, Refund, Request, Store, StoreError,
    Timestamp,
};

/// How a [`Switch`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Passes every call to the wrapped store.
    Up,
    /// Fails every call at once, as a server refusing connections does.
    Failing,
    /// Never answers, as a paused or partitioned server does.
    Hanging,
    /// Answers every call with an `InvalidRequest` error.
    Invalid,
}

/// A store (or abuse sink) whose health can be switched, counting the calls
/// that reach it, whatever it then answers. As a store it never answers
/// inline, as a network store does not, and counts how often it is asked
/// to.
pub struct Switch<T: ?Sized> {
    inner: Arc<T>,
    health: Mutex<Health>,
    calls: AtomicU64,
    inline_asks: AtomicU64,
    refunds: AtomicU64,
    resets: AtomicU64,
    refusals: AtomicU64,
}

impl<T: ?Sized> fmt::Debug for Switch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Switch")
            .field("health", &self.health())
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl<T: ?Sized> Switch<T> {
    /// Wraps `inner`, healthy.
    pub fn new(inner: Arc<T>) -> Arc<Self> {
        Arc::new(Switch {
            inner,
            health: Mutex::new(Health::Up),
            calls: AtomicU64::new(0),
            inline_asks: AtomicU64::new(0),
            refunds: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        })
    }

    /// Switches how it answers from now on.
    pub fn set(&self, health: Health) {
        *self.health.lock().unwrap_or_else(|p| p.into_inner()) = health;
    }

    /// How it answers now.
    pub fn health(&self) -> Health {
        *self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls that reached it (decisions, or abuse writes for a sink).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Times it was asked to decide inline (a store only), which it never
    /// does.
    pub fn inline_asks(&self) -> u64 {
        self.inline_asks.load(Ordering::SeqCst)
    }

    /// Refund calls that reached it (a store only).
    pub fn refunds(&self) -> u64 {
        self.refunds.load(Ordering::SeqCst)
    }

    /// Reset calls that reached it (a store only).
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }

    /// For a sink: the refusals the events it stored stand for.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::SeqCst)
    }

    async fn gate(&self, name: &'static str) -> Result<(), StoreError> {
        match self.health() {
            Health::Up => Ok(()),
            Health::Failing => Err(StoreError::new(
                ErrorKind::Unavailable,
                name,
                "connection refused (switched off by the scenario)",
            )),
            Health::Hanging => std::future::pending().await,
            Health::Invalid => Err(StoreError::new(
                ErrorKind::InvalidRequest,
                name,
                "invalid request (switched by the scenario)",
            )),
        }
    }
}

#[async_trait]
impl Store for Switch<dyn Store> {
    ratewarden_core::forward_store_identity!(inner);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.gate(self.inner.name()).await?;
        self.inner.decide(request).await
    }

    fn decide_inline(&self, _: Request<'_>) -> Option<Result<Decision, StoreError>> {
        self.inline_asks.fetch_add(1, Ordering::SeqCst);
        None
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.refunds.fetch_add(1, Ordering::SeqCst);
        self.gate(self.inner.name()).await?;
        self.inner.refund(refund).await
    }

    /// Not counted in [`calls`](Switch::calls), which counts decisions;
    /// failing as they do.
    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.gate(self.inner.name()).await?;
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.resets.fetch_add(1, Ordering::SeqCst);
        self.gate(self.inner.name()).await?;
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.gate(self.inner.name()).await?;
        self.inner.penalize(request).await
    }
}

/// An abuse sink that keeps every event it is given, in order.
#[derive(Debug, Default)]
pub struct Events(Mutex<Vec<AbuseEvent>>);

impl Events {
    /// The events recorded so far, in order.
    pub fn recorded(&self) -> Vec<AbuseEvent> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl AbuseSink for Events {
    async fn record(&self, event: AbuseEvent) -> Result<(), StoreError> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        Ok(())
    }
}

#[async_trait]
impl AbuseSink for Switch<dyn AbuseSink> {
    async fn record(&self, event: AbuseEvent) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.gate("abuse sink").await?;
        let refusals = event.refusals;
        self.inner.record(event).await?;
        self.refusals.fetch_add(refusals, Ordering::SeqCst);
        Ok(())
    }
}

/// A store that keeps a ledger of the units it counted: every admission it
/// answered and every refund it took, at the time each was asked for. A
/// scenario then knows how many units the store counted in any stretch of
/// time, whatever the composition above it says it did.
pub struct Ledger {
    inner: Arc<dyn Store>,
    /// (time asked for in µs, units: admitted positive, refunded negative).
    entries: Mutex<Vec<(u64, i64)>>,
    calls: AtomicU64,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("store", &self.inner.name())
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Keeps the ledger of `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Ledger {
            inner,
            entries: Mutex::default(),
            calls: AtomicU64::new(0),
        })
    }

    /// Decisions asked of it so far, answered or not.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Units it admitted for times in `from..to` (µs), less the units
    /// refunded with a time in that range.
    pub fn counted(&self, from: u64, to: u64) -> i64 {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, units)| units)
            .sum()
    }

    fn enter(&self, now: Timestamp, units: i64) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((now.as_micros(), units));
    }
}

#[async_trait]
impl Store for Ledger {
    ratewarden_core::forward_store_identity!(inner);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let (cost, now) = (request.cost(), request.now());
        self.calls.fetch_add(1, Ordering::SeqCst);
        let d = self.inner.decide(request).await?;
        if d.allowed {
            self.enter(now, i64::from(cost));
        }
        Ok(d)
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        let request = refund.request();
        let (cost, now) = (request.cost(), request.now());

        self.inner.refund(refund).await?;
        self.enter(now, -i64::from(cost));
        Ok(())
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.inner.penalize(request).await
    }
}

/// A store whose next decision is held up after the store has made it, as
/// a slow network holds a reply: the decision is the store's as of when it
/// was made, and arrives late. Never answers inline.
pub struct Late {
    inner: Arc<dyn Store>,
    hold: std::sync::atomic::AtomicBool,
    decided: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl fmt::Debug for Late {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Late").finish_non_exhaustive()
    }
}

impl Late {
    /// Wraps `inner`, holding nothing.
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Late {
            inner,
            hold: std::sync::atomic::AtomicBool::new(false),
            decided: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        })
    }

    /// Holds up the next decision's reply until [`release`](Self::release).
    pub fn hold_next(&self) {
        self.hold.store(true, Ordering::SeqCst);
    }

    /// Waits until the held decision has been made by the store.
    pub async fn decided(&self) {
        self.decided.notified().await;
    }

    /// Lets the held reply through.
    pub fn release(&self) {
        self.release.notify_one();
    }
}

#[async_trait]
impl Store for Late {
    ratewarden_core::forward_store_identity!(inner);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let decision = self.inner.decide(request).await;
        if self.hold.swap(false, Ordering::SeqCst) {
            self.decided.notify_one();
            self.release.notified().await;
        }
        decision
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.inner.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.inner.penalize(request).await
    }
}
