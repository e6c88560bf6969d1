//! Allow and deny lists: clients a [`RateLimitLayer`](crate::RateLimitLayer)
//! refuses outright, and clients it never limits.
//!
//! An [`AccessList`] names clients by address range (CIDR, IPv4 and IPv6)
//! and by [`ClientKey`]. A denied client is answered `403 Forbidden`
//! (`PERMISSION_DENIED` over gRPC) before any store is asked; an allowed
//! one is passed to the handler unlimited, with no rate-limit headers. Deny
//! wins over allow, so a range can be allowed with holes denied in it.
//!
//! The address is the client's as the layer's
//! [`ClientIdentity`](crate::ClientIdentity) reads it (the socket peer, or a
//! forwarding header trusted to a configured depth), whatever the layer
//! keys requests by; an IPv4-mapped IPv6 address is matched as IPv4. A key
//! is matched as the layer's [`KeyExtractor`](crate::KeyExtractor) derives
//! it: to name an API key, derive its `ClientKey` with the same
//! identity and namespace ([`ClientIdentity::hasher`](crate::ClientIdentity::hasher)),
//! or take the 32 hex digits the store holds for that client.
//!
//! ```
//! use std::net::IpAddr;
//! use ratewarden::access::{Access, AccessList};
//!
//! let list = AccessList::new()
//!     .allow("10.0.0.0/8")?      // the office
//!     .deny("10.6.6.0/24")?      // but not this lab
//!     .deny("2001:db8:bad::/48")?;
//! let at = |a: &str| list.check_addr(a.parse::<IpAddr>().unwrap());
//! assert_eq!(at("10.1.2.3"), Access::Allow);
//! assert_eq!(at("10.6.6.9"), Access::Deny);
//! assert_eq!(at("2001:db8:bad::1"), Access::Deny);
//! assert_eq!(at("::ffff:10.6.6.9"), Access::Deny);
//! assert_eq!(at("192.0.2.1"), Access::Limit);
//! # Ok::<(), ratewarden::ConfigError>(())
//! ```
//!
//! Lists are scanned in full: meant for tens of ranges, an operator's
//! list, not a feed of millions of addresses (a [`skip`](crate::RateLimitLayerBuilder::skip)
//! closure over a table of your own serves that).

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use ratewarden_core::ConfigError;

use crate::identity::ClientKey;

/// What an [`AccessList`] says of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Refused outright (`403`), no store asked.
    Deny,
    /// Not limited.
    Allow,
    /// On neither list: limited as usual.
    Limit,
}

/// Clients refused outright and clients never limited, by address range
/// and by key; see the [module docs](self). Empty by default.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
    allow_keys: HashSet<ClientKey>,
    deny_keys: HashSet<ClientKey>,
}

impl fmt::Debug for AccessList {
    // Keys are client identities: counted, not listed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessList")
            .field("allow", &self.allow)
            .field("deny", &self.deny)
            .field("allow_keys", &self.allow_keys.len())
            .field("deny_keys", &self.deny_keys.len())
            .finish()
    }
}

impl AccessList {
    /// An empty list: every client is limited.
    pub fn new() -> Self {
        Self::default()
    }

    /// Never limits the clients in `range`: a CIDR (`"10.0.0.0/8"`,
    /// `"2001:db8::/32"`) or a single address. Refuses anything else, and a
    /// range with bits set past its prefix (`"10.0.0.1/8"`), which is
    /// usually a typo for another range.
    pub fn allow(mut self, range: &str) -> Result<Self, ConfigError> {
        self.allow.push(parse_range(range)?);
        Ok(self)
    }

    /// Refuses the clients in `range` outright; see [`allow`](Self::allow)
    /// for what `range` may be.
    pub fn deny(mut self, range: &str) -> Result<Self, ConfigError> {
        self.deny.push(parse_range(range)?);
        Ok(self)
    }

    /// Never limits requests whose key is `key`.
    pub fn allow_key(mut self, key: ClientKey) -> Self {
        self.allow_keys.insert(key);
        self
    }

    /// Refuses requests whose key is `key` outright.
    pub fn deny_key(mut self, key: ClientKey) -> Self {
        self.deny_keys.insert(key);
        self
    }

    /// Both lists are empty: the layer reads no address for them.
    pub fn is_empty(&self) -> bool {
        !self.has_ranges() && self.allow_keys.is_empty() && self.deny_keys.is_empty()
    }

    /// Some range is listed, so each request's address must be read.
    pub(crate) fn has_ranges(&self) -> bool {
        !self.allow.is_empty() || !self.deny.is_empty()
    }

    /// Some key is listed, so each request's key must be looked up.
    pub(crate) fn has_keys(&self) -> bool {
        !self.allow_keys.is_empty() || !self.deny_keys.is_empty()
    }

    /// What the lists say of a client at `addr`.
    pub fn check_addr(&self, addr: IpAddr) -> Access {
        let addr = addr.to_canonical();
        if self.deny.iter().any(|net| net.contains(&addr)) {
            Access::Deny
        } else if self.allow.iter().any(|net| net.contains(&addr)) {
            Access::Allow
        } else {
            Access::Limit
        }
    }

    /// What the lists say of a request keyed `key`.
    pub fn check_key(&self, key: &ClientKey) -> Access {
        if self.deny_keys.contains(key) {
            Access::Deny
        } else if self.allow_keys.contains(key) {
            Access::Allow
        } else {
            Access::Limit
        }
    }
}

fn parse_range(range: &str) -> Result<IpNet, ConfigError> {
    let range = range.trim();
    if let Ok(addr) = range.parse::<IpAddr>() {
        return Ok(IpNet::from(addr.to_canonical()));
    }
    let net: IpNet = range.parse().map_err(|_| {
        ConfigError::Invalid(format!(
            "{range:?} is not an address range: write a CIDR such as \"10.0.0.0/8\" or \
             \"2001:db8::/32\", or one address"
        ))
    })?;
    if net.trunc() != net {
        return Err(ConfigError::Invalid(format!(
            "{range:?} has address bits past its /{} prefix: did you mean {}?",
            net.prefix_len(),
            net.trunc()
        )));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    #[test]
    fn deny_wins_over_allow_and_addresses_match_as_their_canonical_form() {
        let list = AccessList::new()
            .allow("192.0.2.0/24")
            .unwrap()
            .deny("192.0.2.128/25")
            .unwrap()
            .allow("2001:db8::/32")
            .unwrap()
            .deny("198.51.100.7")
            .unwrap();
        assert_eq!(list.check_addr(addr("192.0.2.1")), Access::Allow);
        assert_eq!(list.check_addr(addr("192.0.2.200")), Access::Deny);
        assert_eq!(list.check_addr(addr("::ffff:192.0.2.200")), Access::Deny);
        assert_eq!(list.check_addr(addr("::ffff:192.0.2.1")), Access::Allow);
        assert_eq!(list.check_addr(addr("2001:db8:1::1")), Access::Allow);
        assert_eq!(list.check_addr(addr("2001:db9::1")), Access::Limit);
        assert_eq!(list.check_addr(addr("198.51.100.7")), Access::Deny);
        assert_eq!(list.check_addr(addr("198.51.100.8")), Access::Limit);
        // A bare IPv4-mapped address is listed as the IPv4 one it is.
        let mapped = AccessList::new().deny("::ffff:203.0.113.9").unwrap();
        assert_eq!(mapped.check_addr(addr("203.0.113.9")), Access::Deny);
    }

    #[test]
    fn a_range_that_is_not_one_is_refused_with_what_to_write() {
        for bad in ["10.0.0.0/33", "10.0.0/8", "example.com", "", "10.0.0.0/8/8"] {
            let err = AccessList::new().deny(bad).unwrap_err().to_string();
            assert!(err.contains("is not an address range"), "{bad}: {err}");
        }
        let err = AccessList::new()
            .allow("10.1.2.3/8")
            .unwrap_err()
            .to_string();
        assert!(err.contains("did you mean 10.0.0.0/8"), "{err}");
    }

    #[test]
    fn keys_are_listed_apart_from_ranges() {
        let identity = crate::ClientIdentity::new([7u8; 32]).unwrap();
        let bad = identity.hasher("header:x-api-key").key(b"leaked");
        let partner = identity.hasher("header:x-api-key").key(b"partner");
        let list = AccessList::new().deny_key(bad).allow_key(partner);
        assert!(!list.is_empty() && !list.has_ranges());
        assert_eq!(list.check_key(&bad), Access::Deny);
        assert_eq!(list.check_key(&partner), Access::Allow);
        let other = identity.hasher("header:x-api-key").key(b"other");
        assert_eq!(list.check_key(&other), Access::Limit);
        assert!(!format!("{list:?}").contains(bad.as_str()));
        // A key as the store holds it reads back as the same key.
        assert_eq!(bad.as_str().parse::<ClientKey>().unwrap(), bad);
        for text in ["", "abc", &bad.as_str().to_uppercase(), &format!("{bad}0")] {
            let err = text.parse::<ClientKey>().unwrap_err().to_string();
            assert!(err.contains("32 lowercase hex digits"), "{text}: {err}");
        }
    }
}
