//! A complete, correct store in one screen: the one the [`Store`] docs show
//! and the conformance suite runs (`ratewarden-core/tests/example_store.rs`).
//! Not a module of the crate: it is compiled as that example and that test,
//! and names `ratewarden_core` as a store crate does.
//!
//! One map under one lock, every algorithm by [`algorithm::apply`],
//! [`algorithm::refund`] and [`algorithm::penalize`], keys bounded in length. It never evicts, so it is
//! unbounded in key count: a real in-process store caps it, evicting the
//! least recently *touched* key, refusals included (`ratewarden-memory`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use ratewarden_core::algorithm::{self, KeyState};
use ratewarden_core::{
    Algorithm, Capabilities, DEFAULT_MAX_KEY_LEN, Decision, Key, Policy, Refund, Request, Store,
    StoreError, async_trait,
};

/// One map of `(algorithm, key)` to its state, under one lock.
#[derive(Debug, Default)]
pub struct MapStore {
    keys: Mutex<Keys>,
}

type Keys = HashMap<(Algorithm, Vec<u8>), Option<KeyState>>;

#[async_trait]
impl Store for MapStore {
    fn name(&self) -> &'static str {
        "map"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(&Algorithm::ALL)
    }

    fn max_key_len(&self) -> usize {
        DEFAULT_MAX_KEY_LEN
    }

    // Every argument arrives checked (a cost the policy can admit, a key
    // within `max_key_len`, an admitted decision to refund): nothing to
    // validate here.
    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let policy = request.policy();
        // The whole algorithm under the lock: never read, then write.
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let state = keys.entry(map_key(policy, request.key())).or_default();
        let verdict = algorithm::apply(state, policy, request.cost(), request.now().as_micros());
        Ok(Decision::from_verdict(verdict, policy, "map"))
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        let (request, policy) = (refund.request(), refund.request().policy());
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = keys.get_mut(&map_key(policy, request.key())) {
            let reset_after = refund.admitted().reset_after.as_micros();
            let reset_after = u64::try_from(reset_after).unwrap_or(u64::MAX);
            let now = request.now().as_micros();
            algorithm::refund(state, policy, request.cost(), now, reset_after);
        }
        Ok(())
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let policy = request.policy();
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let state = keys.get(&map_key(policy, request.key())).unwrap_or(&None);
        let verdict = algorithm::peek(state, policy, request.cost(), request.now().as_micros());
        Ok(Decision::from_verdict(verdict, policy, "map"))
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.remove(&map_key(policy, key.as_bytes()));
        Ok(())
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        let policy = request.policy();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let state = keys.entry(map_key(policy, request.key())).or_default();
        algorithm::penalize(state, policy, request.cost(), request.now().as_micros());
        Ok(())
    }
}

/// State is kept per (algorithm, key), so that a plan change of the same
/// algorithm carries a key's usage over.
fn map_key(policy: &Policy, key: &[u8]) -> (Algorithm, Vec<u8>) {
    (policy.algorithm(), key.to_vec())
}
