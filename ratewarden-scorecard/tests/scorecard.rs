//! The scorecard command: every scenario passes on the memory store, and
//! every deliberately broken store makes it fail.
#![cfg(feature = "memory")]

use std::process::Command;

fn scorecard(target: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ratewarden-scorecard"))
        .arg(target)
        .output()
        .expect("the scorecard binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn memory_store_passes_every_scenario() {
    let (code, out) = scorecard("memory");
    assert_eq!(code, Some(0), "{out}");
    let passed = out.lines().filter(|l| l.starts_with("PASS ")).count();
    assert_eq!(passed, ratewarden_conformance::SCENARIOS.len(), "{out}");
    assert!(!out.contains("FAIL "), "{out}");
}

#[test]
fn every_broken_store_fails_the_scorecard() {
    let defects = [
        "insertion-order-eviction",
        "eviction-skips-refusals",
        "refusals-recorded",
        "expiry-renewed-on-every-hit",
        "non-atomic",
        "lock-released-before-write",
        "truncated-keys",
        "lossy-utf8-keys",
        "reset-on-clock-regression",
        "panic-on-clock-regression",
        "off-by-one",
        "accepts-unsupported-algorithms",
        "shared-buckets",
        "refund-ignored",
        "refund-blind",
        "inline-records-refusals",
        "long-windows-forgotten",
        "huge-key-bound",
        "ghost-refund-credits",
        "inline-refund-ignored",
        "peek-records",
        "peek-opens-window",
        "reset-ignored",
        "reset-keeps-previous",
        "state-per-policy",
        "penalty-only-when-it-fits",
        "ban-extended-by-refusals",
        "ban-ignored",
        "ban-survives-reset",
        "ban-accepted-undeclared",
    ];
    assert_eq!(
        defects.len(),
        ratewarden_conformance::broken::Defect::ALL.len(),
        "a defect is missing from the scorecard"
    );
    for defect in defects {
        let (code, out) = scorecard(&format!("broken:{defect}"));
        assert_eq!(code, Some(1), "broken:{defect} was not caught:\n{out}");
        assert!(out.contains("FAIL "), "{out}");
    }
}

#[test]
fn bad_targets_are_usage_errors() {
    for target in ["ftp://x", "broken:nonsense", "memory://?capacity=0"] {
        let (code, _) = scorecard(target);
        assert_eq!(code, Some(2), "{target}");
    }
}
