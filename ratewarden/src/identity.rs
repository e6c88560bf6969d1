//! Client identity: which client a request comes from, as a key that never
//! reveals the client's address.
//!
//! A [`ClientIdentity`] turns a request into a [`ClientKey`]:
//!
//! 1. it finds the client's address from a configured [`AddressSource`] — the
//!    socket peer, or a forwarding header trusted only to a configured number
//!    of proxy hops;
//! 2. it normalises the address: an IPv4-mapped IPv6 address becomes its IPv4
//!    address, and an IPv6 address is cut to its network prefix (/64 by
//!    default, since one subscriber usually holds a whole /64 and would
//!    otherwise get a fresh quota per address);
//! 3. it derives the key as HMAC-SHA256 under a server secret of the purpose
//!    prefix `client:` and the normalised address, truncated to 32 lowercase
//!    hex characters. The input is `client:ip4:` and the four octets, or
//!    `client:ip6/`, the prefix length as one byte, `:` and the 16 octets of
//!    the masked address; these bytes are a compatibility promise, since a
//!    shared store's counters are held under the keys.
//!
//! No store ever sees a raw address, and without the secret a key cannot be
//! turned back into one by hashing the (small) IPv4 space.
//!
//! With no usable address at all, [`ClientIdentity::key`] gives every such
//! request one constant key ([`ClientIdentity::unknown_key`]): those clients
//! are throttled together, which is the conservative failure — they can
//! never earn separate quotas. The [`RateLimitLayer`](crate::RateLimitLayer)
//! goes further: a request with neither a peer address nor a trusted header
//! means the server does not pass connection information, and it answers
//! `500` rather than throttling every client of the site together.
//!
//! The secret is the server's: [`ClientIdentity::new`] takes one of at least
//! [`MIN_SECRET_LEN`] bytes, which every instance sharing a store must be
//! given; [`ClientIdentity::random`] draws one for a single process on the
//! in-process store.
//!
//! ```
//! use ratewarden::identity::{AddressSource, ClientIdentity};
//! use http::HeaderMap;
//!
//! let identity = ClientIdentity::new([7u8; 32])?
//!     // One reverse proxy in front of us appends the peer it saw.
//!     .with_source(AddressSource::x_forwarded_for(1)?);
//!
//! let mut headers = HeaderMap::new();
//! // The client wrote the first entry itself; only the last is trusted.
//! headers.insert("x-forwarded-for", "1.1.1.1, 203.0.113.7".parse().unwrap());
//! let key = identity.key(&headers, Some("10.0.0.1".parse().unwrap()));
//! assert_eq!(key, identity.key_for_addr("203.0.113.7".parse().unwrap()));
//! assert_eq!(key.as_str().len(), 32);
//! # Ok::<(), ratewarden::ConfigError>(())
//! ```
//!
//! About 570 lines before its tests: address parsing, normalisation and
//! keying are one chain whose every step decides what a client key is.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use http::header::{FORWARDED, HeaderName};
use http::{Extensions, HeaderMap, HeaderValue, Request};
use ratewarden_core::ConfigError;
use sha2::Sha256;

/// The shortest secret accepted, in bytes: as long as the HMAC-SHA256 output.
pub const MIN_SECRET_LEN: usize = 32;

/// The IPv6 prefix length addresses are grouped by unless configured.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The most proxy hops a forwarding header may be trusted to. Deeper chains
/// are a configuration mistake far more often than a real topology.
pub const MAX_TRUSTED_HOPS: usize = 64;

/// The length of a [`ClientKey`] in hex characters.
pub const KEY_LEN: usize = 32;

/// The purpose prefix of every HMAC input, so that a key derived here can
/// never equal an HMAC the same secret produces for another purpose.
const PURPOSE: &[u8] = b"client:";

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The key of one client: 32 lowercase hex characters of an HMAC, safe to
/// store and log.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey([u8; KEY_LEN]);

impl ClientKey {
    /// The key as text.
    pub fn as_str(&self) -> &str {
        // Always ASCII hex, written only by `ClientIdentity::derive`.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The key as bytes, as a [`Limiter`](ratewarden_core::Limiter) takes it.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::str::FromStr for ClientKey {
    type Err = ConfigError;

    /// A key as [`as_str`](ClientKey::as_str) writes it and a store holds
    /// it: 32 lowercase hex digits (for naming a client in an
    /// [`AccessList`](crate::access::AccessList) or a limits file).
    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let bytes = text.as_bytes();
        match <[u8; KEY_LEN]>::try_from(bytes) {
            Ok(key) if key.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
                Ok(ClientKey(key))
            }
            _ => Err(ConfigError::Invalid(format!(
                "{text:?} is not a client key: {KEY_LEN} lowercase hex digits"
            ))),
        }
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({})", self.as_str())
    }
}

impl AsRef<[u8]> for ClientKey {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Where a client's address comes from.
///
/// Parsed from text by [`FromStr`]: `peer`, `x-forwarded-for:N`,
/// `forwarded:N` or `header:NAME`.
///
/// A forwarding header is only as trustworthy as the proxies that write it.
/// Each proxy *appends* the address it received the request from, so with
/// `N` trusted proxies in front of the server, the `N`th entry from the
/// right of the combined list (all lines of the header, in order) was
/// written by the outermost trusted proxy about the peer it saw. Every
/// entry to its left was written by the client or by proxies we do not
/// control, and is ignored.
///
/// When the trusted entry is missing (the list is shorter than `N`) or
/// unusable (garbage, an obfuscated or `unknown` identifier), the key falls
/// back to the socket peer. That is never weaker than the header: the peer
/// is the one address the client cannot forge. A request that bypassed the
/// proxies is keyed by its real address, and one that came through them is
/// keyed by the proxy, sharing that proxy's quota with every other such
/// request. The constant key would be no stricter for the proxied case but
/// worse for the bypass case, where it would let one client exhaust a quota
/// shared with everyone else whose header is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressSource(Source);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Peer,
    XForwardedFor(usize),
    Forwarded(usize),
    Header(HeaderName),
}

impl AddressSource {
    /// The socket peer: axum's `ConnectInfo<SocketAddr>` extension (with the
    /// `axum` feature) or a plain [`SocketAddr`] request extension.
    pub fn peer() -> Self {
        AddressSource(Source::Peer)
    }

    /// `X-Forwarded-For`, behind `trusted_hops` proxies that each append to
    /// it. Refuses 0 (use [`AddressSource::peer`]) and more than
    /// [`MAX_TRUSTED_HOPS`].
    pub fn x_forwarded_for(trusted_hops: usize) -> Result<Self, ConfigError> {
        check_hops(trusted_hops).map(|n| AddressSource(Source::XForwardedFor(n)))
    }

    /// RFC 7239 `Forwarded` (its `for=` parameters), behind `trusted_hops`
    /// proxies that each append an element. Refuses 0 and more than
    /// [`MAX_TRUSTED_HOPS`].
    pub fn forwarded(trusted_hops: usize) -> Result<Self, ConfigError> {
        check_hops(trusted_hops).map(|n| AddressSource(Source::Forwarded(n)))
    }

    /// A single-value header that the edge in front of the server sets and
    /// overwrites, such as `CF-Connecting-IP` or `X-Real-IP`. A request
    /// carrying the header more than once, or a list in it, is ambiguous and
    /// falls back to the peer.
    pub fn header(name: &str) -> Result<Self, ConfigError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(|n| AddressSource(Source::Header(n)))
            .map_err(|_| ConfigError::Invalid(format!("{name:?} is not a valid header name")))
    }
}

fn check_hops(n: usize) -> Result<usize, ConfigError> {
    if n == 0 || n > MAX_TRUSTED_HOPS {
        return Err(ConfigError::Invalid(format!(
            "trusted proxy hops must be between 1 and {MAX_TRUSTED_HOPS}, got {n} \
             (use the peer address when no proxy is trusted)"
        )));
    }
    Ok(n)
}

impl Default for AddressSource {
    fn default() -> Self {
        Self::peer()
    }
}

impl fmt::Display for AddressSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Peer => f.write_str("peer"),
            Source::XForwardedFor(n) => write!(f, "x-forwarded-for:{n}"),
            Source::Forwarded(n) => write!(f, "forwarded:{n}"),
            Source::Header(name) => write!(f, "header:{name}"),
        }
    }
}

impl FromStr for AddressSource {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (kind, arg) = match s.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg)),
            None => (s, None),
        };
        let hops = |arg: Option<&str>| -> Result<usize, ConfigError> {
            arg.unwrap_or("1").trim().parse().map_err(|_| {
                ConfigError::Invalid(format!(
                    "{s:?}: the number of trusted hops must be a number"
                ))
            })
        };
        match (kind.trim().to_ascii_lowercase().as_str(), arg) {
            ("peer", None) => Ok(Self::peer()),
            ("x-forwarded-for" | "xff", arg) => Self::x_forwarded_for(hops(arg)?),
            ("forwarded", arg) => Self::forwarded(hops(arg)?),
            ("header", Some(name)) => Self::header(name.trim()),
            _ => Err(ConfigError::Invalid(format!(
                "unknown address source {s:?}: expected peer, x-forwarded-for:N, \
                 forwarded:N or header:NAME"
            ))),
        }
    }
}

/// Derives [`ClientKey`]s from requests. Cheap to clone (shared).
///
/// The secret never appears in `Debug` output.
#[derive(Clone)]
pub struct ClientIdentity {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    /// Keyed with the secret and already fed [`PURPOSE`], so a key costs a
    /// clone of this state and its own input only.
    client: Hmac<Sha256>,
    /// [`client`](Self::client) fed `ip4:` too: the input every IPv4 key
    /// (most of them) shares.
    ip4: Hmac<Sha256>,
    source: AddressSource,
    ipv6_prefix: u8,
    unknown: ClientKey,
    global: ClientKey,
    /// Made by [`ClientIdentity::random`]: its keys mean nothing to another
    /// process, so it must never key a store other processes share.
    random: bool,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("source", &format_args!("{}", self.inner.source))
            .field("ipv6_prefix", &self.inner.ipv6_prefix)
            .field("random", &self.inner.random)
            .finish_non_exhaustive()
    }
}

impl ClientIdentity {
    /// An identity keyed by `secret`, reading the socket peer and grouping
    /// IPv6 by /64.
    ///
    /// Refuses a secret shorter than [`MIN_SECRET_LEN`] bytes with
    /// [`ConfigError::SecretTooShort`]: a short secret lets anyone who sees
    /// keys recover addresses by brute force.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ConfigError::SecretTooShort {
                got: secret.len(),
                min: MIN_SECRET_LEN,
            });
        }
        let mut client = <Hmac<Sha256> as Mac>::new_from_slice(secret)
            .map_err(|_| ConfigError::Invalid("the HMAC secret was refused".into()))?;
        client.update(PURPOSE);
        let mut ip4 = client.clone();
        ip4.update(b"ip4:");
        let unknown = derive(&client, &[b"unknown"]);
        let global = KeyHasher::new(&client, "global").key(b"");
        Ok(ClientIdentity {
            inner: Arc::new(Inner {
                client,
                ip4,
                source: AddressSource::peer(),
                ipv6_prefix: DEFAULT_IPV6_PREFIX,
                unknown,
                global,
                random: false,
            }),
        })
    }

    /// An identity keyed by a secret drawn from the operating system's
    /// random source for this process alone: what a single process on the
    /// in-process memory store needs, with no secret to invent or keep.
    ///
    /// Its keys change whenever the process restarts, and two processes
    /// key the same client differently. That costs nothing when the counts
    /// live in the same process (they are lost on restart anyway), but over
    /// a store that several processes share every instance would give each
    /// client a quota of its own: a [`RateLimitLayer`](crate::RateLimitLayer)
    /// refuses a random identity in front of a shared store, and such a
    /// deployment needs one secret given to every instance
    /// ([`ClientIdentity::new`]).
    ///
    /// ```
    /// use ratewarden::ClientIdentity;
    ///
    /// let identity = ClientIdentity::random()?;
    /// assert!(identity.is_random());
    /// let addr = "203.0.113.7".parse().unwrap();
    /// assert_eq!(identity.key_for_addr(addr), identity.key_for_addr(addr));
    /// assert_ne!(identity.key_for_addr(addr), ClientIdentity::random()?.key_for_addr(addr));
    /// # Ok::<(), ratewarden::ConfigError>(())
    /// ```
    ///
    /// Fails only if the operating system has no random source to offer.
    pub fn random() -> Result<Self, ConfigError> {
        let mut secret = [0u8; MIN_SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| {
            ConfigError::Invalid(format!(
                "no random secret available ({e}): give ClientIdentity::new a secret"
            ))
        })?;
        let mut identity = ClientIdentity::new(secret)?;
        Arc::make_mut(&mut identity.inner).random = true;
        Ok(identity)
    }

    /// Whether this identity was made by [`ClientIdentity::random`], so that
    /// its keys hold for this process only.
    pub fn is_random(&self) -> bool {
        self.inner.random
    }

    /// Reads client addresses from `source`.
    pub fn with_source(mut self, source: AddressSource) -> Self {
        Arc::make_mut(&mut self.inner).source = source;
        self
    }

    /// Groups IPv6 addresses by their first `bits` bits. Refuses anything
    /// outside `1..=128`.
    pub fn with_ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        if !(1..=128).contains(&bits) {
            return Err(ConfigError::Invalid(format!(
                "IPv6 prefix length must be between 1 and 128, got {bits}"
            )));
        }
        Arc::make_mut(&mut self.inner).ipv6_prefix = bits;
        Ok(self)
    }

    /// Where addresses come from.
    pub fn source(&self) -> &AddressSource {
        &self.inner.source
    }

    /// The IPv6 prefix length addresses are grouped by.
    pub fn ipv6_prefix(&self) -> u8 {
        self.inner.ipv6_prefix
    }

    /// The key of every request without a usable address.
    pub fn unknown_key(&self) -> ClientKey {
        self.inner.unknown
    }

    /// The one key every request shares under
    /// [`GlobalKey`](crate::key::GlobalKey): a key of its own namespace, never
    /// equal to a client's.
    pub fn global_key(&self) -> ClientKey {
        self.inner.global
    }

    /// A hasher of keys in `namespace` (say `"header:x-api-key"`), for keys
    /// that are not addresses: API keys, user ids, tenants. Its keys look
    /// like every [`ClientKey`] and never equal one of another namespace or
    /// an address's, since the namespace is part of the HMAC input.
    ///
    /// Build it once (it holds the HMAC state keyed and fed with the
    /// namespace) and call [`KeyHasher::key`] per request.
    ///
    /// ```
    /// use ratewarden::ClientIdentity;
    ///
    /// let identity = ClientIdentity::new([7u8; 32])?;
    /// let tenants = identity.hasher("tenant");
    /// let key = tenants.key(b"acme");
    /// assert_eq!(key, identity.hasher("tenant").key(b"acme"));
    /// assert_ne!(key, identity.hasher("user").key(b"acme"));
    /// assert!(!key.as_str().contains("acme"));
    /// # Ok::<(), ratewarden::ConfigError>(())
    /// ```
    pub fn hasher(&self, namespace: &str) -> KeyHasher {
        KeyHasher::new(&self.inner.client, namespace)
    }

    /// The key of a request, from its headers and extensions (see
    /// [`peer_addr`]).
    pub fn key_for_request<B>(&self, request: &Request<B>) -> ClientKey {
        self.key(request.headers(), peer_addr(request.extensions()))
    }

    /// The key of a request with these headers from this peer.
    pub fn key(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> ClientKey {
        match self.client_addr(headers, peer) {
            Some(addr) => self.key_for_addr(addr),
            None => self.unknown_key(),
        }
    }

    /// The client's address as the configured source gives it, falling back
    /// to `peer` as [`AddressSource`] explains. IPv4-mapped IPv6 addresses
    /// are returned as IPv4; the address is not yet grouped by prefix.
    pub fn client_addr(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        let forwarded = match &self.inner.source.0 {
            Source::Peer => None,
            Source::XForwardedFor(n) => {
                nth_from_right(headers.get_all(X_FORWARDED_FOR).iter(), *n, parse_node)
            }
            Source::Forwarded(n) => nth_from_right(
                headers.get_all(FORWARDED).iter(),
                *n,
                parse_forwarded_element,
            ),
            Source::Header(name) => single_value(headers, name),
        };
        forwarded.or(peer).map(canonical)
    }

    /// The key of a client at `addr`.
    pub fn key_for_addr(&self, addr: IpAddr) -> ClientKey {
        match canonical(addr) {
            IpAddr::V4(v4) => derive(&self.inner.ip4, &[&v4.octets()]),
            IpAddr::V6(v6) => {
                let bits = self.inner.ipv6_prefix;
                let masked = mask(v6, bits);
                derive(&self.inner.client, &[b"ip6/", &[bits], b":", &masked])
            }
        }
    }
}

/// Derives [`ClientKey`]s of one namespace (see [`ClientIdentity::hasher`]).
///
/// The secret never appears in `Debug` output.
#[derive(Clone)]
pub struct KeyHasher {
    /// Keyed with the secret and already fed the purpose and namespace: a
    /// key then costs a clone of this state and the value's blocks.
    mac: Hmac<Sha256>,
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyHasher").finish_non_exhaustive()
    }
}

/// Opens every namespaced HMAC input, after [`PURPOSE`]. Address inputs open
/// with `ip4:`, `ip6/` or `unknown`, so no namespaced input equals one.
const NAMESPACE: &[u8] = b"ns";

impl KeyHasher {
    /// `client`: keyed and fed [`PURPOSE`].
    fn new(client: &Hmac<Sha256>, namespace: &str) -> Self {
        let mut mac = client.clone();
        mac.update(NAMESPACE);
        // The length first, so that no namespace and value can be read as
        // another namespace and value.
        let len = u32::try_from(namespace.len()).unwrap_or(u32::MAX);
        mac.update(&len.to_be_bytes());
        mac.update(namespace.as_bytes());
        KeyHasher { mac }
    }

    /// The key of `value` in this hasher's namespace.
    pub fn key(&self, value: &[u8]) -> ClientKey {
        let mut mac = self.mac.clone();
        mac.update(value);
        hex_key(&mac.finalize().into_bytes())
    }
}

/// The key of `parts` after what `mac` was already fed.
fn derive(mac: &Hmac<Sha256>, parts: &[&[u8]]) -> ClientKey {
    let mut mac = mac.clone();
    for part in parts {
        mac.update(part);
    }
    hex_key(&mac.finalize().into_bytes())
}

fn hex_key(digest: &[u8]) -> ClientKey {
    let mut out = [0u8; KEY_LEN];
    // KEY_LEN hex characters are the first KEY_LEN / 2 bytes of the digest.
    // hex::encode_to_slice only fails on a length mismatch, which the
    // constants rule out.
    let _ = hex::encode_to_slice(&digest[..KEY_LEN / 2], &mut out);
    ClientKey(out)
}

fn mask(addr: Ipv6Addr, bits: u8) -> [u8; 16] {
    let value = u128::from(addr);
    let keep = if bits >= 128 {
        u128::MAX
    } else {
        !(u128::MAX >> bits)
    };
    (value & keep).to_be_bytes()
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the same client as `a.b.c.d`:
/// dual-stack sockets report IPv4 peers that way.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The peer address of a request: axum's `ConnectInfo<SocketAddr>` (with the
/// `axum` feature), tonic's `TcpConnectInfo` (with the `grpc` feature), else
/// a [`SocketAddr`] extension, else none.
pub fn peer_addr(extensions: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "grpc")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

// The trust-depth walk is written here rather than taken from a
// Forwarded/X-Forwarded-For parsing crate on purpose: those parse the whole
// header left to right and fail (or resynchronise) on the first bad
// element, and the left part is exactly what the client controls. A client
// could then hide the trusted entries behind one malformed element, or an
// unterminated quote, of its own. Here the list is split from the right on
// commas, and only the `n`th entry is parsed. Splitting on every comma is
// safe because a node identifier (an address, `[v6]:port`, `_obfuscated`,
// `unknown`) never contains one, so entries written by trusted proxies are
// never split; a quoted comma in a client-written element only adds entries
// on the left, which are ignored anyway. Empty list elements are skipped,
// as RFC 9110 §5.6.1 asks of recipients.
fn nth_from_right<'a>(
    lines: impl DoubleEndedIterator<Item = &'a HeaderValue>,
    n: usize,
    parse: fn(&str) -> Option<IpAddr>,
) -> Option<IpAddr> {
    let entry = lines
        .rev()
        .flat_map(|line| line.as_bytes().rsplit(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|entry| !entry.is_empty())
        .nth(n - 1)?;
    parse(std::str::from_utf8(entry).ok()?)
}

fn single_value(headers: &HeaderMap, name: &HeaderName) -> Option<IpAddr> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    if value.contains(',') {
        return None;
    }
    parse_node(value)
}

/// One RFC 7239 element (`for=…;proto=…;by=…`): the address in its single
/// `for` parameter, if that is an address.
fn parse_forwarded_element(element: &str) -> Option<IpAddr> {
    let mut found = None;
    for pair in element.split(';') {
        let Some((name, value)) = pair.split_once('=') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("for") {
            if found.is_some() {
                // Two `for` parameters in one element: ambiguous.
                return None;
            }
            found = Some(value.trim());
        }
    }
    let value = found?;
    let value = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    if value.contains(['"', '\\']) {
        return None;
    }
    parse_node(value)
}

/// A node as proxies write it: `a.b.c.d`, `a.b.c.d:port`, an IPv6 address
/// bare or in brackets, `[v6]:port`. Ports (numeric or obfuscated) are
/// ignored. `unknown` and obfuscated identifiers (`_hidden`) are not
/// addresses.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    if let Ok(addr) = node.parse::<IpAddr>() {
        return Some(addr);
    }
    if let Some(rest) = node.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.starts_with(':') {
            return None;
        }
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let (host, _port) = node.split_once(':')?;
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes() {
        assert_eq!(parse_node("192.0.2.1"), Some("192.0.2.1".parse().unwrap()));
        assert_eq!(
            parse_node("192.0.2.1:80"),
            Some("192.0.2.1".parse().unwrap())
        );
        assert_eq!(
            parse_node("[2001:db8::1]:_p"),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(parse_node("[2001:db8::1]x"), None);
        assert_eq!(parse_node("unknown"), None);
        assert_eq!(parse_node("_hidden"), None);
        assert_eq!(parse_node(""), None);
    }

    #[test]
    fn mask_keeps_prefix_bits_only() {
        let a: Ipv6Addr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        assert_eq!(
            Ipv6Addr::from(mask(a, 64)),
            "2001:db8:1:2::".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(Ipv6Addr::from(mask(a, 128)), a);
        assert_eq!(
            Ipv6Addr::from(mask(a, 1)),
            "::".parse::<Ipv6Addr>().unwrap()
        );
    }
}
