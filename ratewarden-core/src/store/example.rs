//! A complete, correct store in one screen: the one the [`Store`] docs show
//! and the conformance suite runs (`ratewarden-core/tests/example_store.rs`).
//!
//! One map under one lock, every algorithm by [`algorithm::apply`],
//! [`algorithm::refund`] and [`algorithm::penalize`], keys bounded in length. It never evicts, so it is
//! unbounded in key count: a real in-process store caps it, evicting the
//! least recently *touched* key, refusals included (`ratewarden-memory`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use ratewarden_core::algorithm::{self, KeyState};
use ratewarden_core::{
    Algorithm, Capabilities, DEFAULT_MAX_KEY_LEN, Decision, Policy, Store, StoreError, Timestamp,
    async_trait, check_key, check_refund, check_request,
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

    async fn decide(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        check_request("map", policy, cost, key, DEFAULT_MAX_KEY_LEN)?;
        // The whole algorithm under the lock: never read, then write.
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let state = keys.entry((policy.algorithm(), key.to_vec())).or_default();
        let verdict = algorithm::apply(state, policy, cost, now.as_micros());
        Ok(Decision::from_verdict(verdict, policy, "map"))
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
        admitted: &Decision,
    ) -> Result<(), StoreError> {
        check_refund("map", policy, cost, admitted)?;
        check_key("map", key, DEFAULT_MAX_KEY_LEN)?;
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = keys.get_mut(&(policy.algorithm(), key.to_vec())) {
            let reset_after = u64::try_from(admitted.reset_after.as_micros()).unwrap_or(u64::MAX);
            algorithm::refund(state, policy, cost, now.as_micros(), reset_after);
        }
        Ok(())
    }

    async fn peek(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        check_request("map", policy, cost, key, DEFAULT_MAX_KEY_LEN)?;
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let state = keys
            .get(&(policy.algorithm(), key.to_vec()))
            .unwrap_or(&None);
        let verdict = algorithm::peek(state, policy, cost, now.as_micros());
        Ok(Decision::from_verdict(verdict, policy, "map"))
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        check_key("map", key, DEFAULT_MAX_KEY_LEN)?;
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.remove(&(policy.algorithm(), key.to_vec()));
        Ok(())
    }

    async fn penalize(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        check_request("map", policy, cost, key, DEFAULT_MAX_KEY_LEN)?;
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let state = keys.entry((policy.algorithm(), key.to_vec())).or_default();
        algorithm::penalize(state, policy, cost, now.as_micros());
        Ok(())
    }
}
