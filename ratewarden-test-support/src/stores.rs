//! Small stores for tests: an exact reference and a recording wrapper.

use std::sync::Mutex;

use async_trait::async_trait;
use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_core::algorithm;
use ratewarden_core::{
    Capabilities, Decision, Key, Policy, Refund, Request, Store, StoreError, Timestamp,
};

/// The conformance crate's [`ReferenceStore`] (exact, every algorithm,
/// 2^20 keys) answering only when awaited, and able to declare itself
/// shared.
///
/// The reference store answers inline, as an in-process store does; this
/// one hides that, so the layer and limiter tests built on it exercise the
/// awaited path (boxed future, timeout, breaker) that a networked store
/// takes.
#[derive(Debug)]
pub struct AwaitedStore {
    inner: ReferenceStore,
}

/// The keys an [`AwaitedStore`] holds: more than any test uses.
const AWAITED_KEYS: usize = 1 << 20;

impl Default for AwaitedStore {
    fn default() -> Self {
        AwaitedStore {
            inner: ReferenceStore::new(AWAITED_KEYS),
        }
    }
}

impl AwaitedStore {
    /// The same store declaring itself shared by other processes
    /// ([`Capabilities::shared`]), as Redis and Postgres do.
    pub fn shared() -> Self {
        AwaitedStore {
            inner: ReferenceStore::new(AWAITED_KEYS).shared_as("reference"),
        }
    }
}

#[async_trait]
impl Store for AwaitedStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.decide(request).await
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

/// Wraps a store and records the key of every decision that reaches it, so
/// a test can prove what a store was asked (no raw address) or that an open
/// breaker or a local refusal asked nothing.
///
/// It answers only through [`Store::decide`], never inline, so every
/// decision is seen here even when the wrapped store could answer inline.
/// Refunds are passed through, unrecorded.
#[derive(Debug)]
pub struct Recording<S> {
    inner: S,
    keys: Mutex<Vec<Vec<u8>>>,
}

impl<S> Recording<S> {
    /// Wraps `inner`, with nothing recorded yet.
    pub fn new(inner: S) -> Self {
        Recording {
            inner,
            keys: Mutex::new(Vec::new()),
        }
    }

    /// The keys decided so far, in order.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.keys.lock().unwrap().clone()
    }

    /// How many decisions reached the wrapped store.
    pub fn calls(&self) -> u64 {
        self.keys.lock().unwrap().len() as u64
    }
}

#[async_trait]
impl<S: Store> Store for Recording<S> {
    ratewarden_core::forward_store_identity!(inner);

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let key = request.key();
        self.keys.lock().unwrap().push(key.to_vec());
        self.inner.decide(request).await
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

/// An admission of one unit on a fresh key under `policy`, as `store`
/// would answer it, without asking any store: for a refund that must be
/// refused before anything is sent.
pub fn first_admission(policy: &Policy, store: &'static str) -> Decision {
    Decision::from_verdict(
        algorithm::Verdict {
            allowed: true,
            remaining: policy.limit() - 1,
            reset_after_us: policy.window_micros(),
            retry_after_us: 0,
        },
        policy,
        store,
    )
}

/// Decides once on the key `warm` under each of `policies` at `now`, so
/// that connections are open and statements prepared before a test counts
/// what reaches the server.
pub async fn warm_up(store: &dyn Store, policies: &[Policy], now: Timestamp) {
    for p in policies {
        let request = Request::new(store, b"warm", p, 1, now).unwrap();
        store.decide(request).await.unwrap();
    }
}

/// An admission a test made so as to refund it: the policy, the key, the
/// time (µs) and the decision.
pub type Admission = (Policy, String, u64, Decision);

/// Refunds each of `admitted` once, then, under each of `policies`, the
/// first admission's decision on a key that holds nothing: a refund that
/// finds nothing to give back is a call to the store too. Returns how many
/// refunds were made.
pub async fn refund_all_and_ghosts(
    store: &dyn Store,
    admitted: &[Admission],
    policies: &[Policy],
) -> u64 {
    let mut refunds = 0;
    for (p, key, now, d) in admitted {
        refund(store, key.as_bytes(), p, *now, d).await;
        refunds += 1;
    }
    let (_, _, now, d) = &admitted[0];
    for p in policies {
        refund(store, b"never-seen", p, *now, d).await;
        refunds += 1;
    }
    refunds
}

/// Refunds `d`, the admission of one unit of `key` at `now`.
async fn refund(store: &dyn Store, key: &[u8], p: &Policy, now: u64, d: &Decision) {
    let request = Request::new(store, key, p, 1, Timestamp::from_micros(now)).unwrap();
    store
        .refund(Refund::new(request, d).unwrap())
        .await
        .unwrap();
}
