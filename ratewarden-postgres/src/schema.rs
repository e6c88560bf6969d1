//! The schema: its name's rules, embedded migrations run inside it, and
//! the version check that refuses a schema of another build.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use ratewarden_core::ConfigError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::error::{BuildError, invalid, sql, store_error};
use crate::quote_ident;

/// The schema version this build creates and understands: the number of the
/// last embedded migration.
pub const SCHEMA_VERSION: i64 = 5;

/// The embedded migrations, in order. Applied ones are never edited (their
/// checksums are checked against deployed schemas); changes are new files.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "state tables",
        include_str!("../migrations/0001_state_tables.sql"),
    ),
    (
        2,
        "refunds and bounded abuse events",
        include_str!("../migrations/0002_refunds_and_bounded_abuse_events.sql"),
    ),
    (3, "peeks", include_str!("../migrations/0003_peeks.sql")),
    (
        4,
        "penalties",
        include_str!("../migrations/0004_penalties.sql"),
    ),
    (5, "bans", include_str!("../migrations/0005_bans.sql")),
];

/// The tables that hold per-key state, bans included, switched between
/// logged and unlogged.
const STATE_TABLES: [&str; 5] = [
    "sliding_log",
    "fixed_window",
    "sliding_window",
    "gcra",
    "bans",
];

/// What building a store asks of its schema.
pub(crate) struct SchemaPlan<'a> {
    /// The schema's name, already validated.
    pub schema: &'a str,
    /// Whether migrations may run.
    pub migrate: bool,
    /// Whether the state tables are to be unlogged.
    pub unlogged: bool,
}

/// The embedded migrations as a source for sqlx's migrator.
#[derive(Debug)]
struct Embedded;

impl<'s> MigrationSource<'s> for Embedded {
    fn resolve(
        self,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Vec<Migration>, Box<dyn std::error::Error + Send + Sync>>>
                + Send
                + 's,
        >,
    > {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|(version, description, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*description),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// Creates or checks the schema through a one-connection pool whose
/// `search_path` is the schema, so that the migrations and sqlx's
/// `_sqlx_migrations` table land there.
///
/// Boxed as `Send` here, with concrete lifetimes: left to inference inside
/// callers' futures, sqlx's migrator trips rustc's higher-ranked `Send`
/// check.
pub(crate) fn prepare_schema<'a>(
    options: &'a PgConnectOptions,
    plan: &'a SchemaPlan<'a>,
) -> Pin<Box<dyn Future<Output = Result<(), BuildError>> + Send + 'a>> {
    Box::pin(async move {
        let options = options
            .clone()
            .options([("search_path", quote_ident(plan.schema))]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| BuildError::Store(store_error("connecting", e)))?;
        let result = prepare_schema_on(&pool, plan).await;
        pool.close().await;
        result
    })
}

async fn prepare_schema_on(pool: &PgPool, plan: &SchemaPlan<'_>) -> Result<(), BuildError> {
    let schema = plan.schema;
    let s = quote_ident(schema);
    let found: bool = sqlx::query_scalar(
        "SELECT to_regclass(format('%I._sqlx_migrations', $1::text)) IS NOT NULL",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .map_err(sql("checking the schema"))?;
    let found = if found {
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT max(version) FROM {s}._sqlx_migrations"
        ))
        .fetch_one(pool)
        .await
        .map_err(sql("reading the schema version"))?
        .unwrap_or(0)
    } else {
        0
    };
    if found > SCHEMA_VERSION {
        return Err(BuildError::SchemaTooNew {
            schema: schema.to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if !plan.migrate && found < SCHEMA_VERSION {
        return Err(BuildError::SchemaOutdated {
            schema: schema.to_string(),
            found,
            required: SCHEMA_VERSION,
        });
    }
    let migrator = Migrator::new(Embedded)
        .await
        .map_err(|e| BuildError::SchemaMismatch {
            schema: schema.to_string(),
            reason: e.to_string(),
        })?;
    if plan.migrate {
        match sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
            .execute(pool)
            .await
        {
            Ok(_) => {}
            // Another store created it at the same moment: IF NOT EXISTS is
            // not safe against itself.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P06") | Some("23505")) => {}
            Err(e) => return Err(sql("creating the schema")(e)),
        }
        migrator.run(pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(e) => sql("migrating the schema")(e),
            other => BuildError::SchemaMismatch {
                schema: schema.to_string(),
                reason: other.to_string(),
            },
        })?;
    } else {
        // Checks the applied migrations' checksums without changing anything.
        let applied: Vec<(i64, Vec<u8>, bool)> = sqlx::query_as(&format!(
            "SELECT version, checksum, success FROM {s}._sqlx_migrations"
        ))
        .fetch_all(pool)
        .await
        .map_err(sql("reading applied migrations"))?;
        for (version, checksum, success) in applied {
            let ours = migrator.iter().find(|m| m.version == version);
            if !success || ours.is_none_or(|m| *m.checksum != *checksum) {
                return Err(BuildError::SchemaMismatch {
                    schema: schema.to_string(),
                    reason: format!("migration {version} differs from this build's"),
                });
            }
        }
    }

    for table in STATE_TABLES {
        let persistence: String = sqlx::query_scalar(
            "SELECT relpersistence::text FROM pg_class \
             WHERE oid = to_regclass(format('%I.%I', $1::text, $2::text))",
        )
        .bind(schema)
        .bind(table)
        .fetch_one(pool)
        .await
        .map_err(sql("reading table persistence"))?;
        let unlogged = persistence == "u";
        if unlogged != plan.unlogged {
            let mode = if plan.unlogged { "UNLOGGED" } else { "LOGGED" };
            sqlx::query(&format!("ALTER TABLE {s}.{table} SET {mode}"))
                .execute(pool)
                .await
                .map_err(sql("switching table persistence"))?;
        }
    }
    Ok(())
}

/// Refuses a schema name that is not a plain identifier, so that it can be
/// quoted into statements as it is.
pub(crate) fn validate_schema(schema: &str) -> Result<(), ConfigError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !schema.as_bytes()[0].is_ascii_digit()
        && !schema.to_ascii_lowercase().starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "postgres schema {schema:?} must be 1 to 63 ASCII letters, digits or underscores, \
             not starting with a digit or pg_"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(validate_schema("ratewarden").is_ok());
        assert!(validate_schema("Limiter_2").is_ok());
        for bad in ["", "1abc", "pg_x", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad}");
        }
    }
}
