//! Errors: what building a store can fail with, and how sqlx's errors map
//! onto [`StoreError`] kinds.

use std::time::Duration;

use ratewarden_core::{ConfigError, ErrorKind, StoreError};

use crate::NAME;

/// Building a [`PostgresStore`](crate::PostgresStore) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The configuration is invalid (malformed URL, bad schema name, zero
    /// pool size, TLS asked of a build without it, …).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The database could not be reached or failed while the schema was
    /// created or checked.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The schema was migrated by a newer version of this crate.
    #[error(
        "schema {schema:?} is at version {found}, but this build of ratewarden-postgres \
         understands versions up to {supported}: upgrade ratewarden-postgres or use another schema"
    )]
    SchemaTooNew {
        /// The schema.
        schema: String,
        /// The version found in its `_sqlx_migrations` table.
        found: i64,
        /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
        supported: i64,
    },
    /// The schema is older than this build and migrations are disabled.
    #[error(
        "schema {schema:?} is at version {found}, but this build of ratewarden-postgres needs \
         version {required} and migrations are disabled"
    )]
    SchemaOutdated {
        /// The schema.
        schema: String,
        /// The version found (0 when the schema holds no limiter tables).
        found: i64,
        /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION).
        required: i64,
    },
    /// The schema's recorded migrations do not match this build's (a
    /// migration was changed after it was applied, or one failed halfway).
    #[error("schema {schema:?} does not match this build of ratewarden-postgres: {reason}")]
    SchemaMismatch {
        /// The schema.
        schema: String,
        /// What does not match.
        reason: String,
    },
}

impl From<BuildError> for StoreError {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::Store(e) => e,
            BuildError::Config(c) => {
                StoreError::new(ErrorKind::InvalidRequest, NAME, c.to_string()).with_source(c)
            }
            other => StoreError::new(ErrorKind::Internal, NAME, other.to_string()),
        }
    }
}

/// An error of `what` that did not finish within `timeout`.
pub(crate) fn timed_out(what: &str, timeout: Duration) -> StoreError {
    StoreError::new(
        ErrorKind::Timeout,
        NAME,
        format!("{what}: no answer within {timeout:?}"),
    )
}

/// A database error after which the session is still sound: the server
/// answered it and is ready for the next statement. Anything else (I/O,
/// TLS, protocol, a lost or terminated session) leaves the connection in
/// an unknown state, so it is not used again.
pub(crate) fn leaves_connection_usable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => !db
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}

/// Classifies an sqlx error: transient failures (timeouts, lost or refused
/// connections) apart from protocol and internal ones.
pub(crate) fn store_error(what: &str, e: sqlx::Error) -> StoreError {
    let kind = match &e {
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        sqlx::Error::Protocol(_)
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::RowNotFound => ErrorKind::Protocol,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // query_canceled: statement_timeout fired.
            Some("57014") => ErrorKind::Timeout,
            // Connection exceptions, shutdown, too many connections,
            // serialization failures and deadlocks: worth retrying.
            Some(code)
                if code.starts_with("08")
                    || code.starts_with("57P")
                    || code.starts_with("53")
                    || code == "40001"
                    || code == "40P01" =>
            {
                ErrorKind::Unavailable
            }
            _ => ErrorKind::Internal,
        },
        _ => ErrorKind::Internal,
    };
    StoreError::new(kind, NAME, format!("{what}: {e}")).with_source(e)
}

/// Maps an sqlx error met while building the store.
pub(crate) fn sql(what: &'static str) -> impl FnOnce(sqlx::Error) -> BuildError {
    move |e| BuildError::Store(store_error(what, e))
}

/// A configuration error.
pub(crate) fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}
