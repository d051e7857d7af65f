//! The PostgreSQL backend's foundation (feature `postgres`, on by default): connecting, the
//! schema's versioned migrations (`migrations/*.sql`), the hash-chained log in a table
//! ([`log`]), and the task leases `metash worker` runs on ([`lease`]).
//!
//! Why PostgreSQL and these choices: docs/scale-out.md. In short, one schema `metash` holds
//! every project (a `project` column), every time that decides a lease is the database's own
//! clock (`now()`), and every ordering a crash could break is a row lock inside a transaction.

pub mod lease;
pub mod log;
pub mod store;

use std::time::Duration;

use crate::error::{Result, StoreError};

pub use postgres::{Client, Statement, Transaction};

/// The variable that holds the store's password: never in `.meta/config.toml` or a URL.
pub const PASSWORD_ENV: &str = "METASH_STORE_PASSWORD";

/// The schema's versions, in order: each applied once, in one transaction with its record.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "init", include_str!("../../migrations/0001_init.sql")),
    (2, "store", include_str!("../../migrations/0002_store.sql")),
    (3, "blobs", include_str!("../../migrations/0003_blobs.sql")),
];

/// An arbitrary fixed key for `pg_advisory_xact_lock`: two processes migrating at once take
/// turns, so each version is applied once.
const MIGRATION_LOCK: i64 = 0x6d65_7461_7368;

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        StoreError::Database(describe(&e))
    }
}

/// A database error with its SQLSTATE and message, never the connection string.
fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(why) => format!("{e}: {why}"),
        None => e.to_string(),
    }
}

/// Connects to `url` (`postgres://USER@HOST:PORT/DB`), with `password` when given.
///
/// # Errors
/// A URL that does not parse or holds a password ([`StoreError::Config`]: passwords come from
/// [`PASSWORD_ENV`]), or the server cannot be reached.
pub fn connect(url: &str, password: Option<&str>) -> Result<Client> {
    let mut config: postgres::Config = url
        .parse()
        .map_err(|e| StoreError::Config(format!("[store] url: {e}")))?;
    if config.get_password().is_some() {
        return Err(StoreError::Config(format!(
            "[store] url holds a password: remove it and set {PASSWORD_ENV}"
        )));
    }
    if let Some(p) = password {
        config.password(p);
    }
    config
        .application_name("metash")
        .connect_timeout(Duration::from_secs(10))
        .keepalives_idle(Duration::from_secs(10));
    Ok(config.connect(postgres::NoTls)?)
}

/// Brings the schema up to this build's version; returns it.
///
/// # Errors
/// The database is at a newer version than this build knows ([`StoreError::NewerVersion`]),
/// or a statement failed (nothing of that version is applied).
pub fn migrate(client: &mut Client) -> Result<i32> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS metash;
         CREATE TABLE IF NOT EXISTS metash.migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )?;
    let at: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM metash.migrations",
            &[],
        )?
        .get(0);
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if at > latest {
        return Err(StoreError::NewerVersion {
            path: "metash.migrations".into(),
            what: "the PostgreSQL schema".into(),
            found: at.to_string(),
            supported: latest.to_string(),
        });
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > at) {
        tx.batch_execute(sql)?;
        tx.execute(
            "INSERT INTO metash.migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )?;
    }
    tx.commit()?;
    Ok(latest)
}

/// A connection with the statements metash runs often, prepared once: with rust-postgres a
/// query given as text is parsed by the server at every call, one more round trip each.
pub struct Db {
    pub(crate) client: Client,
    pub(crate) s: log::Statements,
    pub(crate) l: lease::Statements,
}

impl Db {
    /// Connects, brings the schema up to date, and prepares the statements.
    ///
    /// # Errors
    /// As [`connect`] and [`migrate`].
    pub fn open(url: &str, password: Option<&str>) -> Result<Self> {
        let mut client = connect(url, password)?;
        migrate(&mut client)?;
        let s = log::Statements::prepare(&mut client)?;
        let l = lease::Statements::prepare(&mut client)?;
        Ok(Self { client, s, l })
    }

    /// The connection, for queries of one's own.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }
}
