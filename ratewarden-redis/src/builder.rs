//! [`RedisStoreBuilder`]: every option of a [`RedisStore`], checked by
//! [`build`](RedisStoreBuilder::build) and never at the first decision.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::url::redact;
use ratewarden_core::{ConfigError, DEFAULT_MAX_KEY_LEN};
use redis::aio::ConnectionManager;
use tokio::sync::OnceCell;

use crate::url::{self, Endpoint};
use crate::{
    DEFAULT_CONNECTIONS, DEFAULT_EXPIRY_MARGIN, DEFAULT_NOTICE_HEARTBEAT, DEFAULT_PREFIX,
    DEFAULT_TIMEOUT, Inner, MAX_CONNECTIONS, RedisStore, Target,
};

/// What the store connects through.
#[derive(Clone)]
enum Source {
    Url(String),
    Client(Box<redis::Client>),
    Manager(ConnectionManager),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// Options of a [`RedisStore`]; every one is checked by
/// [`build`](RedisStoreBuilder::build).
///
/// Made by [`RedisStore::builder`] (from a URL),
/// [`RedisStore::builder_with_client`],
/// [`RedisStore::builder_with_connection_manager`] or
/// [`RedisStore::builder_with_cluster_client`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    source: Source,
    prefix: Vec<u8>,
    timeout: Duration,
    server_clock: bool,
    margin: Duration,
    max_key_len: usize,
    notices: bool,
    notice_heartbeat: Duration,
    /// `None` while [`connections`](RedisStoreBuilder::connections) has not
    /// been called; `build` then gives a single server the default and any
    /// other target one connection, and refuses nothing.
    connections: Option<usize>,
    #[cfg(feature = "tls")]
    tls_root_ca: Option<Vec<u8>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisStoreBuilder");
        d.field("source", &self.source.display())
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("timeout", &self.timeout)
            .field("server_clock", &self.server_clock)
            .field("expiry_margin", &self.margin)
            .field("max_key_len", &self.max_key_len)
            .field("connections", &self.connections);
        #[cfg(feature = "tls")]
        d.field("tls_root_ca", &self.tls_root_ca.as_ref().map(|_| "<PEM>"));
        d.finish()
    }
}

impl Source {
    /// What errors and `Debug` output may show: a URL only as redacted, a
    /// client only by its address (which holds no credentials).
    fn display(&self) -> String {
        match self {
            Source::Url(url) => redact(url),
            Source::Client(client) => {
                format!("redis::Client for {}", client.get_connection_info().addr())
            }
            Source::Manager(_) => "an existing redis::aio::ConnectionManager".into(),
            Source::Cluster(_) => "an existing redis::cluster::ClusterClient".into(),
        }
    }
}

impl RedisStoreBuilder {
    fn new(source: Source) -> Self {
        RedisStoreBuilder {
            source,
            prefix: DEFAULT_PREFIX.as_bytes().to_vec(),
            timeout: DEFAULT_TIMEOUT,
            server_clock: false,
            margin: DEFAULT_EXPIRY_MARGIN,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            notices: true,
            notice_heartbeat: DEFAULT_NOTICE_HEARTBEAT,
            connections: None,
            #[cfg(feature = "tls")]
            tls_root_ca: None,
        }
    }

    pub(crate) fn from_url(url: String) -> Self {
        Self::new(Source::Url(url))
    }

    pub(crate) fn from_client(client: redis::Client) -> Self {
        Self::new(Source::Client(Box::new(client)))
    }

    pub(crate) fn from_connection_manager(manager: ConnectionManager) -> Self {
        Self::new(Source::Manager(manager))
    }

    pub(crate) fn from_cluster_client(client: redis::cluster::ClusterClient) -> Self {
        Self::new(Source::Cluster(Box::new(client)))
    }

    /// Prepends `prefix` to every key, so that several applications (or
    /// tests) share a server without sharing state. Printable ASCII without
    /// spaces (`!` to `~`), so that keys stay printable, and without `{` or
    /// `}`, which would break the Redis Cluster hash tag; see the
    /// [key layout](crate#keys). Default [`DEFAULT_PREFIX`].
    pub fn key_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// A transport bound: each call on the store's connections, connecting
    /// included, ends within it as a `Timeout` error. Default
    /// [`DEFAULT_TIMEOUT`]; must be above zero. Under a `Limiter`, the
    /// rule's timeout (`Rule::with_timeout`) bounds what a request waits;
    /// this one applies beneath it and when the store is called directly.
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
    /// [`Capabilities::server_clock`](ratewarden_core::Capabilities::server_clock).
    ///
    /// [`Store::refund`](ratewarden_core::Store::refund) is not available in
    /// this mode: it locates the admission's units by the time it was
    /// decided at, which is the server's and unknown to the caller. It
    /// answers [`ErrorKind::Unsupported`](ratewarden_core::ErrorKind::Unsupported)
    /// without a round trip, and a [`Limiter`](ratewarden_core::Limiter) then
    /// keeps the admission (stricter, never more permissive).
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

    /// The longest storage key accepted, in bytes (default
    /// [`DEFAULT_MAX_KEY_LEN`]); a longer one is an
    /// [`InvalidRequest`](ratewarden_core::ErrorKind::InvalidRequest) error,
    /// without a round trip, so that attacker-chosen keys cannot make Redis
    /// hold more per key. Refused if zero.
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM
    /// `CERTIFICATE` blocks) for a `rediss://` URL, instead of the system's
    /// roots: for a server whose certificate a private CA signed. Needs the
    /// `tls` feature.
    ///
    /// [`build`](Self::build) refuses PEM holding no certificate, and this
    /// option with anything but a `rediss://` URL (an existing client
    /// carries its own TLS settings).
    #[cfg(feature = "tls")]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_ca = Some(pem.into());
        self
    }

    /// Whether the store subscribes to the resets other instances announce
    /// (see [Notices](crate#notices)): on by default, at the cost of one
    /// more connection per store. Off, a reset reaches only the refusal
    /// caches of this process, and other instances' cached refusals stand
    /// until their retry time. Every reset is announced either way.
    pub fn notices(mut self, enabled: bool) -> Self {
        self.notices = enabled;
        self
    }

    /// How often the notice subscription is checked with a `PING`
    /// (default [`DEFAULT_NOTICE_HEARTBEAT`]): a subscription that stops
    /// answering (a one-sided partition) is found within this plus the
    /// store's timeout, and the refusal caches drop what they hold. From
    /// 10 ms to one hour.
    pub fn notice_heartbeat(mut self, every: Duration) -> Self {
        self.notice_heartbeat = every;
        self
    }

    /// How many multiplexed connections the store opens to a single server
    /// (a `redis://`, `rediss://` or `redis+unix://` URL, or a
    /// [`redis::Client`]), taking them in turn call by call. Default
    /// [`DEFAULT_CONNECTIONS`]; from 1 to [`MAX_CONNECTIONS`].
    ///
    /// One connection carries concurrent calls in lockstep: the client
    /// sends what its tasks have queued, then handles the whole batch of
    /// answers while the server waits for the next. A second connection
    /// lets each side work on one batch while the other's is in flight
    /// (the Redis benchmark in `BENCHMARKS.md` shows what that is worth).
    /// Every call is still one round trip.
    ///
    /// [`build`](Self::build) refuses more than one for a cluster, a
    /// Sentinel group or an existing
    /// [`ConnectionManager`]: a cluster's connection already holds one
    /// per node, a Sentinel master is found again after each failover, and
    /// the application's manager is the one connection it gave.
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = Some(n);
        self
    }

    /// Checks every option and builds the store. Nothing is contacted yet.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        if self.timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "redis timeout must be above zero".into(),
            ));
        }
        crate::key::check_prefix(&self.prefix)?;
        if self.max_key_len == 0 {
            return Err(ConfigError::Invalid(
                "redis max_key_len must be at least 1 byte".into(),
            ));
        }
        if self.margin > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid(
                "redis expiry margin must be at most one hour".into(),
            ));
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&self.notice_heartbeat)
        {
            return Err(ConfigError::Invalid(format!(
                "redis notice_heartbeat must be from 10 ms to one hour, not {:?}",
                self.notice_heartbeat
            )));
        }
        let (target, display_url, notice_nodes) = match &self.source {
            Source::Url(url) => {
                let parsed = url::parse(url)?;
                let (target, nodes) = self.target(parsed.endpoint, &parsed.display)?;
                (target, parsed.display, nodes)
            }
            Source::Client(client) => {
                self.refuse_url_only_options()?;
                let nodes = vec![redis::Client::clone(client)];
                (Target::Single(client.clone()), self.source.display(), nodes)
            }
            Source::Manager(manager) => {
                self.refuse_url_only_options()?;
                (
                    Target::Manager(manager.clone()),
                    self.source.display(),
                    Vec::new(),
                )
            }
            Source::Cluster(client) => {
                self.refuse_url_only_options()?;
                (
                    Target::Cluster(client.clone()),
                    self.source.display(),
                    Vec::new(),
                )
            }
        };
        let connections = self.connections_for(&target)?;
        // A store subscribes where it can open a connection of its own.
        let subscribes =
            self.notices && (matches!(target, Target::Sentinel(_)) || !notice_nodes.is_empty());
        let mut notice_channel = self.prefix.clone();
        notice_channel.extend_from_slice(b"notices");
        Ok(RedisStore {
            inner: Arc::new(Inner {
                target,
                // Vouched from the start: calls wait for the first attempt
                // to subscribe, and a failed one counts as a loss.
                notices: subscribes.then(|| Arc::new(ratewarden_core::Invalidations::new())),
                notice_nodes,
                notice_channel,
                notice_heartbeat: self.notice_heartbeat,
                subscriptions: Arc::new(tokio::sync::watch::Sender::new(0)),
                attempts: Arc::new(tokio::sync::watch::Sender::new(0)),
                listener: std::sync::Mutex::new(None),
                conns: OnceCell::new(),
                connections,
                next: std::sync::atomic::AtomicUsize::new(0),
                prefix: self.prefix.into_boxed_slice(),
                timeout: self.timeout,
                server_clock: self.server_clock,
                margin_ms: u64::try_from(self.margin.as_millis()).unwrap_or(u64::MAX),
                max_key_len: self.max_key_len,
                display_url,
            }),
        })
    }

    /// How many connections the store opens to `target`: see
    /// [`connections`](Self::connections).
    fn connections_for(&self, target: &Target) -> Result<usize, ConfigError> {
        let Some(n) = self.connections else {
            return Ok(match target {
                Target::Single(_) => DEFAULT_CONNECTIONS,
                _ => 1,
            });
        };
        if !(1..=MAX_CONNECTIONS).contains(&n) {
            return Err(ConfigError::Invalid(format!(
                "redis connections must be from 1 to {MAX_CONNECTIONS}, not {n}"
            )));
        }
        let one_only = match target {
            Target::Single(_) => None,
            Target::Cluster(_) => Some("a cluster's connection already holds one per node"),
            Target::Sentinel(_) => {
                Some("a Sentinel group's master is found again after each failover")
            }
            Target::Manager(_) => Some("an existing ConnectionManager is the one connection given"),
        };
        match one_only {
            Some(why) if n > 1 => Err(ConfigError::Invalid(format!(
                "redis connections({n}) applies to a single server: {why}"
            ))),
            _ => Ok(n),
        }
    }

    /// Options that only mean something when the store makes its own
    /// connections from a URL.
    fn refuse_url_only_options(&self) -> Result<(), ConfigError> {
        #[cfg(feature = "tls")]
        if self.tls_root_ca.is_some() {
            return Err(ConfigError::Invalid(format!(
                "tls_root_ca applies to a rediss:// URL; {} carries its own TLS settings",
                self.source.display()
            )));
        }
        Ok(())
    }

    /// The target of `endpoint`, with the clients its notice subscription
    /// may use (none for Sentinel, which finds its master each time).
    fn target(
        &self,
        endpoint: Endpoint,
        display: &str,
    ) -> Result<(Target, Vec<redis::Client>), ConfigError> {
        let invalid = |reason: String| ConfigError::InvalidUrl {
            url: display.to_owned(),
            reason,
        };
        match endpoint {
            Endpoint::Single(info) => {
                #[cfg(feature = "tls")]
                if let Some(roots) = self.tls_roots(&info).map_err(invalid)? {
                    let client = redis::Client::build_with_tls(*info, roots)
                        .map_err(|e| invalid(format!("tls_root_ca cannot be used: {e}")))?;
                    return Ok((Target::Single(Box::new(client.clone())), vec![client]));
                }
                let client = redis::Client::open(*info).map_err(|e| invalid(e.to_string()))?;
                Ok((Target::Single(Box::new(client.clone())), vec![client]))
            }
            Endpoint::Cluster(nodes) => {
                // One URL's nodes share its scheme: the first speaks for all.
                #[cfg(feature = "tls")]
                let roots = match nodes.first() {
                    Some(node) => self.tls_roots(node).map_err(invalid)?,
                    None => None,
                };
                // Classic pub/sub reaches every node of a cluster: any node
                // named here will do to subscribe on.
                #[cfg(feature = "tls")]
                let notice_nodes = nodes
                    .iter()
                    .map(|n| match &roots {
                        Some(roots) => redis::Client::build_with_tls(n.clone(), roots.clone()),
                        None => redis::Client::open(n.clone()),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| invalid(e.to_string()))?;
                #[cfg(not(feature = "tls"))]
                let notice_nodes = nodes
                    .iter()
                    .map(|n| redis::Client::open(n.clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| invalid(e.to_string()))?;
                #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .retries(2);
                // Every node discovered from the first is reached over TLS
                // trusting the same roots.
                #[cfg(feature = "tls")]
                if let Some(roots) = roots {
                    builder = builder.certs(roots);
                }
                let client = builder.build().map_err(|e| invalid(e.to_string()))?;
                Ok((Target::Cluster(Box::new(client)), notice_nodes))
            }
            Endpoint::Sentinel {
                sentinels,
                master,
                node,
            } => {
                #[cfg(feature = "tls")]
                if self.tls_root_ca.is_some() {
                    return Err(invalid(
                        "tls_root_ca needs a rediss:// URL; TLS through Sentinel is not supported"
                            .into(),
                    ));
                }
                let node = redis::sentinel::SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(*node);
                let client = redis::sentinel::SentinelClient::build(
                    sentinels,
                    master,
                    Some(node),
                    redis::sentinel::SentinelServerType::Master,
                )
                .map_err(|e| invalid(e.to_string()))?;
                Ok((
                    Target::Sentinel(Box::new(crate::sentinel::Master::new(client, self.timeout))),
                    Vec::new(),
                ))
            }
        }
    }
}

impl RedisStoreBuilder {
    /// The roots [`tls_root_ca`](Self::tls_root_ca) gives a connection to
    /// `info`, when one is given; `None` lets the redis crate trust the
    /// system's roots. Installs a crypto provider for a TLS address, and
    /// refuses roots for an address that would not use TLS.
    #[cfg(feature = "tls")]
    fn tls_roots(
        &self,
        info: &redis::ConnectionInfo,
    ) -> Result<Option<redis::TlsCertificates>, String> {
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if tls {
            crate::tls::ensure_crypto_provider();
        }
        let Some(pem) = &self.tls_root_ca else {
            return Ok(None);
        };
        if !tls {
            return Err(
                "tls_root_ca needs a rediss:// or rediss+cluster:// URL: this one would not use TLS"
                    .into(),
            );
        }
        crate::tls::trusting(pem).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_refused_at_construction() {
        let b = || RedisStore::builder("redis://127.0.0.1");
        assert!(b().timeout(Duration::ZERO).build().is_err());
        assert!(b().key_prefix("a{b").build().is_err());
        assert!(b().key_prefix("a}b").build().is_err());
        assert!(b().key_prefix("a b:").build().is_err());
        assert!(b().key_prefix(&b"\x00:"[..]).build().is_err());
        assert!(
            b().expiry_margin(Duration::from_secs(7200))
                .build()
                .is_err()
        );
        assert!(b().max_key_len(0).build().is_err());
        assert!(b().connections(0).build().is_err());
        assert!(b().connections(MAX_CONNECTIONS + 1).build().is_err());
        assert!(b().connections(MAX_CONNECTIONS).build().is_ok());
        assert!(b().connections(1).build().is_ok());
        assert!(b().key_prefix("t:1:").build().is_ok());
        assert!(b().key_prefix("").build().is_ok());
        assert!(RedisStore::from_url("redis+cluster://u:p@a:1,b:2/").is_ok());
        assert!(RedisStore::from_url("redis+unix:///tmp/redis.sock").is_ok());
    }

    #[test]
    fn an_existing_client_is_checked_like_a_url() {
        let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
        let b = || RedisStore::builder_with_client(client.clone());
        assert!(b().build().is_ok());
        assert!(b().timeout(Duration::ZERO).build().is_err());
        assert!(b().key_prefix("a{b").build().is_err());
        let debug = format!("{:?}", b().build().unwrap());
        assert!(debug.contains("127.0.0.1:6379"), "{debug}");
    }

    #[test]
    fn more_than_one_connection_is_only_for_a_single_server() {
        for url in [
            "redis+cluster://a:1,b:2/",
            "redis+sentinel://s:26379/mymaster",
        ] {
            let b = || RedisStore::builder(url);
            assert!(b().build().is_ok(), "{url}: the default applies");
            assert!(b().connections(1).build().is_ok(), "{url}");
            let err = b().connections(2).build().unwrap_err().to_string();
            assert!(err.contains("applies to a single server"), "{url}: {err}");
        }
        let client = redis::Client::open("redis+unix:///s.sock").unwrap();
        assert!(
            RedisStore::builder_with_client(client)
                .connections(4)
                .build()
                .is_ok()
        );
    }

    #[test]
    fn urls_are_shown_redacted() {
        let b = RedisStore::builder("redis+unix:///s.sock?pass=hunter2");
        let shown = format!("{b:?} {:?}", b.clone().build().unwrap());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("pass=***"), "{shown}");
    }
}
