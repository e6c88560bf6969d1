//! `bad_configuration`: refuse at construction what cannot work, and never
//! panic on a bad request.

use std::time::Duration;

use ratewarden_core::{
    Algorithm, ConfigError, MAX_EXACT, MAX_LIMIT, MAX_LOG_LIMIT, MAX_WINDOW, Policy,
};

use crate::support::{Probe, S, evidence, fail, list, num};
use crate::{Failure, ScenarioResult, StoreFactory};

/// The largest policy `Policy` accepts for `algorithm`, with the longest
/// window.
fn largest(algorithm: Algorithm) -> Result<Policy, Failure> {
    let window_us = MAX_WINDOW.as_secs() * S;
    let limit = match algorithm {
        Algorithm::SlidingLog => u64::from(MAX_LOG_LIMIT),
        Algorithm::FixedWindow => u64::from(MAX_LIMIT),
        // limit · window (µs) must stay within 2^53.
        Algorithm::SlidingWindow => MAX_EXACT / window_us,
        // The emission interval must be at least 1 µs.
        Algorithm::Gcra => window_us.min(u64::from(MAX_LIMIT)),
    };
    let limit = u32::try_from(limit).map_err(|_| Failure("scenario bug: limit".into()))?;
    Policy::new(algorithm, limit, MAX_WINDOW)
        .map_err(|e| Failure(format!("scenario bug: the largest {algorithm} policy: {e}")))
}

pub(crate) async fn bad_configuration(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let store = &probe.store;
    let caps = store.capabilities();
    let mut parts = Vec::new();
    let (supported, unsupported): (Vec<Algorithm>, Vec<Algorithm>) = Algorithm::ALL
        .iter()
        .partition(|a| caps.algorithms.contains(a));

    for &algorithm in &unsupported {
        let p = Policy::new(algorithm, 10, Duration::from_secs(1))
            .map_err(|e| Failure(format!("scenario bug: {e}")))?;
        match store.check_policy(&p) {
            Err(ConfigError::UnsupportedAlgorithm { .. }) => {}
            Err(e) => {
                return fail(format!(
                    "{algorithm}: check_policy must refuse an algorithm the store does not list \
                     with UnsupportedAlgorithm, it said: {e}"
                ));
            }
            Ok(()) => {
                return fail(format!(
                    "{algorithm}: check_policy accepted {p}, but the store's capabilities do not \
                     list {algorithm} (they list: {}): the store claims fewer algorithms than it \
                     accepts, or accepts one it cannot apply",
                    list(caps.algorithms)
                ));
            }
        }
    }
    parts.push(if unsupported.is_empty() {
        "all 4 algorithms supported: none to refuse".to_string()
    } else {
        format!(
            "check_policy refused {} with UnsupportedAlgorithm",
            list(&unsupported)
        )
    });

    let mut extremes = Vec::new();
    for &algorithm in &supported {
        let p = Policy::new(algorithm, 10, Duration::from_secs(1))
            .map_err(|e| Failure(format!("scenario bug: {e}")))?;
        if let Err(e) = store.check_policy(&p) {
            return fail(format!(
                "{algorithm}: check_policy refused {p}, an ordinary policy of an algorithm the \
                 store lists as supported: {e}"
            ));
        }
        probe.at(0);
        // The largest policy: refused up front, or applied exactly.
        let big = largest(algorithm)?;
        if let Err(e) = store.check_policy(&big) {
            extremes.push(format!("{algorithm} {big} refused ({e})"));
            continue;
        }
        let limit = big.limit();
        // An error here is the store going back on its check_policy.
        let accepted = |f: Failure| Failure(format!("check_policy accepted {big}, but {f}"));
        let one = format!("configuration/{algorithm}/largest-one");
        let d = probe.hit(one.as_bytes(), &big, 1).await.map_err(accepted)?;
        if !d.allowed || d.remaining != limit - 1 {
            return fail(format!(
                "{algorithm}: check_policy accepted {big}, but a first request of cost 1 was \
                 answered {} with remaining {} (must be admitted with {} remaining)",
                if d.allowed { "admitted" } else { "refused" },
                d.remaining,
                num(u64::from(limit - 1))
            ));
        }
        let all = format!("configuration/{algorithm}/largest-all");
        let d = probe
            .hit(all.as_bytes(), &big, limit)
            .await
            .map_err(accepted)?;
        if !d.allowed || d.remaining != 0 {
            return fail(format!(
                "{algorithm}: check_policy accepted {big}, but a first request of cost {limit} \
                 was answered {} with remaining {} (must be admitted with 0 remaining)",
                if d.allowed { "admitted" } else { "refused" },
                d.remaining
            ));
        }
        let d = probe.hit(all.as_bytes(), &big, 1).await.map_err(accepted)?;
        if d.allowed {
            return fail(format!(
                "{algorithm}: check_policy accepted {big}, but a request after the whole limit \
                 was taken was admitted"
            ));
        }
        extremes.push(format!(
            "{algorithm} {} per 366 days works",
            num(u64::from(limit))
        ));
    }
    if !supported.is_empty() {
        parts.push(format!("{}: ordinary policies accepted", list(&supported)));
        parts.push(format!("largest policies: {}", extremes.join(", ")));
    }
    evidence(parts)
}
