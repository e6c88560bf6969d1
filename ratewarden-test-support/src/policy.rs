//! Policies for the tests that run every algorithm alike.

use std::time::Duration;

use ratewarden_core::{Algorithm, Policy};

/// One policy of each algorithm, in the order of [`Algorithm::ALL`], each
/// admitting `limit` per `window`.
pub fn of_every_algorithm(limit: u32, window: Duration) -> Vec<Policy> {
    Algorithm::ALL
        .iter()
        .map(|&a| Policy::new(a, limit, window).unwrap())
        .collect()
}
