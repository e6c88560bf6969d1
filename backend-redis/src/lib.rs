//! A Redis store for the limiter workspace: one script call per decision.
//!
//! [`RedisStore`] runs each of the four algorithms of
//! [`limiter_core::algorithm`] as a Lua script, so a decision is exactly one
//! `EVALSHA` round trip (the script is loaded once per server and reloaded
//! if the server answers `NOSCRIPT`). Nothing is read by the client and
//! written back: the check and the update are one atomic script.
//!
//! * **Time** comes from the caller (`now` in [`Store::decide`]), so a
//!   [`ManualClock`](limiter_core::ManualClock) drives Redis exactly as it
//!   drives the memory store. A fleet whose hosts' clocks disagree can use
//!   the server's clock instead ([`RedisStoreBuilder::server_clock`]): every
//!   host then agrees on time, at the price of tests that cannot move time
//!   and of the server's clock being the one that matters.
//! * **Keys**: `<prefix>{<16 hex digits>}:<algorithm>:<user key>`. The
//!   braces are a Redis Cluster hash tag over a stable 64-bit FNV-1a hash of
//!   the user key, so a key with `{` or `}` in it cannot move the tag, and
//!   the user key itself is stored raw (a 10 KB key costs 10 KB, not 20).
//!   Any byte string is a valid key. Every key carries a TTL of the time its
//!   state stays meaningful plus a margin, so Redis memory is bounded by live
//!   windows; the TTL is garbage collection, never part of a decision.
//!   A fixed or sliding window's expiry is set when the window opens and
//!   never moved by the hits it counts; a log's and GCRA's state lives as
//!   long as its last *admitted* request says (the newest entry, the
//!   theoretical arrival time), so only admissions set it. A refusal
//!   records nothing and never moves an expiry.
//! * **Failures**: every call is bounded by a timeout (default
//!   [`DEFAULT_TIMEOUT`]); a dead, paused or misbehaving server becomes a
//!   [`StoreError`] of kind `Timeout`, `Unavailable` or `Protocol`, never a
//!   hang or a panic.
//! * **Refunds** ([`Store::refund`]) are one `EVALSHA` of a refund script
//!   per algorithm ([`refund_script_source`]), on the decision's own key
//!   (so the same Redis Cluster slot), under the same timeout. They give
//!   back exactly the units the admission wrote, or nothing when the key no
//!   longer holds them; they never create a key and never touch a TTL. A
//!   store in [server-clock mode](RedisStoreBuilder::server_clock) refuses
//!   them with [`ErrorKind::Unsupported`]: the admission's time, which
//!   locates its units, was the server's and is not known to the caller.
//! * **Connections** are opened lazily by the first decision, on the runtime
//!   that makes it, and then shared: one multiplexed connection (the redis
//!   crate's `ConnectionManager`, which reconnects on its own), or a cluster
//!   connection for `redis+cluster://` URLs.
//!
//! ```no_run
//! use limiter_core::{Policy, Store, Timestamp};
//! use limiter_redis::RedisStore;
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .key_prefix("myapp:rl:")
//!     .timeout(Duration::from_millis(100))
//!     .build()?;
//! let policy = Policy::gcra(10, Duration::from_secs(1))?;
//! let decision = store
//!     .decide(b"client-42", &policy, 1, Timestamp::now_system())
//!     .await?;
//! assert!(decision.allowed);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use limiter_core::algorithm::Verdict;
use limiter_core::{
    Algorithm, Capabilities, ConfigError, Decision, ErrorKind, MAX_EXACT, Policy, Store,
    StoreError, Timestamp,
};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script, ScriptInvocation, Value};
use tokio::sync::OnceCell;

/// The name this store reports in decisions and errors.
pub const STORE_NAME: &str = "redis";

/// The default bound on one decision, connection included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "limiter:";

/// The default time a key outlives the moment its state becomes
/// meaningless. It only matters when the caller's clock runs slower than
/// real time (a manual clock in tests): a key must not vanish while its
/// window is still open in the caller's time.
pub const DEFAULT_EXPIRY_MARGIN: Duration = Duration::from_secs(1);

const ALGORITHMS: &[Algorithm] = &Algorithm::ALL;

macro_rules! script {
    ($file:literal) => {
        concat!(include_str!("scripts/header.lua"), include_str!($file))
    };
}

/// The Lua source of the script that applies `algorithm`, as the store sends
/// it. Exposed so that a benchmark can run the very same script with
/// `redis-benchmark`, and so that operators can audit it.
pub fn script_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingLog => script!("scripts/sliding_log.lua"),
        Algorithm::FixedWindow => script!("scripts/fixed_window.lua"),
        Algorithm::SlidingWindow => script!("scripts/sliding_window.lua"),
        Algorithm::Gcra => script!("scripts/gcra.lua"),
    }
}

macro_rules! refund_script {
    ($file:literal) => {
        concat!(
            include_str!("scripts/refund_header.lua"),
            include_str!($file)
        )
    };
}

/// The Lua source of the script that refunds an admission under
/// `algorithm` (see [`Store::refund`]), as the store sends it; exposed for
/// audit like [`script_source`].
pub fn refund_script_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingLog => refund_script!("scripts/refund_sliding_log.lua"),
        Algorithm::FixedWindow => refund_script!("scripts/refund_fixed_window.lua"),
        Algorithm::SlidingWindow => refund_script!("scripts/refund_sliding_window.lua"),
        Algorithm::Gcra => refund_script!("scripts/refund_gcra.lua"),
    }
}

static SCRIPTS: LazyLock<[Script; 4]> =
    LazyLock::new(|| Algorithm::ALL.map(|a| Script::new(script_source(a))));

static REFUND_SCRIPTS: LazyLock<[Script; 4]> =
    LazyLock::new(|| Algorithm::ALL.map(|a| Script::new(refund_script_source(a))));

fn algorithm_index(algorithm: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .unwrap_or(0)
}

fn script(algorithm: Algorithm) -> &'static Script {
    &SCRIPTS[algorithm_index(algorithm)]
}

fn refund_script(algorithm: Algorithm) -> &'static Script {
    &REFUND_SCRIPTS[algorithm_index(algorithm)]
}

fn algorithm_tag(algorithm: Algorithm) -> &'static [u8] {
    match algorithm {
        Algorithm::SlidingLog => b"log",
        Algorithm::FixedWindow => b"fw",
        Algorithm::SlidingWindow => b"sw",
        Algorithm::Gcra => b"gcra",
    }
}

/// FNV-1a, 64 bits: stable across Rust releases and platforms, unlike
/// `std`'s hasher, so every process of a fleet maps a key to the same slot.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where the store connects, parsed and checked at construction.
enum Target {
    Single(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
    #[cfg(feature = "deadpool")]
    Pool(deadpool_redis::Pool),
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    #[cfg(feature = "deadpool")]
    Pool(deadpool_redis::Pool),
}

struct Inner {
    target: Target,
    conn: OnceCell<Conn>,
    prefix: Box<[u8]>,
    timeout: Duration,
    server_clock: bool,
    margin_ms: u64,
    display_url: String,
}

/// A [`Store`] backed by Redis or Redis Cluster; cheap to clone (clones
/// share one connection).
///
/// Build it with [`RedisStore::from_url`] or [`RedisStore::builder`].
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.display_url)
            .field("prefix", &String::from_utf8_lossy(&self.inner.prefix))
            .field("timeout", &self.inner.timeout)
            .field("server_clock", &self.inner.server_clock)
            .finish()
    }
}

/// Options of a [`RedisStore`]; every one is checked by
/// [`build`](RedisStoreBuilder::build).
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: Vec<u8>,
    timeout: Duration,
    server_clock: bool,
    margin: Duration,
    #[cfg(feature = "deadpool")]
    pool_size: Option<usize>,
}

impl RedisStore {
    /// A store for `url` with default options.
    ///
    /// Accepted forms: `redis://[user:password@]host[:port][/db]`,
    /// `redis+unix:///path` or `unix:///path`, and
    /// `redis+cluster://[user:password@]host1:port1,host2:port2,...` for a
    /// Redis Cluster (any reachable nodes; the rest are discovered).
    /// `rediss://` (TLS) is refused: TLS support is not built into this
    /// crate. Nothing is contacted here; the connection opens with the first
    /// decision.
    ///
    /// ```
    /// use limiter_redis::RedisStore;
    ///
    /// assert!(RedisStore::from_url("redis://127.0.0.1:6379/0").is_ok());
    /// assert!(RedisStore::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").is_ok());
    /// let err = RedisStore::from_url("redis://:secret@host:notaport").unwrap_err();
    /// assert!(!err.to_string().contains("secret"));
    /// ```
    pub fn from_url(url: &str) -> Result<RedisStore, ConfigError> {
        Self::builder(url).build()
    }

    /// A builder for a store at `url` (see [`RedisStore::from_url`] for the
    /// accepted forms).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.as_bytes().to_vec(),
            timeout: DEFAULT_TIMEOUT,
            server_clock: false,
            margin: DEFAULT_EXPIRY_MARGIN,
            #[cfg(feature = "deadpool")]
            pool_size: None,
        }
    }

    /// The Redis key that holds `key`'s state under `algorithm`.
    pub fn redis_key(&self, key: &[u8], algorithm: Algorithm) -> Vec<u8> {
        let tag = algorithm_tag(algorithm);
        let mut out = Vec::with_capacity(self.inner.prefix.len() + 20 + tag.len() + key.len());
        out.extend_from_slice(&self.inner.prefix);
        out.push(b'{');
        out.extend_from_slice(format!("{:016x}", fnv1a(key)).as_bytes());
        out.extend_from_slice(b"}:");
        out.extend_from_slice(tag);
        out.push(b':');
        out.extend_from_slice(key);
        out
    }

    /// Whether this store decides with the server's clock.
    pub fn uses_server_clock(&self) -> bool {
        self.inner.server_clock
    }

    /// Opens the connection now (and loads nothing else), so that a
    /// misconfigured address shows at start-up; optional, since the first
    /// decision connects anyway.
    pub async fn connect(&self) -> Result<(), StoreError> {
        let timeout = self.inner.timeout;
        match tokio::time::timeout(timeout, self.conn()).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(StoreError::timeout(STORE_NAME, timeout)),
        }
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        self.inner
            .conn
            .get_or_try_init(|| async {
                match &self.inner.target {
                    Target::Single(client) => {
                        let t = self.inner.timeout;
                        let config = redis::aio::ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(t))
                            .set_response_timeout(Some(t))
                            .set_number_of_retries(2)
                            .set_min_delay(Duration::from_millis(10))
                            .set_max_delay(t);
                        ConnectionManager::new_with_config(client.clone(), config)
                            .await
                            .map(Conn::Single)
                    }
                    Target::Cluster(client) => {
                        client.get_async_connection().await.map(Conn::Cluster)
                    }
                    #[cfg(feature = "deadpool")]
                    Target::Pool(pool) => Ok(Conn::Pool(pool.clone())),
                }
            })
            .await
            .cloned()
            .map_err(store_error)
    }

    async fn run(
        &self,
        key: Vec<u8>,
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Value, StoreError> {
        let mut invocation = script(policy.algorithm()).key(key);
        if self.inner.server_clock {
            invocation.arg("server");
        } else {
            invocation.arg(now.as_micros());
        }
        invocation
            .arg(policy.limit())
            .arg(policy.window_micros())
            .arg(cost)
            .arg(self.inner.margin_ms);
        if policy.algorithm() == Algorithm::Gcra {
            invocation.arg(policy.emission_interval_micros());
        }
        self.invoke(invocation).await
    }

    /// One `EVALSHA` (plus a `SCRIPT LOAD` the first time a server sees the
    /// script), on whichever connection the store holds.
    async fn invoke(&self, invocation: ScriptInvocation<'static>) -> Result<Value, StoreError> {
        let conn = self.conn().await?;
        let result = match conn {
            Conn::Single(mut c) => invocation.invoke_async::<Value>(&mut c).await,
            Conn::Cluster(mut c) => invocation.invoke_async::<Value>(&mut c).await,
            #[cfg(feature = "deadpool")]
            Conn::Pool(pool) => {
                let mut c = pool.get().await.map_err(|e| store_error(pool_error(e)))?;
                invocation.invoke_async::<Value>(&mut c).await
            }
        };
        result.map_err(store_error)
    }

    /// Runs `call` under the store's timeout, connecting included.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.inner.timeout;
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::timeout(STORE_NAME, timeout)),
        }
    }
}

impl RedisStoreBuilder {
    /// Prepends `prefix` to every key, so that several applications (or
    /// tests) share a server without sharing state. It may not contain `{`
    /// or `}`, which would break the Redis Cluster hash tag. Default
    /// [`DEFAULT_PREFIX`].
    pub fn key_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bounds each decision, connecting included. Default
    /// [`DEFAULT_TIMEOUT`]; must be above zero.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Decides with the Redis server's clock (`TIME` inside the script)
    /// instead of the `now` passed by the caller.
    ///
    /// The trade: hosts whose clocks are skewed agree on every window, since
    /// only one clock counts; but a manual clock can no longer drive the
    /// store (tests must use real time), and on Redis Cluster each master's
    /// clock decides for its own keys. Declared as
    /// [`Capabilities::server_clock`].
    ///
    /// [`Store::refund`] is not available in this mode: it locates the
    /// admission's units by the time it was decided at, which is the
    /// server's and unknown to the caller. It answers
    /// [`ErrorKind::Unsupported`] without a round trip, and a
    /// [`Limiter`](limiter_core::Limiter) then keeps the admission (stricter,
    /// never more permissive).
    pub fn server_clock(mut self, enabled: bool) -> Self {
        self.server_clock = enabled;
        self
    }

    /// How long a key outlives its state's last meaningful moment. Default
    /// [`DEFAULT_EXPIRY_MARGIN`]; at most one hour.
    pub fn expiry_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// Uses a pool of up to `max_size` connections (deadpool-redis) instead
    /// of one multiplexed connection. Single servers only.
    #[cfg(feature = "deadpool")]
    pub fn pooled(mut self, max_size: usize) -> Self {
        self.pool_size = Some(max_size);
        self
    }

    /// Checks every option and builds the store. Nothing is contacted yet.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        if self.timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "redis timeout must be above zero".into(),
            ));
        }
        if self.prefix.iter().any(|b| *b == b'{' || *b == b'}') {
            return Err(ConfigError::Invalid(
                "redis key prefix may not contain '{' or '}': they would break the cluster hash tag"
                    .into(),
            ));
        }
        if self.margin > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid(
                "redis expiry margin must be at most one hour".into(),
            ));
        }
        let display_url = redact(&self.url);
        let invalid = |reason: String| ConfigError::InvalidUrl {
            url: display_url.clone(),
            reason,
        };
        let (scheme, rest) = self.url.split_once("://").ok_or_else(|| {
            invalid("expected a scheme such as redis:// or redis+cluster://".into())
        })?;
        let target = match scheme {
            "redis" | "redis+unix" | "unix" => {
                let info = redis::IntoConnectionInfo::into_connection_info(self.url.as_str())
                    .map_err(|e| invalid(e.to_string()))?;
                check_host(&info).map_err(&invalid)?;
                #[cfg(feature = "deadpool")]
                if let Some(size) = self.pool_size {
                    if size == 0 {
                        return Err(ConfigError::Invalid(
                            "redis pool size must be above zero".into(),
                        ));
                    }
                    let mut cfg = deadpool_redis::Config::from_connection_info(info);
                    cfg.pool = Some(deadpool_redis::PoolConfig::new(size));
                    let pool = cfg
                        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                        .map_err(|e| invalid(e.to_string()))?;
                    return Ok(self.finish(Target::Pool(pool), display_url));
                }
                let client = redis::Client::open(info).map_err(|e| invalid(e.to_string()))?;
                Target::Single(client)
            }
            "rediss" | "rediss+cluster" => {
                return Err(invalid(
                    "TLS (rediss://) is not built into limiter-redis; connect through a TLS \
                     proxy or over a private network with redis://"
                        .into(),
                ));
            }
            "redis+cluster" => {
                let (auth, hosts) = match rest.rsplit_once('@') {
                    Some((auth, hosts)) => (Some(auth), hosts),
                    None => (None, rest),
                };
                let hosts = hosts.trim_end_matches('/');
                if hosts.is_empty() {
                    return Err(invalid("a cluster URL needs at least one host:port".into()));
                }
                let mut nodes = Vec::new();
                for host in hosts.split(',') {
                    let (h, p) = host.rsplit_once(':').ok_or_else(|| {
                        invalid(format!("cluster node {host:?} is not host:port"))
                    })?;
                    if h.is_empty() || h.contains('/') {
                        return Err(invalid(format!("cluster node {host:?} is not host:port")));
                    }
                    p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                        invalid(format!("cluster node {host:?} has an invalid port"))
                    })?;
                    let node = match auth {
                        Some(a) => format!("redis://{a}@{h}:{p}"),
                        None => format!("redis://{h}:{p}"),
                    };
                    let info = redis::IntoConnectionInfo::into_connection_info(node.as_str())
                        .map_err(|e| invalid(e.to_string()))?;
                    nodes.push(info);
                }
                let client = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .retries(2)
                    .build()
                    .map_err(|e| invalid(e.to_string()))?;
                Target::Cluster(Box::new(client))
            }
            other => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?}: use redis://, redis+unix:// or redis+cluster://"
                )));
            }
        };
        Ok(self.finish(target, display_url))
    }

    fn finish(self, target: Target, display_url: String) -> RedisStore {
        RedisStore {
            inner: Arc::new(Inner {
                target,
                conn: OnceCell::new(),
                prefix: self.prefix.into_boxed_slice(),
                timeout: self.timeout,
                server_clock: self.server_clock,
                margin_ms: u64::try_from(self.margin.as_millis()).unwrap_or(u64::MAX),
                display_url,
            }),
        }
    }
}

/// The redis crate accepts `redis://` with an empty host; a store that can
/// never connect is a configuration error.
fn check_host(info: &redis::ConnectionInfo) -> Result<(), String> {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) if host.is_empty() || *port == 0 => {
            Err("missing host or port".into())
        }
        _ => Ok(()),
    }
}

/// The URL with any password replaced, for errors and debug output.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

fn store_error(e: RedisError) -> StoreError {
    use redis::ServerErrorKind as S;
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            redis::ErrorKind::ClusterConnectionNotFound
                | redis::ErrorKind::Server(
                    S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly
                )
        )
    {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Protocol
    };
    StoreError::new(kind, STORE_NAME, e.to_string()).with_source(e)
}

#[cfg(feature = "deadpool")]
fn pool_error(e: deadpool_redis::PoolError) -> RedisError {
    match e {
        deadpool_redis::PoolError::Backend(e) => e,
        other => RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            other.to_string(),
        )),
    }
}

fn protocol(message: String) -> StoreError {
    StoreError::new(ErrorKind::Protocol, STORE_NAME, message)
}

/// Reads the script's `{allowed, remaining, reset_after_us, retry_after_us}`
/// without trusting it: anything else is a protocol error.
fn verdict(value: Value) -> Result<Verdict, StoreError> {
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
    let [allowed, remaining, reset, retry] = ints[..] else {
        return Err(protocol(format!("expected 4 integers, got {}", ints.len())));
    };
    if allowed > 1 {
        return Err(protocol(format!(
            "expected 0 or 1 for allowed, got {allowed}"
        )));
    }
    Ok(Verdict {
        allowed: allowed == 1,
        remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        reset_after_us: reset.unsigned_abs(),
        retry_after_us: retry.unsigned_abs(),
    })
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        STORE_NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            algorithms: ALGORITHMS,
            key_capacity: None,
            shared: true,
            server_clock: self.inner.server_clock,
        }
    }

    async fn decide(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        policy
            .check_cost(cost)
            .map_err(|e| StoreError::invalid_request(STORE_NAME, e))?;
        let redis_key = self.redis_key(key, policy.algorithm());
        let value = self.bounded(self.run(redis_key, policy, cost, now)).await?;
        Ok(Decision::from_verdict(verdict(value)?, policy, STORE_NAME))
    }

    /// One `EVALSHA` of the algorithm's refund script; see the
    /// [crate documentation](crate). In server-clock mode, an
    /// [`ErrorKind::Unsupported`] error without contacting the server.
    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
        admitted: &Decision,
    ) -> Result<(), StoreError> {
        limiter_core::check_refund(STORE_NAME, policy, cost, admitted)?;
        if self.inner.server_clock {
            return Err(StoreError::new(
                ErrorKind::Unsupported,
                STORE_NAME,
                "refund needs the time the admission was decided at; a store deciding with \
                 the Redis server's clock cannot locate it",
            ));
        }
        let reset_after = u64::try_from(admitted.reset_after.as_micros()).unwrap_or(u64::MAX);
        // The scripts hold times exactly only below 2^53: an anchor past it
        // (or past u64) cannot be compared exactly, and locates no units a
        // decision could have written.
        let Some(anchor) = now
            .as_micros()
            .checked_add(reset_after)
            .filter(|a| *a < MAX_EXACT)
        else {
            return Ok(());
        };
        let mut invocation =
            refund_script(policy.algorithm()).key(self.redis_key(key, policy.algorithm()));
        invocation.arg(anchor).arg(policy.window_micros()).arg(cost);
        if policy.algorithm() == Algorithm::Gcra {
            invocation.arg(policy.emission_interval_micros());
        }
        match self.bounded(self.invoke(invocation)).await? {
            Value::Int(0 | 1) => Ok(()),
            other => Err(protocol(format!(
                "a refund script answers 0 or 1, got {other:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_the_hash_tag_whatever_the_user_key() {
        let store = RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        for key in [&b""[..], b"}", b"{", b"{a}", b"x}{y", &[0xff; 3]] {
            let k = store.redis_key(key, Algorithm::Gcra);
            let open = k.iter().position(|b| *b == b'{').unwrap();
            let close = k.iter().position(|b| *b == b'}').unwrap();
            assert_eq!(close - open, 17, "{k:?}");
            assert!(k.ends_with(key));
        }
        assert_ne!(
            store.redis_key(b"a", Algorithm::Gcra),
            store.redis_key(b"a", Algorithm::FixedWindow)
        );
    }

    #[test]
    fn fnv_is_the_published_function() {
        // Test vectors of FNV-1a 64.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn malformed_urls_are_refused_at_construction() {
        for url in [
            "",
            "localhost:6379",
            "http://localhost",
            "redis://host:notaport",
            "redis://:pw@host:99999",
            "rediss://localhost",
            "redis+cluster://",
            "redis+cluster://a:1,b",
            "redis+cluster://a:1,:2",
            "redis+cluster://a:0",
        ] {
            let err = RedisStore::from_url(url).unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidUrl { .. }),
                "{url}: {err}"
            );
        }
        let err = RedisStore::from_url("rediss://h").unwrap_err();
        assert!(err.to_string().contains("TLS"), "{err}");
        let err = RedisStore::from_url("redis://user:hunter2@h:x").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn bad_options_are_refused_at_construction() {
        let b = || RedisStore::builder("redis://127.0.0.1");
        assert!(b().timeout(Duration::ZERO).build().is_err());
        assert!(b().key_prefix("a{b").build().is_err());
        assert!(b().key_prefix("a}b").build().is_err());
        assert!(
            b().expiry_margin(Duration::from_secs(7200))
                .build()
                .is_err()
        );
        assert!(b().key_prefix("t:1:").build().is_ok());
        assert!(RedisStore::from_url("redis+cluster://u:p@a:1,b:2/").is_ok());
        assert!(RedisStore::from_url("redis+unix:///tmp/redis.sock").is_ok());
    }

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
}
