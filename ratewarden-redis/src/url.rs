//! Store URLs: which schemes the builder accepts, their parsing (the `url`
//! crate's, through [`ratewarden_core::url`], never hand splitting of a
//! password) and what an error or `Debug` output may show of them
//! ([`ratewarden_core::url::redact`], the workspace's one redaction).

use ratewarden_core::ConfigError;
use ratewarden_core::url::{Url, redact};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// The URL schemes [`RedisStore::builder`](crate::RedisStore::builder)
/// recognises, without `://`: `redis` (TCP), `rediss` (TLS), `redis+unix`
/// and `unix` (a Unix socket), and `redis+cluster` (a Redis Cluster).
///
/// `rediss` is listed whatever the features, so that a router of store URLs
/// (such as the `ratewarden` crate's `from_url`) sends it here; a store built
/// without the `tls` feature refuses it at construction, with an error that
/// names the feature. Any other scheme is refused, TLS to a Redis Cluster
/// (`rediss+cluster`) included.
///
/// ```
/// use ratewarden_redis::{RedisStore, URL_SCHEMES};
///
/// for scheme in URL_SCHEMES {
///     let url = match *scheme {
///         "redis+unix" | "unix" => format!("{scheme}:///run/redis.sock"),
///         _ => format!("{scheme}://127.0.0.1:6379"),
///     };
///     let built = RedisStore::from_url(&url);
///     if *scheme == "rediss" && !cfg!(feature = "tls") {
///         assert!(built.unwrap_err().to_string().contains("`tls` feature"));
///     } else {
///         assert!(built.is_ok(), "{url}");
///     }
/// }
/// ```
pub const URL_SCHEMES: &[&str] = ratewarden_core::url::REDIS_SCHEMES;

/// Where a URL points, checked but not contacted.
pub(crate) enum Endpoint {
    /// One server: TCP, TLS or a Unix socket.
    Single(Box<ConnectionInfo>),
    /// Any reachable nodes of a Redis Cluster; the rest are discovered.
    Cluster(Vec<ConnectionInfo>),
}

/// A parsed URL and what may be shown of it.
pub(crate) struct Parsed {
    pub(crate) endpoint: Endpoint,
    /// The URL without its secrets.
    pub(crate) display: String,
}

/// Parses and checks `url`. Every error shows the URL through
/// [`redact`] only.
pub(crate) fn parse(url: &str) -> Result<Parsed, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: redact(url),
        reason,
    };
    // Only the scheme is read by hand, to choose the parser: a cluster's
    // comma-separated hosts are not one URL authority.
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(format!(
            "expected a scheme: one of {}",
            schemes_for_humans()
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" | "rediss" | "redis+unix" | "unix" => single(url).map_err(invalid),
        "redis+cluster" => cluster(rest).map_err(invalid),
        "rediss+cluster" => Err(invalid(
            "TLS to a Redis Cluster is not supported; use rediss:// for one server".into(),
        )),
        // Only a well-formed scheme is echoed: text before the first `://`
        // of a malformed URL may be anything, a password included (the
        // store_url fuzz target found one).
        other if is_scheme(other) => Err(invalid(format!(
            "unsupported scheme {other:?}: use one of {}",
            schemes_for_humans()
        ))),
        _ => Err(invalid(format!(
            "not a URL with a scheme this store accepts: use one of {}",
            schemes_for_humans()
        ))),
    }
}

fn schemes_for_humans() -> String {
    URL_SCHEMES
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn single(url: &str) -> Result<Parsed, String> {
    // The url crate's errors name what is wrong, never the input.
    let parsed = Url::parse(url).map_err(|e| e.to_string())?;
    if parsed.scheme() == "rediss" {
        if !cfg!(feature = "tls") {
            return Err("rediss:// (TLS) needs the `tls` feature of ratewarden-redis".into());
        }
        if parsed.fragment() == Some("insecure") {
            return Err(
                "#insecure would turn off certificate verification; give the server's CA to \
                 RedisStoreBuilder::tls_root_ca instead"
                    .into(),
            );
        }
    }
    let info = parsed
        .into_connection_info()
        .map_err(|e| format!("not a usable Redis URL: {e}"))?;
    check_host(&info)?;
    Ok(Parsed {
        endpoint: Endpoint::Single(Box::new(info)),
        display: redact(url),
    })
}

/// `[user:password@]host1:port1,host2:port2,...[/]`: each node is parsed as
/// a `redis://` URL of its own, with the shared user information.
fn cluster(rest: &str) -> Result<Parsed, String> {
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (Some(auth), hosts),
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.is_empty() {
        return Err("a cluster URL needs at least one host:port".into());
    }
    let mut nodes = Vec::new();
    let mut first_display = None;
    for host in hosts.split(',') {
        let shape = || format!("cluster node {host:?} is not host:port");
        let (h, p) = host.rsplit_once(':').ok_or_else(shape)?;
        if h.is_empty() || h.contains(['/', '?', '#']) {
            return Err(shape());
        }
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("cluster node {host:?} has an invalid port"))?;
        let node = match auth {
            Some(a) => format!("redis://{a}@{h}:{p}"),
            None => format!("redis://{h}:{p}"),
        };
        let info = Url::parse(&node)
            .map_err(|e| format!("cluster node {host:?}: {e}"))?
            .into_connection_info()
            .map_err(|e| format!("cluster node {host:?}: {e}"))?;
        check_host(&info)?;
        first_display.get_or_insert_with(|| redact(&node));
        nodes.push(info);
    }
    // The first node's redacted URL carries the user information; the other
    // entries are bare host:port, checked above.
    let first = first_display.unwrap_or_default();
    let first = first.strip_prefix("redis://").unwrap_or(&first);
    let others: Vec<&str> = hosts.split(',').skip(1).collect();
    let display = if others.is_empty() {
        format!("redis+cluster://{first}")
    } else {
        format!("redis+cluster://{first},{}", others.join(","))
    };
    Ok(Parsed {
        endpoint: Endpoint::Cluster(nodes),
        display,
    })
}

/// The redis crate accepts `redis://` with an empty host or port 0; a store
/// that can never connect is a configuration error.
fn check_host(info: &ConnectionInfo) -> Result<(), String> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. }
            if host.is_empty() || *port == 0 =>
        {
            Err("missing host or port".into())
        }
        _ => Ok(()),
    }
}

/// A URL scheme as RFC 3986 writes it: a letter, then letters, digits,
/// `+`, `-` or `.`.
fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(url: &str) -> String {
        match parse(url) {
            Ok(_) => panic!("{url} was accepted"),
            Err(ConfigError::InvalidUrl { reason, .. }) => reason,
            Err(other) => panic!("{url}: {other}"),
        }
    }

    #[test]
    fn malformed_urls_are_refused() {
        for url in [
            "",
            "localhost:6379",
            "http://localhost",
            "redis://",
            "redis://host:notaport",
            "redis://:pw@host:99999",
            "redis://host:0",
            "redis://host/notadb",
            "redis+cluster://",
            "redis+cluster://a:1,b",
            "redis+cluster://a:1,:2",
            "redis+cluster://a:0",
            "redis+cluster://a:1/x,b:2",
            "rediss+cluster://a:1",
            "valkey://host",
        ] {
            reason(url);
        }
    }

    #[test]
    fn every_listed_scheme_is_recognised() {
        for scheme in URL_SCHEMES {
            let url = match *scheme {
                "redis+unix" | "unix" => format!("{scheme}:///run/redis.sock"),
                _ => format!("{scheme}://127.0.0.1:6379"),
            };
            let refused_without_tls = *scheme == "rediss" && !cfg!(feature = "tls");
            match parse(&url) {
                Ok(_) => assert!(!refused_without_tls, "{url}"),
                Err(e) => assert!(refused_without_tls, "{url}: {e}"),
            }
        }
        assert!(parse("REDIS://127.0.0.1").is_ok(), "schemes ignore case");
    }

    #[test]
    fn rediss_without_the_feature_names_it() {
        if cfg!(feature = "tls") {
            assert!(parse("rediss://cache:6379").is_ok());
            assert!(reason("rediss://cache:6379/#insecure").contains("tls_root_ca"));
        } else {
            assert!(reason("rediss://cache:6379").contains("`tls` feature"));
        }
    }

    #[test]
    fn cluster_urls_keep_every_node() {
        let parsed = parse("redis+cluster://u:p@a:1,b:2/").unwrap();
        let Endpoint::Cluster(nodes) = parsed.endpoint else {
            panic!("not a cluster")
        };
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        assert_eq!(addrs, ["a:1", "b:2"]);
        assert!(
            nodes
                .iter()
                .all(|n| n.redis_settings().password() == Some("p"))
        );
        assert_eq!(parsed.display, "redis+cluster://u:***@a:1,b:2");
    }

    #[test]
    fn passwords_never_reach_an_error_or_a_display() {
        // (URL, fragments of its password that must not be shown)
        let cases: &[(&str, &[&str])] = &[
            ("redis+unix:///s.sock?pass=hunter2", &["hunter2"]),
            ("redis+unix:///s.sock?pass=hunter2&db=x", &["hunter2"]),
            ("redis://:pa/ss@host", &["pa/ss", ":pa", "ss@"]),
            ("redis://user:hunter2@h:x", &["hunter2"]),
            ("redis://user:hunter2@h/notadb", &["hunter2"]),
            ("redis://:hun@ter2@host:1:2", &["hun@ter2", "ter2"]),
            ("redis+cluster://u:hunter2@a:1,b", &["hunter2"]),
            ("redis+cluster://u:hun/ter2@a:1,b:2", &["hun/ter2", "ter2"]),
            ("redis+cluster://u:hunter2@a:1,b:2", &["hunter2"]),
            ("rediss://u:hunter2@h:1/#insecure", &["hunter2"]),
            ("nope://u:hunter2@h", &["hunter2"]),
        ];
        for (url, secrets) in cases {
            let shown = match parse(url) {
                Ok(p) => p.display,
                Err(e) => format!("{e} {e:?}"),
            };
            for secret in *secrets {
                assert!(!shown.contains(secret), "{url}: {shown}");
            }
        }
    }
}
