//! The Postgres store against the reference model
//! (`ratewarden_conformance::model`) on random scripts of requests, keys, costs
//! and clock moves (backwards included): identical decisions. Fewer cases
//! than the memory store, since each request is a statement; one schema per
//! test, and every case has its own keys in it. Refunds, which the model
//! does not replay, are checked against `ratewarden_core::algorithm::refund`.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use ratewarden_conformance::model::refund_differential;
use ratewarden_test_support::postgres as fixture;
use ratewarden_test_support::strategy::{policies, replay_case, steps};

#[test]
fn postgres_store_agrees_with_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(fixture::fresh_store("model"));
    let case = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(policies in policies(), steps in steps(4, 100))| {
        // A fresh namespace per case (shrinking included) in the one schema.
        let n = case.fetch_add(1, Ordering::Relaxed);
        replay_case(&rt, &store, &policies, &steps, |k| {
            format!("case{n}:client:{k}").into_bytes()
        })?;
    });
}

/// Refunds against `ratewarden_core::algorithm::refund` (the model replays
/// decisions only): the store and the core must leave every key in the same
/// state, as the decisions that follow show.
#[test]
fn postgres_refunds_agree_with_the_core() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let counts = rt.block_on(async {
        let store = fixture::fresh_store("refund_model").await;
        refund_differential(&store, 150).await
    });
    let counts = counts.unwrap_or_else(|failure| panic!("{failure}"));
    assert!(counts.refunds > 200, "{counts:?}");
    assert!(counts.decisions > 800, "{counts:?}");
}
