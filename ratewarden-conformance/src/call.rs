//! A store called with plain arguments, as a test calls it: each function
//! builds the checked arguments ([`Request::new`], [`Refund::new`],
//! [`Key::new`]) and makes the call, so an argument no store may be given
//! comes back as the `InvalidRequest` error those constructors answer,
//! where a test can assert it.
//!
//! ```
//! use std::time::Duration;
//! use ratewarden_conformance::broken::ReferenceStore;
//! use ratewarden_conformance::call;
//! use ratewarden_conformance::ratewarden_core::{ErrorKind, Policy, Timestamp};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = ReferenceStore::new(100);
//! let policy = Policy::fixed_window(2, Duration::from_secs(1)).unwrap();
//! let now = Timestamp::from_micros(0);
//! assert!(call::decide(&store, b"k", &policy, 2, now).await.unwrap().allowed);
//! let err = call::decide(&store, b"k", &policy, 3, now).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::InvalidRequest);
//! # }
//! ```

use ratewarden_core::{Decision, Key, Policy, Refund, Request, Store, StoreError, Timestamp};

/// [`Store::decide`].
pub async fn decide<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
    cost: u32,
    now: Timestamp,
) -> Result<Decision, StoreError> {
    store
        .decide(Request::new(store, key, policy, cost, now)?)
        .await
}

/// [`Store::decide_inline`]: `Some` error for arguments no store may be
/// given, as a store answering inline would have.
pub fn decide_inline<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
    cost: u32,
    now: Timestamp,
) -> Option<Result<Decision, StoreError>> {
    match Request::new(store, key, policy, cost, now) {
        Ok(request) => store.decide_inline(request),
        Err(e) => Some(Err(e)),
    }
}

/// [`Store::refund`] of `admitted`.
pub async fn refund<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
    cost: u32,
    now: Timestamp,
    admitted: &Decision,
) -> Result<(), StoreError> {
    let request = Request::new(store, key, policy, cost, now)?;
    store.refund(Refund::new(request, admitted)?).await
}

/// [`Store::refund_inline`] of `admitted`: `Some` error for arguments no
/// store may be given.
pub fn refund_inline<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
    cost: u32,
    now: Timestamp,
    admitted: &Decision,
) -> Option<Result<(), StoreError>> {
    let refund = Request::new(store, key, policy, cost, now)
        .and_then(|request| Refund::new(request, admitted));
    match refund {
        Ok(refund) => store.refund_inline(refund),
        Err(e) => Some(Err(e)),
    }
}

/// [`Store::peek`].
pub async fn peek<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
    cost: u32,
    now: Timestamp,
) -> Result<Decision, StoreError> {
    store
        .peek(Request::new(store, key, policy, cost, now)?)
        .await
}

/// [`Store::penalize`].
pub async fn penalize<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
    cost: u32,
    now: Timestamp,
) -> Result<(), StoreError> {
    store
        .penalize(Request::new(store, key, policy, cost, now)?)
        .await
}

/// [`Store::reset`].
pub async fn reset<S: Store + ?Sized>(
    store: &S,
    key: &[u8],
    policy: &Policy,
) -> Result<(), StoreError> {
    store.reset(Key::new(store, key)?, policy).await
}
