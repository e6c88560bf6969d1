//! Errors: configuration refused at construction, and store failures at
//! decision time.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::algorithm::Algorithm;

/// A configuration the limiter refuses. Returned when a policy, store or
/// limiter is built, never at the first request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A limit of zero would refuse every request; say so explicitly instead.
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// The window is empty.
    #[error("window must be at least {min:?}, got {got:?}")]
    WindowTooShort {
        /// The window that was given.
        got: Duration,
        /// The shortest accepted window.
        min: Duration,
    },
    /// The window is longer than any backend keeps state for.
    #[error("window must be at most {max:?}, got {got:?}")]
    WindowTooLong {
        /// The window that was given.
        got: Duration,
        /// The longest accepted window.
        max: Duration,
    },
    /// The window is not a whole number of microseconds, the unit every
    /// backend stores.
    #[error("window must be a whole number of microseconds, got {0:?}")]
    WindowNotWholeMicros(Duration),
    /// The limit is larger than the algorithm (or a backend) can represent
    /// exactly.
    #[error("limit {limit} is too large for {algorithm}: at most {max} with this window")]
    LimitTooLarge {
        /// The algorithm.
        algorithm: Algorithm,
        /// The limit that was given.
        limit: u64,
        /// The largest accepted limit for this algorithm and window.
        max: u64,
    },
    /// A request cost of zero, or one above the limit, which could never be
    /// admitted.
    #[error("cost {cost} is invalid for a limit of {limit}: it must be between 1 and the limit")]
    InvalidCost {
        /// The cost that was given.
        cost: u32,
        /// The policy's limit.
        limit: u32,
    },
    /// The store does not implement this algorithm.
    #[error("the {store} store does not support the {algorithm} algorithm")]
    UnsupportedAlgorithm {
        /// The store's name.
        store: &'static str,
        /// The algorithm that was asked for.
        algorithm: Algorithm,
    },
    /// The store does not keep bans ([`Capabilities::bans`](crate::Capabilities::bans)).
    #[error(
        "the {store} store does not keep bans: use a store that does (memory, redis, postgres) \
         without leases, or drop the policy's ban"
    )]
    UnsupportedBan {
        /// The store's name.
        store: &'static str,
    },
    /// A secret used to derive client keys is too short to resist guessing.
    #[error("secret must be at least {min} bytes, got {got}")]
    SecretTooShort {
        /// The length that was given.
        got: usize,
        /// The shortest accepted length.
        min: usize,
    },
    /// A store URL or address that cannot be used.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Any other invalid setting, with a message naming it.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// What kind of failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The store did not answer within its timeout.
    Timeout,
    /// The store could not be reached, or dropped the connection.
    Unavailable,
    /// The store answered something the client could not interpret.
    Protocol,
    /// The request itself is invalid (for example a cost above the limit);
    /// retrying it will not help.
    InvalidRequest,
    /// The circuit breaker is open: the store was not called at all.
    CircuitOpen,
    /// Any other failure inside the store.
    Internal,
    /// The store does not implement the operation (for example
    /// [`Store::refund`](crate::Store::refund) on a store written before it
    /// existed). Retrying will not help.
    Unsupported,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Protocol => "protocol error",
            ErrorKind::InvalidRequest => "invalid request",
            ErrorKind::CircuitOpen => "circuit open",
            ErrorKind::Internal => "internal error",
            ErrorKind::Unsupported => "unsupported",
        })
    }
}

/// A store failed to make a decision.
///
/// It keeps its source error and says whether it is transient, which is what
/// the failure policy of a [`Limiter`](crate::Limiter) acts on.
///
/// One pointer wide: a store's answer is a `Result<Decision, StoreError>`
/// on every decision, and an error is rare, so its parts live behind a box
/// rather than widening every answer that is moved on the way back.
pub struct StoreError {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    store: &'static str,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("StoreError")
            .field("kind", &inner.kind)
            .field("store", &inner.store)
            .field("message", &inner.message)
            .field("source", &inner.source)
            .finish()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        write!(
            f,
            "{} store: {}: {}",
            inner.store, inner.kind, inner.message
        )
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl StoreError {
    /// A new error of `kind` from the store named `store`.
    pub fn new(kind: ErrorKind, store: &'static str, message: impl Into<String>) -> Self {
        StoreError {
            inner: Box::new(Inner {
                kind,
                store,
                message: message.into(),
                source: None,
            }),
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.inner.source = Some(Box::new(source));
        self
    }

    /// A timeout after `after`.
    pub fn timeout(store: &'static str, after: Duration) -> Self {
        Self::new(
            ErrorKind::Timeout,
            store,
            format!("no answer within {after:?}"),
        )
    }

    /// A request refused before reaching the store because it is invalid.
    pub fn invalid_request(store: &'static str, error: ConfigError) -> Self {
        Self::new(ErrorKind::InvalidRequest, store, error.to_string()).with_source(error)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The name of the store that failed.
    pub fn store(&self) -> &'static str {
        self.inner.store
    }

    /// Whether the same call may succeed later (timeouts, lost connections,
    /// an open circuit); invalid requests and protocol errors are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.inner.kind,
            ErrorKind::Timeout | ErrorKind::Unavailable | ErrorKind::CircuitOpen
        )
    }
}
