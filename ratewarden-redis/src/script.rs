//! The Lua scripts, one per algorithm for decisions and one per algorithm
//! for refunds, and the reading of their replies.
//!
//! Each script is the shared header (argument parsing, the clock) followed
//! by its algorithm; the `redis` crate's [`Script`] sends `EVALSHA` and
//! falls back to `SCRIPT LOAD` once per server when it answers `NOSCRIPT`.

use std::sync::LazyLock;

use ratewarden_core::algorithm::Verdict;
use ratewarden_core::{Algorithm, StoreError};
use redis::{Script, Value};

use crate::error::protocol;

/// The source of `$algorithm`'s script of one kind, as the store sends it:
/// the kind's header `scripts/{kind}header.lua` (argument parsing, the
/// clock), then the algorithm's body `scripts/{kind}{algorithm}.lua`.
macro_rules! source {
    ($algorithm:expr, $kind:literal) => {
        match $algorithm {
            Algorithm::SlidingLog => source!(@ $kind, "sliding_log"),
            Algorithm::FixedWindow => source!(@ $kind, "fixed_window"),
            Algorithm::SlidingWindow => source!(@ $kind, "sliding_window"),
            Algorithm::Gcra => source!(@ $kind, "gcra"),
        }
    };
    (@ $kind:literal, $body:literal) => {
        concat!(
            include_str!(concat!("scripts/", $kind, "header.lua")),
            include_str!(concat!("scripts/", $kind, $body, ".lua")),
        )
    };
}

/// The Lua source of the script that applies `algorithm`, as the store sends
/// it. Exposed so that a benchmark can run the very same script with
/// `redis-benchmark`, and so that operators can audit it.
pub fn script_source(algorithm: Algorithm) -> &'static str {
    source!(algorithm, "")
}

/// The source of `$algorithm`'s decision script under a ban: the header,
/// the algorithm's body as a function, then `scripts/ban.lua` around it.
macro_rules! ban_source {
    ($algorithm:expr) => {
        match $algorithm {
            Algorithm::SlidingLog => ban_source!(@ "sliding_log"),
            Algorithm::FixedWindow => ban_source!(@ "fixed_window"),
            Algorithm::SlidingWindow => ban_source!(@ "sliding_window"),
            Algorithm::Gcra => ban_source!(@ "gcra"),
        }
    };
    (@ $body:literal) => {
        concat!(
            include_str!("scripts/header.lua"),
            "local function verdict()\n",
            include_str!(concat!("scripts/", $body, ".lua")),
            "end\n",
            include_str!("scripts/ban.lua"),
        )
    };
}

/// The Lua source of the script that applies `algorithm` under a policy's
/// [`Ban`](ratewarden_core::Ban), as the store sends it; exposed for audit
/// like [`script_source`].
pub fn ban_script_source(algorithm: Algorithm) -> &'static str {
    ban_source!(algorithm)
}

/// The Lua source of the script that refunds an admission under
/// `algorithm` (see [`Store::refund`](ratewarden_core::Store::refund)), as the
/// store sends it; exposed for audit like [`script_source`].
pub fn refund_script_source(algorithm: Algorithm) -> &'static str {
    source!(algorithm, "refund_")
}

// Hashed once per process rather than per call: `Script::new` computes the
// SHA-1 that `EVALSHA` names.
static SCRIPTS: LazyLock<[Script; 4]> =
    LazyLock::new(|| Algorithm::ALL.map(|a| Script::new(script_source(a))));

static BAN_SCRIPTS: LazyLock<[Script; 4]> =
    LazyLock::new(|| Algorithm::ALL.map(|a| Script::new(ban_script_source(a))));

static REFUND_SCRIPTS: LazyLock<[Script; 4]> =
    LazyLock::new(|| Algorithm::ALL.map(|a| Script::new(refund_script_source(a))));

fn algorithm_index(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .unwrap_or(0)
}

/// The decision script of `algorithm`.
pub(crate) fn script(algorithm: Algorithm) -> &'static Script {
    &SCRIPTS[algorithm_index(algorithm)]
}

/// The decision script of `algorithm` under a ban.
pub(crate) fn ban_script(algorithm: Algorithm) -> &'static Script {
    &BAN_SCRIPTS[algorithm_index(algorithm)]
}

/// The refund script of `algorithm`.
pub(crate) fn refund_script(algorithm: Algorithm) -> &'static Script {
    &REFUND_SCRIPTS[algorithm_index(algorithm)]
}

/// Reads a decision script's `{allowed, remaining, reset_after_us,
/// retry_after_us}` without trusting it: anything else is a protocol error.
pub(crate) fn verdict(value: Value) -> Result<Verdict, StoreError> {
    let (verdict, banned) = verdict_of(value, false)?;
    debug_assert!(!banned);
    Ok(verdict)
}

/// Reads a ban script's reply: [`verdict`]'s four integers and a fifth, 1
/// for a ban's refusal.
pub(crate) fn ban_verdict(value: Value) -> Result<(Verdict, bool), StoreError> {
    verdict_of(value, true)
}

fn verdict_of(value: Value, ban: bool) -> Result<(Verdict, bool), StoreError> {
    let Value::Array(items) = value else {
        return Err(protocol(format!(
            "expected an array of 4 integers, got {value:?}"
        )));
    };
    let ints: Vec<i64> = items
        .iter()
        .map(|v| match v {
            Value::Int(i) if *i >= 0 => Ok(*i),
            other => Err(protocol(format!(
                "expected a non-negative integer, got {other:?}"
            ))),
        })
        .collect::<Result<_, _>>()?;
    let (allowed, remaining, reset, retry, banned) = match (ban, &ints[..]) {
        (false, &[a, r, s, t]) => (a, r, s, t, 0),
        (true, &[a, r, s, t, b]) if b <= 1 => (a, r, s, t, b),
        _ => {
            let n = if ban { 5 } else { 4 };
            return Err(protocol(format!("expected {n} integers, got {:?}", ints)));
        }
    };
    if allowed > 1 {
        return Err(protocol(format!(
            "expected 0 or 1 for allowed, got {allowed}"
        )));
    }
    let verdict = Verdict {
        allowed: allowed == 1,
        remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        reset_after_us: reset.unsigned_abs(),
        retry_after_us: retry.unsigned_abs(),
    };
    Ok((verdict, banned == 1))
}

/// Reads a refund script's reply, 0 (nothing to give back) or 1.
pub(crate) fn refunded(value: Value) -> Result<(), StoreError> {
    match value {
        Value::Int(0 | 1) => Ok(()),
        other => Err(protocol(format!(
            "a refund script answers 0 or 1, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratewarden_core::ErrorKind;

    #[test]
    fn replies_of_the_wrong_shape_are_protocol_errors() {
        let bad = [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Int(1); 3]),
            Value::Array(vec![
                Value::Int(2),
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(-1),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![Value::Nil; 4]),
        ];
        for v in bad {
            let e = verdict(v).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Protocol);
        }
        let ok = verdict(Value::Array(vec![
            Value::Int(1),
            Value::Int(4),
            Value::Int(9_007_199_254_740_991),
            Value::Int(0),
        ]))
        .unwrap();
        assert!(ok.allowed);
        assert_eq!(ok.reset_after_us, 9_007_199_254_740_991);
    }

    #[test]
    fn refund_replies_other_than_0_or_1_are_protocol_errors() {
        assert!(refunded(Value::Int(0)).is_ok());
        assert!(refunded(Value::Int(1)).is_ok());
        for v in [Value::Int(2), Value::Nil, Value::Okay] {
            assert_eq!(refunded(v).unwrap_err().kind(), ErrorKind::Protocol);
        }
    }

    #[test]
    fn every_algorithm_has_its_own_scripts() {
        for a in Algorithm::ALL {
            assert_ne!(script(a).get_hash(), refund_script(a).get_hash(), "{a}");
            for b in Algorithm::ALL.into_iter().filter(|b| *b != a) {
                assert_ne!(script(a).get_hash(), script(b).get_hash(), "{a} {b}");
            }
        }
    }
}
