//! A store is handed only arguments the core has checked: the constructors
//! refuse the rest, and a `Limiter` never calls a store with a key longer
//! than it accepts, on any operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ratewarden_core::{
    Capabilities, Decision, ErrorKind, FailurePolicy, Key, Limiter, ManualClock, Policy, Refund,
    Request, Rule, Store, StoreError, Timestamp, async_trait,
};
use ratewarden_test_support::stores::AwaitedStore;

/// The bound the spy declares: a rule's prefix (`r:`) and a client key of
/// up to 14 bytes.
const BOUND: usize = 16;

/// A correct store declaring a short key bound, which remembers the
/// longest key any of its operations was given.
#[derive(Debug, Default)]
struct Spy {
    inner: AwaitedStore,
    longest: AtomicUsize,
    calls: AtomicUsize,
}

impl Spy {
    fn saw(&self, key: &[u8]) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.longest.fetch_max(key.len(), Ordering::SeqCst);
    }
}

#[async_trait]
impl Store for Spy {
    fn name(&self) -> &'static str {
        "spy"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn max_key_len(&self) -> usize {
        BOUND
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.saw(request.key());
        self.inner.decide(request).await
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.saw(refund.request().key());
        self.inner.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.saw(request.key());
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.saw(key.as_bytes());
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.saw(request.key());
        self.inner.penalize(request).await
    }
}

fn policy() -> Policy {
    Policy::fixed_window(5, Duration::from_secs(60)).unwrap()
}

fn invalid(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    let e = result.expect_err("an invalid argument must be refused");
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    e.to_string()
}

#[test]
fn the_constructors_refuse_what_no_store_may_be_given() {
    let spy = Spy::default();
    let p = policy();
    let now = Timestamp::from_micros(0);
    for cost in [0, 6, u32::MAX] {
        let message = invalid(Request::new(&spy, b"k", &p, cost, now));
        assert!(message.contains("spy"), "{message}");
    }
    let long = [b'k'; BOUND + 1];
    let message = invalid(Request::new(&spy, &long, &p, 1, now));
    assert!(
        message.contains("17 bytes") && message.contains("limit of 16"),
        "{message}"
    );
    invalid(Key::new(&spy, &long));
    // Exactly the bound is a key.
    assert_eq!(
        Key::new(&spy, &long[..BOUND]).unwrap().as_bytes().len(),
        BOUND
    );
    // A refusal has nothing to give back.
    let refused = Decision::new(false, &p, 0, p.window(), p.window(), "spy");
    let request = Request::new(&spy, b"k", &p, 1, now).unwrap();
    invalid(Refund::new(request, &refused));
    // A batch of more than the limit is refused too.
    assert!(request.with_cost(6).is_err());
    assert_eq!(request.with_cost(5).unwrap().cost(), 5);
    assert_eq!(spy.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_key_over_the_bound_never_reaches_a_store() {
    let spy = Arc::new(Spy::default());
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(
            Rule::new("r", spy.clone() as Arc<dyn Store>, policy())
                .unwrap()
                .on_failure(FailurePolicy::Closed),
        )
        .build()
        .unwrap();
    // `r:` and 14 bytes: the longest key the store accepts.
    let fits = [b'a'; BOUND - 2];
    assert!(limiter.check(&fits).await.allowed);
    assert_eq!(limiter.peek(&fits).await.remaining, 4);
    limiter.penalize(&fits, 1).await.unwrap();
    limiter.reset(&fits).await.unwrap();
    assert_eq!(spy.longest.load(Ordering::SeqCst), BOUND);
    let calls = spy.calls.load(Ordering::SeqCst);

    // One byte more, on every operation: refused by the core, under the
    // rule's failure policy where a decision is due, an error otherwise.
    let over = [b'b'; BOUND - 1];
    let decided = limiter.check(&over).await;
    assert!(!decided.allowed && decided.source.degraded, "{decided:?}");
    let peeked = limiter.peek(&over).await;
    assert!(!peeked.allowed && peeked.source.degraded, "{peeked:?}");
    invalid(limiter.penalize(&over, 1).await);
    invalid(limiter.reset(&over).await);
    // Counted as the store's answer was before the core checked: the
    // check's, the penalty's and the reset's (a peek counts nothing).
    assert_eq!(limiter.rules()[0].stats().store_errors, 3);
    assert_eq!(
        spy.calls.load(Ordering::SeqCst),
        calls,
        "the store was called"
    );
    assert_eq!(spy.longest.load(Ordering::SeqCst), BOUND);
}

/// A store answering inline that keeps the last key it was asked to
/// decide: what the limiter built, byte for byte.
#[derive(Debug, Default)]
struct KeyRecorder {
    last: std::sync::Mutex<Vec<u8>>,
}

#[async_trait]
impl Store for KeyRecorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(&ratewarden_core::Algorithm::ALL)
    }

    fn max_key_len(&self) -> usize {
        4_096
    }

    fn decide_inline(&self, request: Request<'_>) -> Option<Result<Decision, StoreError>> {
        *self.last.lock().unwrap() = request.key().to_vec();
        let p = request.policy();
        Some(Ok(Decision::new(
            true,
            p,
            0,
            p.window(),
            Duration::ZERO,
            "recorder",
        )))
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.decide_inline(request).expect("answers inline")
    }

    async fn refund(&self, _: Refund<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.decide_inline(request).expect("answers inline")
    }

    async fn reset(&self, _: Key<'_>, _: &Policy) -> Result<(), StoreError> {
        Ok(())
    }

    async fn penalize(&self, _: Request<'_>) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The storage key is `{rule}:{key}` exactly, for every length of rule
/// name and every length of key around the limiter's stack buffer (where
/// it assembles the key word by word) and past it (on the heap).
#[test]
fn the_storage_key_is_the_rule_name_a_colon_and_the_key_at_every_length() {
    let clock = ManualClock::new();
    let key: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(37) | 1).collect();
    for name_len in 1..=ratewarden_core::MAX_RULE_NAME {
        let name: String = "abcdefghij".chars().cycle().take(name_len).collect();
        let store = Arc::new(KeyRecorder::default());
        let limiter = Limiter::builder()
            .clock(clock.clone())
            .rule(Rule::new(name.clone(), store.clone(), policy()).unwrap())
            .build()
            .unwrap();
        for key_len in (0..=72).chain([127 - name_len, 128 - name_len, 129 - name_len, 200]) {
            let key = &key[..key_len];
            let decided = limiter.try_check(key).expect("decided inline");
            assert!(decided.allowed, "{decided:?}");
            let mut expected = format!("{name}:").into_bytes();
            expected.extend_from_slice(key);
            assert_eq!(
                *store.last.lock().unwrap(),
                expected,
                "rule of {name_len} bytes, key of {key_len}"
            );
        }
    }
}
