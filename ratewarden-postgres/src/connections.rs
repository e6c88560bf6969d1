//! The connections decisions, refunds and abuse events run on.
//!
//! # Why the store holds its own connections
//!
//! sqlx's pool pings every connection when it is returned (an empty `Sync`
//! and its `ReadyForQuery`, in sqlx-core 0.8's `return_to_pool`), whatever
//! `test_before_acquire` says, so each decision through a `PgPool` costs two
//! exchanges on the wire instead of one. The ping exists because a
//! connection whose statement was abandoned half-way may be returned in an
//! unknown state; here the checkout knows that: a connection goes back only
//! after its statement finished, or failed with an error the server
//! answered, and is dropped otherwise (timeout, cancelled caller, I/O or
//! protocol error), so the next caller opens a fresh one. Nothing is sent
//! but the statement.
//!
//! Why not `deadpool` with a `recycle` that sends nothing: it removes the
//! ping as well, but returns a dropped object to its pool whatever state
//! its statement left it in, and would need a flag checked by `recycle` to
//! discard it; this pool is that flag and a semaphore, without a
//! dependency. Both reach the rate of one bare connection, which a `PgPool`
//! does not, since it pings each connection it hands out.
//!
//! An application's own `PgPool`
//! ([`builder_with_pool`](crate::PostgresStore::builder_with_pool)) is used
//! as it is, pings included.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use ratewarden_core::{ErrorKind, StoreError};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, Postgres};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, error::Elapsed, timeout_at};

use crate::NAME;
use crate::error::{leaves_connection_usable, store_error, timed_out};

/// Where the store's statements on the request path run.
pub(crate) enum Connections {
    /// Connections the store opens and holds: one exchange per statement.
    Own(Box<OwnConnections>),
    /// An application's pool, pinging each connection it gets back.
    Pool(PgPool),
}

/// At most `size` connections, opened when first needed and kept open,
/// handed out oldest-idle first so that every open connection stays in
/// use.
pub(crate) struct OwnConnections {
    options: PgConnectOptions,
    size: usize,
    /// One permit per connection that may be open: holding one is the
    /// right to an idle connection or to open a new one.
    permits: Semaphore,
    idle: Mutex<VecDeque<PgConnection>>,
}

impl OwnConnections {
    /// Up to `size` connections with `options`; none is opened yet.
    pub(crate) fn new(options: PgConnectOptions, size: usize) -> Self {
        OwnConnections {
            options,
            size,
            permits: Semaphore::new(size),
            idle: Mutex::new(VecDeque::with_capacity(size)),
        }
    }

    fn idle_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<PgConnection>> {
        // A panic while the lock was held cannot leave the queue half
        // changed (each use is one push or pop), so a poisoned lock is
        // still a sound queue.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for OwnConnections {
    fn drop(&mut self) {
        let idle: Vec<PgConnection> = self.idle_queue().drain(..).collect();
        if idle.is_empty() {
            return;
        }
        // A Terminate message lets the server end each session quietly,
        // rather than log an unexpected end of file for it; without a
        // runtime the sockets are simply closed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for connection in idle {
                    let _ = tokio::time::timeout(Duration::from_secs(1), connection.close()).await;
                }
            });
        }
    }
}

impl Connections {
    /// A connection for one statement, waiting for a free one and opening
    /// it if needed, until `deadline`; `timeout` names the bound in errors.
    pub(crate) async fn checkout(
        &self,
        what: &str,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Checkout<'_>, StoreError> {
        let held = match self {
            Connections::Own(own) => {
                let own: &OwnConnections = own;
                let permit = timeout_at(deadline, own.permits.acquire())
                    .await
                    .map_err(|_| {
                        StoreError::new(
                            ErrorKind::Timeout,
                            NAME,
                            format!(
                                "{what}: none of the store's {} connections was free within \
                                 {timeout:?}",
                                own.size
                            ),
                        )
                    })?
                    .map_err(|_| {
                        StoreError::new(ErrorKind::Unavailable, NAME, "the store is closing")
                    })?;
                let idle = own.idle_queue().pop_front();
                let connection = match idle {
                    Some(connection) => connection,
                    None => timeout_at(deadline, own.options.connect())
                        .await
                        .map_err(|_| timed_out(&format!("{what}: connecting"), timeout))?
                        .map_err(|e| store_error(&format!("{what}: connecting"), e))?,
                };
                Held::Own {
                    owner: own,
                    connection: Some(connection),
                    _permit: permit,
                }
            }
            Connections::Pool(pool) => {
                let connection = timeout_at(deadline, pool.acquire())
                    .await
                    .map_err(|_| timed_out(&format!("{what}: waiting for a connection"), timeout))?
                    .map_err(|e| store_error(what, e))?;
                Held::Pool(connection)
            }
        };
        Ok(Checkout {
            held,
            deadline,
            timeout,
        })
    }
}

/// One connection, lent for one statement. Dropped without
/// [`end`](Checkout::end) seeing the statement end, its connection is
/// closed, never reused: the statement may still be on the wire.
pub(crate) struct Checkout<'a> {
    held: Held<'a>,
    deadline: Instant,
    timeout: Duration,
}

enum Held<'a> {
    Own {
        owner: &'a OwnConnections,
        /// `None` only once given back.
        connection: Option<PgConnection>,
        /// Released after the connection is back in the queue, so whoever
        /// it wakes finds it there.
        _permit: SemaphorePermit<'a>,
    },
    Pool(PoolConnection<Postgres>),
}

impl Checkout<'_> {
    /// When the statement must have been answered.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The connection to run the statement on.
    pub(crate) fn connection(&mut self) -> &mut PgConnection {
        match &mut self.held {
            Held::Own { connection, .. } => connection
                .as_mut()
                .expect("a checkout holds its connection until it is ended"),
            Held::Pool(connection) => connection,
        }
    }

    /// Ends the checkout with the statement's outcome (`Err` if the deadline
    /// passed): keeps the connection if the session is sound, closes it
    /// otherwise, and maps a failure to a [`StoreError`] of `what`.
    pub(crate) fn end<T>(
        mut self,
        what: &str,
        outcome: Result<Result<T, sqlx::Error>, Elapsed>,
    ) -> Result<T, StoreError> {
        let reusable = match &outcome {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => leaves_connection_usable(e),
            Err(_) => false,
        };
        match &mut self.held {
            Held::Own {
                owner, connection, ..
            } => {
                if let Some(connection) = connection.take().filter(|_| reusable) {
                    owner.idle_queue().push_back(connection);
                }
            }
            Held::Pool(connection) => {
                if !reusable {
                    connection.close_on_drop();
                }
            }
        }
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(store_error(what, e)),
            Err(_) => Err(timed_out(what, self.timeout)),
        }
    }
}
