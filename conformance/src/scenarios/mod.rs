//! The scenarios. Each public function takes a factory, makes its own fresh
//! stores, and never panics: a panicking store fails the scenario.

mod concurrency;
mod configuration;
mod flood;
mod keys;
mod refund;
mod semantics;
mod time;

use crate::support::guarded;
use crate::{ScenarioResult, StoreFactory};

macro_rules! public_scenarios {
    ($($(#[$doc:meta])* $name:ident => $module:ident,)*) => {
        $(
            $(#[$doc])*
            pub async fn $name(factory: &dyn StoreFactory) -> ScenarioResult {
                guarded($module::$name(factory)).await
            }
        )*
    };
}

public_scenarios! {
    /// Every supported algorithm matches the semantics of
    /// [`limiter_core::algorithm`] at its boundaries: the limit is reached
    /// exactly, and `remaining`, `reset_after` and `retry_after` are exact to
    /// the microsecond. A request retried exactly `retry_after` after a
    /// refusal is admitted; one microsecond earlier it is refused.
    policy_semantics => semantics,
    /// A request of cost `c` consumes `c` units and is admitted only if all
    /// of them fit; a refused request consumes nothing; a cost of zero or
    /// above the limit is an `InvalidRequest` error, not a panic.
    cost_accounting => semantics,
    /// One key exhausted leaves 64 other keys with their full quota, and
    /// their traffic leaves its refusal unchanged, for every algorithm.
    key_independence => keys,
    /// A client hammering every 3 ms after its first refusal is refused until
    /// exactly the reported `retry_after` and admitted then; for the sliding
    /// log and the fixed window that is exactly one window after the last
    /// admitted request. Catches refusals that are recorded (access comes
    /// later) and state that is forgotten (access comes earlier).
    refused_hammering => time,
    /// An offender at its limit (one-hour window) stays refused while an
    /// attacker floods three times the store's key capacity in fresh keys
    /// (2,000 keys for an unbounded store), the offender retrying every
    /// capacity/8 keys: a bounded store must evict least-recently-touched
    /// keys, and a refusal touches its key. Whether a bounded store holds at
    /// most its capacity is for the backend's own tests: the key count is
    /// not visible through [`Store`](limiter_core::Store).
    distinct_key_flood => flood,
    /// Fixed window: hits every second never move the window's end
    /// (`now + reset_after` is constant), and the count resets exactly at the
    /// end. Sliding log: under steady hits, `reset_after` and `retry_after`
    /// follow the admitted entries only.
    window_renewal => time,
    /// 64 spawned tasks, 4 requests each, on one key at one instant, are
    /// admitted exactly `limit` (50) times, with the admitted requests'
    /// `remaining` values each of 49..=0 once.
    concurrent_exactness => concurrency,
    /// Hostile byte strings (empty, 10 KB, newlines, quotes, SQL, Lua,
    /// `{hash}` tags, NUL bytes, invalid UTF-8, non-ASCII, prefixes of one
    /// another, 10 KB keys differing in their last byte) are all valid and
    /// all distinct keys.
    hostile_keys => keys,
    /// `now` going backwards by seconds, by more than a window, and to the
    /// epoch, never errors or panics, never admits more than a forward clock
    /// would over the same span, and the key recovers two windows later.
    clock_regression => time,
    /// Algorithms the store does not list are refused by `check_policy` with
    /// `UnsupportedAlgorithm`; supported ones are accepted; the largest
    /// policies are either refused by `check_policy` or work; invalid costs
    /// are `InvalidRequest` errors.
    bad_configuration => configuration,
    /// Per algorithm, a table of admissions and refunds: a refund restores
    /// exactly the units its admission took (the same request fits again,
    /// with the same numbers), removes the entries of its own time and no
    /// other (sliding log), and changes nothing once the units it took are no
    /// longer held — a closed fixed window, a sliding window two windows
    /// on, a GCRA bucket restarted by a later request. Refunding a refusal
    /// is an `InvalidRequest` error; refunding a key that holds nothing is a
    /// no-op that creates nothing.
    /// The store declares a key-length bound of at most 1 MiB
    /// (`Store::max_key_len`); a key of exactly that length is valid and
    /// admitted, one byte more is an `InvalidRequest` error for `decide` and
    /// `refund`, and the longest valid key's state is untouched by the
    /// refused one.
    key_length_bound => keys,
    refund_exactness => refund,
}
