//! A Redis store for the limiter workspace: one script call per decision.
//!
//! [`RedisStore`] runs each of the four algorithms of
//! [`ratewarden_core::algorithm`] as a Lua script, so a decision is exactly one
//! `EVALSHA` round trip (the script is loaded once per server and reloaded
//! if the server answers `NOSCRIPT`). Nothing is read by the client and
//! written back: the check and the update are one atomic script.
//!
//! * **Time** comes from the caller (`now` in [`Store::decide`]), so a
//!   [`ManualClock`](ratewarden_core::ManualClock) drives Redis exactly as it
//!   drives the memory store. A fleet whose hosts' clocks disagree can use
//!   the server's clock instead ([`RedisStoreBuilder::server_clock`]): every
//!   host then agrees on time, at the price of tests that cannot move time
//!   and of the server's clock being the one that matters.
//! * **Expiry**: every key carries a TTL of the time its state stays
//!   meaningful plus a margin, so Redis memory is bounded by live windows;
//!   the TTL is garbage collection, never part of a decision. A fixed or
//!   sliding window's expiry is set when the window opens and never moved by
//!   the hits it counts; a log's and GCRA's state lives as long as its last
//!   *admitted* request says (the newest entry, the theoretical arrival
//!   time), so only admissions set it. A refusal records nothing and never
//!   moves an expiry.
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
//!   that makes it, and then shared: two multiplexed connections to a single
//!   server, taken in turn (each the redis crate's `ConnectionManager`,
//!   which reconnects on its own; [`RedisStoreBuilder::connections`] says
//!   why two and sets another number), a cluster
//!   connection for `redis+cluster://` URLs, or a connection to the master
//!   the sentinels name for `redis+sentinel://` URLs (see
//!   [Sentinel](#sentinel)). An application that already
//!   has a [`redis::Client`], a [`ConnectionManager`] or a cluster's
//!   [`ClusterClient`](redis::cluster::ClusterClient) hands it over with
//!   [`RedisStore::builder_with_client`],
//!   [`RedisStore::builder_with_connection_manager`] or
//!   [`RedisStore::builder_with_cluster_client`].
//!
//! ```no_run
//! use ratewarden_core::{Policy, Request, Store, Timestamp};
//! use ratewarden_redis::RedisStore;
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .key_prefix("myapp:rl:")
//!     .timeout(Duration::from_millis(100))
//!     .build()?;
//! let policy = Policy::gcra(10, Duration::from_secs(1))?;
//! let request = Request::new(&store, b"client-42", &policy, 1, Timestamp::now_system())?;
//! let decision = store.decide(request).await?;
//! assert!(decision.allowed);
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! The state of one storage key under one algorithm is one Redis key:
//!
//! ```text
//! <prefix>{<16 hex digits>}:<algorithm>:<storage key>
//! ```
//!
//! * `<prefix>` is [`key_prefix`](RedisStoreBuilder::key_prefix),
//!   [`DEFAULT_PREFIX`] (`ratewarden:`) by default: printable ASCII without
//!   spaces, `{` or `}` (anything else is refused when the store is built).
//! * `{<16 hex digits>}` is the FNV-1a 64-bit hash of the storage key, in
//!   lowercase hex: a Redis Cluster hash tag, so that a decision touches one
//!   slot, and a `{` or `}` in the storage key cannot move the tag.
//! * `<algorithm>` is `log` (sliding log, a list), `fw` (fixed window, a
//!   hash), `sw` (sliding window, a hash) or `gcra` (a string).
//! * `<storage key>` is the key given to [`Store::decide`], byte for byte
//!   and last, so none of its bytes can be mistaken for a separator. A
//!   [`Limiter`](ratewarden_core::Limiter) passes `{rule}:{client key}`, and
//!   the HTTP layer's client key is 32 hex digits, so the whole Redis key is
//!   printable ASCII. Bytes outside printable ASCII in a storage key stay as
//!   they are: they are data, and any byte string of at most
//!   [`max_key_len`](RedisStoreBuilder::max_key_len) bytes (16 KiB by
//!   default) is a valid key.
//!
//! The client `0123456789abcdef0123456789abcdef` under the rule `search`
//! (a sliding log) is held, with the default prefix, in
//!
//! ```text
//! ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef
//! ```
//!
//! which [`RedisStore::redis_key`] computes:
//!
//! ```
//! use ratewarden_core::Algorithm;
//! use ratewarden_redis::RedisStore;
//!
//! let store = RedisStore::from_url("redis://127.0.0.1:6379")?;
//! let key = store.redis_key(b"search:0123456789abcdef0123456789abcdef", Algorithm::SlidingLog);
//! assert_eq!(key, b"ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef");
//! # Ok::<(), ratewarden_core::ConfigError>(())
//! ```
//!
//! An operator lists, inspects and deletes a client's state with
//! `redis-cli` (in a terminal, `--scan` prints keys in quotes; piped, as
//! they are):
//!
//! ```sh
//! redis-cli --scan --pattern 'ratewarden:*:search:0123456789abcdef0123456789abcdef'
//! redis-cli TYPE 'ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef'
//! redis-cli PTTL 'ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef'
//! redis-cli DEL  'ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef'
//! ```
//!
//! After the `DEL`, the store's next decision for that client under that
//! rule starts a fresh quota.
//!
//! # TLS
//!
//! With the `tls` feature, `rediss://host[:port][/db]` connects over TLS
//! (rustls, through the redis crate), and so does
//! `rediss+cluster://host1:port1,host2:port2,...` to every node of a Redis
//! Cluster (a managed cluster with in-transit encryption, or one started
//! with `tls-cluster yes`); both verify the servers' certificates against
//! the system's roots, or against the CA given to
//! `RedisStoreBuilder::tls_root_ca`. Verification cannot be turned off:
//! `#insecure` is refused. If the process has not installed a rustls
//! crypto provider when such a store is built, ring's is installed. A
//! server whose certificate the client does not trust fails the decision
//! with an [`ErrorKind::Unavailable`] error that says why. Without the
//! feature, `rediss://` and `rediss+cluster://` are refused when the store
//! is built, with an error naming the feature. A cluster client the
//! application configured itself (client certificates, say) is handed over
//! with [`RedisStore::builder_with_cluster_client`].
//!
//! # Sentinel
//!
//! `redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster` asks the
//! sentinels which server is the master of the group `mymaster` (and that
//! server whether it agrees), then decides on it over one multiplexed
//! connection. User, password and database in the URL are the master's;
//! the sentinels are asked without credentials. When a call on the master
//! fails or does not answer within the store's timeout, the store forgets
//! the connection and the next call asks the sentinels again, so after a
//! failover the first call that fails on the old master sends the next one
//! to the new master. In between, calls fail within the timeout, and a
//! [`Limiter`](ratewarden_core::Limiter) decides them under the rule's
//! failure policy (its circuit breaker, if it opens, adds its cool-down).
//!
//! What a failover can lose: Redis replicates asynchronously, so
//! admissions the old master acknowledged and had not yet sent to the
//! replica it loses are not on the new master, and their units are free
//! again: at most what the fleet was admitted in the replication lag before
//! the master stopped (on a healthy link, well under a second of traffic).
//! Nothing else is lost or counted twice. The crate's test
//! `sentinel::a_failover_moves_decisions_to_the_new_master_without_over_admitting`
//! freezes a master under traffic (three sentinels, quorum 2,
//! `down-after-milliseconds` 1,000): decisions fail closed within the
//! timeout until the new master answers, 6–7 s later with the rule's
//! default breaker (5 s of it the breaker's cool-down; the timeout is 1 s
//! there), and then exactly the rest of the limit is admitted.
//!
//! # Notices
//!
//! A reset is one round trip of two commands: `DEL` of the key and
//! `PUBLISH {prefix}notices <key>`. Every store (unless built with
//! [`notices(false)`](RedisStoreBuilder::notices)) subscribes to that
//! channel on a connection of its own, opened with its first call, and
//! tells the refusal caches of the rules in front of it
//! ([`Store::invalidations`]), so that an unban on one instance reaches
//! every instance of the fleet in the time a message takes to cross the
//! server: nothing is polled, and decisions pay nothing for it. Since
//! pub/sub keeps nothing for a subscriber that is away, those caches hold
//! nothing while the subscription is not established or is found broken
//! (its connection closes, or a `PING` on it every
//! [`notice_heartbeat`](RedisStoreBuilder::notice_heartbeat) goes
//! unanswered within the store's timeout): every request then asks the
//! server. A Redis Cluster delivers a `PUBLISH` on every node, so the store
//! subscribes on any node named in its URL; behind Sentinel, on the master.
//! A store built on an application's own connection manager or cluster
//! client announces its resets but hears none.
//!
//! # One round trip, on the wire
//!
//! The crate's tests prove "one round trip per decision" three ways: a TCP
//! proxy between the store and Redis counts request/answer exchanges (N
//! decisions are N exchanges, N refunds N exchanges, once the scripts are
//! loaded); `MONITOR` shows nothing but `EVALSHA` from the store; and the
//! server's `INFO commandstats` agrees.

// About 780 lines, 190 of them the crate docs: the store and its `Store`
// impl; its builder, keys, scripts, notices, Sentinel, TLS and URLs are
// modules of their own.

mod builder;
mod error;
mod key;
mod notices;
mod script;
mod sentinel;
#[cfg(feature = "tls")]
mod tls;
mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratewarden_core::{
    Algorithm, Capabilities, ConfigError, Decision, ErrorKind, Key, MAX_EXACT, Policy, Refund,
    Request, Store, StoreError,
};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{ScriptInvocation, Value};
use tokio::sync::OnceCell;

pub use builder::RedisStoreBuilder;
pub use script::{refund_script_source, script_source};
pub use url::URL_SCHEMES;

use error::store_error;
pub use script::ban_script_source;
use script::{ban_script, ban_verdict, refund_script, refunded, script, verdict};

/// The name this store reports in decisions and errors.
pub const NAME: &str = "redis";

/// The default transport bound on one call, connection included
/// ([`RedisStoreBuilder::timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "ratewarden:";

/// The default time a key outlives the moment its state becomes
/// meaningless. It only matters when the caller's clock runs slower than
/// real time (a manual clock in tests): a key must not vanish while its
/// window is still open in the caller's time.
pub const DEFAULT_EXPIRY_MARGIN: Duration = Duration::from_secs(1);

/// How many multiplexed connections a store opens to a single server by
/// default ([`RedisStoreBuilder::connections`]).
pub const DEFAULT_CONNECTIONS: usize = 2;

/// The most connections [`RedisStoreBuilder::connections`] accepts.
pub const MAX_CONNECTIONS: usize = 64;

/// How often a store checks its notice subscription by default
/// ([`RedisStoreBuilder::notice_heartbeat`]).
pub const DEFAULT_NOTICE_HEARTBEAT: Duration = Duration::from_secs(1);

const ALGORITHMS: &[Algorithm] = &Algorithm::ALL;

/// Where the store connects, checked at construction.
enum Target {
    Single(Box<redis::Client>),
    Cluster(Box<redis::cluster::ClusterClient>),
    /// The application's own, already connected.
    Manager(ConnectionManager),
    /// The master of a group the sentinels monitor, found again after a
    /// failover.
    Sentinel(Box<sentinel::Master>),
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master found through the sentinels, with the generation of
    /// the lookup that found it.
    Master(u64, redis::aio::MultiplexedConnection),
}

struct Inner {
    target: Target,
    /// Told of the keys other instances reset (see the `notices` module);
    /// `None` where the store cannot subscribe (an application's own
    /// connection manager or cluster client) or was told not to.
    notices: Option<Arc<ratewarden_core::Invalidations>>,
    /// Where a `Single` or `Cluster` target subscribes: its server, or the
    /// cluster's nodes named in its URL.
    notice_nodes: Vec<redis::Client>,
    /// The channel every reset is announced on: `{prefix}notices`.
    notice_channel: Vec<u8>,
    notice_heartbeat: Duration,
    /// How many times the listener has subscribed.
    subscriptions: Arc<tokio::sync::watch::Sender<u64>>,
    /// How many times it has tried, successfully or not.
    attempts: Arc<tokio::sync::watch::Sender<u64>>,
    /// The listener's task, started by the first call and ended with the
    /// store.
    listener: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// The connections of a `Single` or `Cluster` target, once opened.
    conns: OnceCell<Box<[Conn]>>,
    /// How many a `Single` target opens.
    connections: usize,
    /// Which of them the next call takes.
    next: std::sync::atomic::AtomicUsize,
    prefix: Box<[u8]>,
    timeout: Duration,
    server_clock: bool,
    margin_ms: u64,
    max_key_len: usize,
    /// What `Debug` shows of the target: never a password.
    display_url: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(listener) = self
            .listener
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            listener.abort();
        }
    }
}

/// A [`Store`] backed by Redis or Redis Cluster; cheap to clone (clones
/// share its connections).
///
/// Build it with [`RedisStore::from_url`], [`RedisStore::builder`],
/// [`RedisStore::builder_with_client`],
/// [`RedisStore::builder_with_connection_manager`] or
/// [`RedisStore::builder_with_cluster_client`].
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

impl RedisStore {
    /// A store for `url` with default options.
    ///
    /// Accepted forms ([`URL_SCHEMES`]): `redis://[user:password@]host[:port][/db]`,
    /// `rediss://…` for TLS (with the `tls` feature; refused without it),
    /// `redis+unix:///path[?db=N&user=U&pass=P]` or `unix:///path`, and
    /// `redis+cluster://[user:password@]host1:port1,host2:port2,...` for a
    /// Redis Cluster (any reachable nodes; the rest are discovered), and
    /// `redis+sentinel://[user:password@]host1:port1,host2:port2,.../master-name[/db]`
    /// for the master of a group Redis Sentinel monitors (see
    /// [Sentinel](crate#sentinel)). Nothing is contacted here; the
    /// connection opens with the first decision.
    ///
    /// ```
    /// use ratewarden_redis::RedisStore;
    ///
    /// assert!(RedisStore::from_url("redis://127.0.0.1:6379/0").is_ok());
    /// assert!(RedisStore::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").is_ok());
    /// assert!(RedisStore::from_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster").is_ok());
    /// let err = RedisStore::from_url("redis://:secret@host:notaport").unwrap_err();
    /// assert!(!err.to_string().contains("secret"));
    /// ```
    pub fn from_url(url: &str) -> Result<RedisStore, ConfigError> {
        Self::builder(url).build()
    }

    /// A builder for a store at `url` (see [`RedisStore::from_url`] for the
    /// accepted forms).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::from_url(url.into())
    }

    /// A builder for a store that connects through the application's own
    /// `client`, whatever its address, credentials and TLS settings: the
    /// store opens its multiplexed connection from it, lazily, under its
    /// own timeout. URL-only options (`tls_root_ca`) are refused
    /// by [`build`](RedisStoreBuilder::build).
    ///
    /// ```
    /// use ratewarden_redis::RedisStore;
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379/0")?;
    /// let store = RedisStore::builder_with_client(client).key_prefix("myapp:rl:").build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with_client(client: redis::Client) -> RedisStoreBuilder {
        RedisStoreBuilder::from_client(client)
    }

    /// A builder for a store that sends its scripts over the application's
    /// own, already connected `manager` (which it shares with the
    /// application; its reconnection and response-timeout settings stay the
    /// application's). Every call is still bounded by the store's
    /// [`timeout`](RedisStoreBuilder::timeout). URL-only options are refused
    /// by [`build`](RedisStoreBuilder::build).
    pub fn builder_with_connection_manager(manager: ConnectionManager) -> RedisStoreBuilder {
        RedisStoreBuilder::from_connection_manager(manager)
    }

    /// A builder for a store on a Redis Cluster that connects through the
    /// application's own `client`, whatever its nodes, credentials, TLS and
    /// retry settings (a managed cluster with in-transit encryption, say):
    /// the store opens one cluster connection from it, lazily, and bounds
    /// every call by its own [`timeout`](RedisStoreBuilder::timeout).
    /// URL-only options are refused by [`build`](RedisStoreBuilder::build).
    ///
    /// ```
    /// use ratewarden_redis::RedisStore;
    ///
    /// let client = redis::cluster::ClusterClient::new(vec!["redis://10.0.0.1:7000"])?;
    /// let store = RedisStore::builder_with_cluster_client(client).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with_cluster_client(client: redis::cluster::ClusterClient) -> RedisStoreBuilder {
        RedisStoreBuilder::from_cluster_client(client)
    }

    /// The Redis key that holds `key`'s state under `algorithm` (see
    /// [Keys](crate#keys)).
    pub fn redis_key(&self, key: &[u8], algorithm: Algorithm) -> Vec<u8> {
        key::redis_key(&self.inner.prefix, key, algorithm)
    }

    /// Opens the connections now (and loads nothing else), and the
    /// subscription to other instances' resets ([Notices](crate#notices)),
    /// so that a misconfigured address shows at start-up; optional, since
    /// the first decision connects anyway.
    pub async fn connect(&self) -> Result<(), StoreError> {
        self.in_time(self.bounded(async { self.conn().await.map(|_| ()) }).await)?;
        if self.inner.notices.is_none() {
            return Ok(());
        }
        let mut made = self.inner.subscriptions.subscribe();
        let subscribed = self.bounded(made.wait_for(|n| *n > 0)).await;
        match subscribed {
            Ok(Ok(_)) => Ok(()),
            _ => Err(StoreError::timeout(NAME, self.inner.timeout)),
        }
    }

    /// How many times the store has subscribed to the resets other
    /// instances announce: 0 until its first call (or
    /// [`connect`](Self::connect)), one more each time it subscribes again
    /// after the subscription was lost ([Notices](crate#notices)).
    pub fn subscriptions(&self) -> u64 {
        *self.inner.subscriptions.borrow()
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        if let Some(conns) = self.inner.conns.get() {
            return Ok(self.take(conns));
        }
        // Opening a connection is a future of some 3 KiB, which every
        // call's future would otherwise hold and copy (into its box, into
        // the timeout) though only the first call opens one.
        Box::pin(self.open()).await
    }

    /// The next of `conns`, in turn.
    fn take(&self, conns: &[Conn]) -> Conn {
        let i = match conns.len() {
            1 => 0,
            n => {
                self.inner
                    .next
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    % n
            }
        };
        conns[i].clone()
    }

    /// [`conn`](Self::conn) when the store holds no connection yet, and
    /// for a master found through the sentinels, on every call.
    async fn open(&self) -> Result<Conn, StoreError> {
        self.listen();
        self.subscribed().await;
        let cell = &self.inner.conns;
        match &self.inner.target {
            // Opened once, by the first call, then shared.
            Target::Single(client) => cell
                .get_or_try_init(|| async {
                    let t = self.inner.timeout;
                    let config = redis::aio::ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(t))
                        .set_response_timeout(Some(t))
                        .set_number_of_retries(2)
                        .set_min_delay(Duration::from_millis(10))
                        .set_max_delay(t);
                    let opened = (0..self.inner.connections).map(|_| {
                        ConnectionManager::new_with_config(
                            redis::Client::clone(client),
                            config.clone(),
                        )
                    });
                    futures::future::try_join_all(opened)
                        .await
                        .map(|managers| managers.into_iter().map(Conn::Single).collect())
                })
                .await
                .map(|conns| self.take(conns))
                .map_err(store_error),
            Target::Cluster(client) => cell
                .get_or_try_init(|| async {
                    let conn = client.get_async_connection().await?;
                    Ok::<_, redis::RedisError>(Box::from([Conn::Cluster(conn)]))
                })
                .await
                .map(|conns| self.take(conns))
                .map_err(store_error),
            Target::Manager(manager) => Ok(Conn::Single(manager.clone())),
            // Not kept once: the master changes with each failover.
            Target::Sentinel(master) => {
                let (generation, conn) = master.connection().await.map_err(store_error)?;
                Ok(Conn::Master(generation, conn))
            }
        }
    }

    /// Waits, at most the store's timeout, until the listener has made its
    /// first attempt to subscribe: nothing is decided (and so cached or
    /// leased in front of the store) before resets can be heard. A failed
    /// attempt has marked the notices lost, so nothing is vouched for
    /// either way.
    async fn subscribed(&self) {
        if self.inner.notices.is_none() {
            return;
        }
        let mut attempts = self.inner.attempts.subscribe();
        let _ = tokio::time::timeout(self.inner.timeout, attempts.wait_for(|n| *n > 0)).await;
    }

    /// Starts the listener of other instances' resets, once.
    fn listen(&self) {
        let Some(notices) = &self.inner.notices else {
            return;
        };
        let mut listener = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if listener.is_some() {
            return;
        }
        let task = notices::Listener {
            notices: notices.clone(),
            channel: self.inner.notice_channel.clone(),
            heartbeat: self.inner.notice_heartbeat,
            timeout: self.inner.timeout,
            subscriptions: self.inner.subscriptions.clone(),
            attempts: self.inner.attempts.clone(),
        };
        // Holds the store weakly: the task ends once the store is dropped
        // (and is aborted by `Inner`'s drop while it waits).
        let handle = tokio::spawn(task.run(Arc::downgrade(&self.inner)));
        *listener = Some(handle.abort_handle());
    }

    /// The decision script for `key`, in `mode`.
    async fn run(&self, request: Request<'_>, mode: Mode) -> Result<Value, StoreError> {
        let policy = request.policy();
        let key = self.redis_key(request.key(), policy.algorithm());
        // A penalty never touches a ban: the plain script, as for a policy
        // without one.
        let ban = policy.ban().filter(|_| mode != Mode::Penalize);
        let mut invocation = match ban {
            Some(_) => {
                let ban_key = key::ban_key(&self.inner.prefix, request.key(), policy.algorithm());
                let mut invocation = ban_script(policy.algorithm()).key(key);
                invocation.key(ban_key);
                invocation
            }
            None => script(policy.algorithm()).key(key),
        };
        if self.inner.server_clock {
            invocation.arg("server");
        } else {
            invocation.arg(request.now().as_micros());
        }
        invocation
            .arg(policy.limit())
            .arg(policy.window_micros())
            .arg(request.cost())
            .arg(self.inner.margin_ms);
        if policy.algorithm() == Algorithm::Gcra {
            invocation.arg(policy.emission_interval_micros());
        } else if mode != Mode::Decide || ban.is_some() {
            invocation.arg(0);
        }
        match mode {
            Mode::Decide if ban.is_some() => {
                invocation.arg("decide");
            }
            Mode::Decide => {}
            Mode::Peek => {
                invocation.arg("peek");
            }
            Mode::Penalize => {
                invocation.arg("penalize");
            }
        }
        if let Some(ban) = ban {
            invocation
                .arg(ban.after())
                .arg(ban.within_micros())
                .arg(ban.block_micros())
                .arg(ban.factor())
                .arg(ban.max_micros());
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
            Conn::Master(generation, mut c) => {
                self.watched(generation, invocation.invoke_async::<Value>(&mut c))
                    .await
            }
        };
        result.map_err(store_error)
    }

    /// One `DEL` of `key`, on whichever connection the store holds.
    /// Deletes `key` and announces `reset` (the key as the caller named
    /// it) to every instance that listens: one round trip (two on a
    /// cluster).
    async fn delete(&self, key: [Vec<u8>; 2], reset: &[u8]) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(&key).ignore();
        pipe.cmd("PUBLISH")
            .arg(&self.inner.notice_channel)
            .arg(reset)
            .ignore();
        let result = match self.conn().await? {
            Conn::Single(mut c) => pipe.query_async::<()>(&mut c).await,
            // A cluster routes a pipeline to one node, which refuses a
            // `PUBLISH` beside a key of another slot: two calls, the delete
            // first, so that no instance hears of a reset not yet made.
            Conn::Cluster(mut c) => {
                let deleted = redis::cmd("DEL").arg(&key).query_async::<i64>(&mut c).await;
                match deleted {
                    Ok(_) => redis::cmd("PUBLISH")
                        .arg(&self.inner.notice_channel)
                        .arg(reset)
                        .query_async::<i64>(&mut c)
                        .await
                        .map(|_| ()),
                    Err(e) => Err(e),
                }
            }
            Conn::Master(generation, mut c) => {
                self.watched(generation, pipe.query_async::<()>(&mut c))
                    .await
            }
        };
        result.map_err(store_error)
    }

    /// Runs `call` on the master found through the sentinels, forgetting
    /// that master's connection unless the call answers: on an error, and
    /// when the store's timeout drops it first (see the `sentinel` module).
    async fn watched<T>(
        &self,
        generation: u64,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        let watch = match &self.inner.target {
            Target::Sentinel(master) => Some(sentinel::Unanswered::new(master, generation)),
            _ => None,
        };
        let result = call.await;
        if let (Ok(_), Some(watch)) = (&result, watch) {
            watch.answered();
        }
        result
    }

    /// `call` under the store's timeout, connecting included; its answer
    /// goes through [`in_time`](Self::in_time). Two steps rather than one
    /// `async fn`, which would hold `call` twice (as its argument and
    /// inside the timeout) and make each decision's future, built and
    /// moved on every call, twice its size.
    fn bounded<F: Future>(&self, call: F) -> tokio::time::Timeout<F> {
        tokio::time::timeout(self.inner.timeout, call)
    }

    /// The answer of a [`bounded`](Self::bounded) call, or the timeout's
    /// error.
    fn in_time<T>(
        &self,
        answer: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        answer.unwrap_or_else(|_| Err(StoreError::timeout(NAME, self.inner.timeout)))
    }
}

/// A decision or peek script's reply as a decision: a ban script's (with
/// its fifth integer) when `policy` has a ban.
fn decision(value: Value, policy: &Policy) -> Result<Decision, StoreError> {
    if policy.ban().is_some() {
        Ok(Decision::from_ban_verdict(
            ban_verdict(value)?,
            policy,
            NAME,
        ))
    } else {
        Ok(Decision::from_verdict(verdict(value)?, policy, NAME))
    }
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new(ALGORITHMS).shared().with_bans();
        capabilities.server_clock = self.inner.server_clock;
        capabilities
    }

    /// Told of every key another instance of the fleet resets, through
    /// Redis pub/sub (see [Notices](crate#notices)); `None` for a store on
    /// an application's own connection manager or cluster client, or
    /// built with [`notices(false)`](RedisStoreBuilder::notices).
    fn invalidations(&self) -> Option<Arc<ratewarden_core::Invalidations>> {
        self.inner.notices.clone()
    }

    fn max_key_len(&self) -> usize {
        self.inner.max_key_len
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let policy = request.policy();
        let value = self.in_time(self.bounded(self.run(request, Mode::Decide)).await)?;
        decision(value, policy)
    }

    /// One `EVALSHA` of the algorithm's decision script, told to write
    /// nothing (its last argument, `peek`): the same arithmetic as
    /// [`decide`](Store::decide), so the two cannot drift, and no `HSET`,
    /// `PEXPIRE`, `LTRIM` or `SET` runs.
    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let policy = request.policy();
        let value = self.in_time(self.bounded(self.run(request, Mode::Peek)).await)?;
        decision(value, policy)
    }

    /// One `EVALSHA` of the algorithm's decision script, told to record
    /// the units whether or not they fit (its last argument, `penalize`),
    /// within the bounds of `algorithm::penalize`. The
    /// expiry follows the decision's rule: set when a window opens, moved
    /// only by what moves a log's newest entry or GCRA's arrival time.
    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.in_time(self.bounded(self.run(request, Mode::Penalize)).await)
            .map(|_| ())
    }

    /// One `DEL` of the key that holds `key`'s state under the policy's
    /// algorithm ([`redis_key`](RedisStore::redis_key)): every algorithm
    /// keeps one Redis key per client key, so the reset is atomic.
    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        let redis_key = self.redis_key(key.as_bytes(), policy.algorithm());
        let ban_key = key::ban_key(&self.inner.prefix, key.as_bytes(), policy.algorithm());
        self.in_time(
            self.bounded(self.delete([redis_key, ban_key], key.as_bytes()))
                .await,
        )
    }

    /// One `EVALSHA` of the algorithm's refund script; see the
    /// [crate documentation](crate). In server-clock mode, an
    /// [`ErrorKind::Unsupported`] error without contacting the server.
    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        let request = refund.request();
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let admitted = refund.admitted();
        if self.inner.server_clock {
            return Err(StoreError::new(
                ErrorKind::Unsupported,
                NAME,
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
        refunded(self.in_time(self.bounded(self.invoke(invocation)).await)?)
    }
}

/// What a decision script is asked to do with a request (its last argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Decide it, recording it if admitted.
    Decide,
    /// Answer what `Decide` would, writing nothing.
    Peek,
    /// Record it whether or not it fits.
    Penalize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every decision builds this future, boxes it and moves it into the
    /// timeout: one that held the connection's opening inline and the call
    /// twice was 7 KiB, and its copies cost the client more CPU per call
    /// than the redis crate's own connection spends. A dependency's update
    /// can grow it again; this says so.
    #[test]
    fn a_decision_future_stays_small() {
        let store = RedisStore::builder("redis://127.0.0.1:1").build().unwrap();
        let policy = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
        let now = ratewarden_core::Timestamp::from_micros(1);
        let request = Request::new(&store, b"k", &policy, 1, now).unwrap();
        let decide = store.decide(request);
        let size = std::mem::size_of_val(&*decide);
        assert!(size <= 2048, "a decision's future is {size} bytes");
        assert!(std::mem::size_of_val(&store.conn()) <= 64);
    }
}
