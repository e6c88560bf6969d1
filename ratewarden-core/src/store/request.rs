//! The arguments a [`Store`] is given, checked once, by this crate, before
//! any store sees them: a store never validates a cost, a key's length or a
//! refund's decision, so every backend refuses the same mistakes with the
//! same error, and none can forget to.

use std::fmt;

use crate::decision::Decision;
use crate::error::{ConfigError, ErrorKind, StoreError};
use crate::policy::Policy;
use crate::time::Timestamp;

use super::Store;

/// A key no longer than the store it was checked for accepts
/// ([`Store::max_key_len`]).
///
/// Made by [`Key::new`] (or inside [`Request::new`]); a store may take its
/// length as given. Its `Debug` shows the length, never the bytes, which
/// may be a client's data.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key<'a>(&'a [u8]);

impl<'a> Key<'a> {
    /// Checks `bytes` against `store`'s [`max_key_len`](Store::max_key_len):
    /// a longer key is an [`InvalidRequest`](ErrorKind::InvalidRequest)
    /// error naming both lengths (never the key).
    ///
    /// ```
    /// use ratewarden_memory::MemoryStore;
    /// use ratewarden_core::{ErrorKind, Key, DEFAULT_MAX_KEY_LEN};
    ///
    /// let store = MemoryStore::default();
    /// assert_eq!(Key::new(&store, b"client:42")?.as_bytes(), b"client:42");
    /// let long = vec![b'k'; DEFAULT_MAX_KEY_LEN + 1];
    /// assert_eq!(Key::new(&store, &long).unwrap_err().kind(), ErrorKind::InvalidRequest);
    /// # Ok::<(), ratewarden_core::StoreError>(())
    /// ```
    pub fn new<S: Store + ?Sized>(store: &S, bytes: &'a [u8]) -> Result<Self, StoreError> {
        // The name only for the error: through `&dyn Store`, each is a
        // call, which a key within the bound is spared.
        let max = store.max_key_len();
        if bytes.len() > max {
            return Err(too_long(store.name(), bytes.len(), max));
        }
        Ok(Key(bytes))
    }

    /// [`new`](Self::new) with the store's name and bound already read,
    /// for a caller that keeps them (a rule, on every request): one
    /// comparison, the error built out of line.
    #[inline]
    pub(crate) fn within(
        store: &'static str,
        bytes: &'a [u8],
        max: usize,
    ) -> Result<Self, StoreError> {
        if bytes.len() > max {
            return Err(too_long(store, bytes.len(), max));
        }
        Ok(Key(bytes))
    }

    /// The key's bytes.
    #[inline]
    pub fn as_bytes(self) -> &'a [u8] {
        self.0
    }
}

impl AsRef<[u8]> for Key<'_> {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self.0
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

/// One request's arguments to [`Store::decide`] (and its inline form,
/// [`peek`](Store::peek) and [`penalize`](Store::penalize)): a [`Key`] the
/// store accepts, a policy, a cost the policy can admit (`1..=limit`) and
/// the time to decide at.
///
/// It is checked for the store it was made for: hand it to that store (or
/// to one that forwards to it), since another may accept shorter keys.
///
/// ```
/// use std::time::Duration;
/// use ratewarden_memory::MemoryStore;
/// use ratewarden_core::{ErrorKind, Policy, Request, Store, Timestamp};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::default();
/// let policy = Policy::fixed_window(3, Duration::from_secs(60))?;
/// let now = Timestamp::from_micros(1_767_225_600_000_000);
/// let request = Request::new(&store, b"client:42", &policy, 1, now)?;
/// assert_eq!(store.decide(request).await?.remaining, 2);
///
/// // A cost the policy could never admit is refused before any store sees it.
/// let err = Request::new(&store, b"client:42", &policy, 4, now).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidRequest);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    key: Key<'a>,
    policy: &'a Policy,
    cost: u32,
    now: Timestamp,
}

impl<'a> Request<'a> {
    /// Checks a request for `store`: a cost of zero or above the policy's
    /// limit, then a key longer than the store accepts, is an
    /// [`InvalidRequest`](ErrorKind::InvalidRequest) error, in that order.
    pub fn new<S: Store + ?Sized>(
        store: &S,
        key: &'a [u8],
        policy: &'a Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Self, StoreError> {
        if !policy.admits_cost(cost) {
            return Err(invalid_cost(store.name(), policy, cost));
        }
        Ok(Request::checked(Key::new(store, key)?.0, policy, cost, now))
    }

    /// A request whose cost the caller has checked against `policy` (a
    /// [`Limiter`](crate::Limiter) checks a request's cost once, for
    /// every rule, before any store is asked) and whose key it has checked
    /// against the store's bound ([`Key::within`]).
    #[inline]
    pub(crate) fn checked(key: &'a [u8], policy: &'a Policy, cost: u32, now: Timestamp) -> Self {
        debug_assert!(policy.validate_cost(cost).is_ok());
        Request {
            key: Key(key),
            policy,
            cost,
            now,
        }
    }

    /// The same request for `cost` units instead (a store that buys units
    /// in batches asks its own store for more than one request's worth);
    /// refuses a cost the policy cannot admit.
    pub fn with_cost(self, cost: u32) -> Result<Self, ConfigError> {
        self.policy.validate_cost(cost)?;
        Ok(Request { cost, ..self })
    }

    /// The key.
    #[inline]
    pub fn key(&self) -> &'a [u8] {
        self.key.0
    }

    /// The policy to apply.
    #[inline]
    pub fn policy(&self) -> &'a Policy {
        self.policy
    }

    /// The units the request asks for: at least 1, at most the policy's
    /// limit.
    #[inline]
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The time to decide at (ignored by a store on its server's clock).
    #[inline]
    pub fn now(&self) -> Timestamp {
        self.now
    }
}

/// One admission to undo ([`Store::refund`]): the request that was
/// admitted, and the admitting decision, which is checked to be an
/// admission.
///
/// The decision locates the admission by its `reset_after` (a
/// [`Limiter`](crate::Limiter) keeps only that and `allowed`).
#[derive(Clone, Copy, Debug)]
pub struct Refund<'a> {
    request: Request<'a>,
    admitted: &'a Decision,
}

impl<'a> Refund<'a> {
    /// Pairs a request with the decision that admitted it. A refusal is an
    /// [`InvalidRequest`](ErrorKind::InvalidRequest) error: there is
    /// nothing to give back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden_memory::MemoryStore;
    /// use ratewarden_core::{Policy, Refund, Request, Store, Timestamp};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::default();
    /// let policy = Policy::fixed_window(3, Duration::from_secs(60))?;
    /// let request = Request::new(&store, b"k", &policy, 1, Timestamp::from_micros(0))?;
    /// let admitted = store.decide(request).await?;
    /// store.refund(Refund::new(request, &admitted)?).await?;
    /// assert_eq!(store.peek(request).await?.remaining, 2); // as if never admitted
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(request: Request<'a>, admitted: &'a Decision) -> Result<Self, StoreError> {
        if !admitted.allowed {
            return Err(StoreError::new(
                ErrorKind::InvalidRequest,
                admitted.source.store,
                "only an admitted decision can be refunded",
            ));
        }
        Ok(Refund { request, admitted })
    }

    /// The admitted request.
    #[inline]
    pub fn request(&self) -> Request<'a> {
        self.request
    }

    /// The decision that admitted it.
    #[inline]
    pub fn admitted(&self) -> &'a Decision {
        self.admitted
    }
}

/// The error for a cost `policy` can never admit.
#[cold]
#[inline(never)]
fn invalid_cost(store: &'static str, policy: &Policy, cost: u32) -> StoreError {
    let e = ConfigError::InvalidCost {
        cost,
        limit: policy.limit(),
    };
    StoreError::invalid_request(store, e)
}

/// The error for a key of `len` bytes over a bound of `max`, naming both
/// lengths and never the key, which may be a client's data.
#[cold]
#[inline(never)]
fn too_long(store: &'static str, len: usize, max: usize) -> StoreError {
    StoreError::new(
        ErrorKind::InvalidRequest,
        store,
        format!("key of {len} bytes is longer than the store's limit of {max}"),
    )
}
