//! Which quota a request is charged to: its rate-limit key.
//!
//! A [`KeyExtractor`] reads a key from a request's head (method, URI,
//! headers, extensions). The built-ins:
//!
//! | extractor | the key | without one |
//! |---|---|---|
//! | [`ClientAddress`] (the default) | the client's address, through [`ClientIdentity`] | no peer address and no trusted header: a server misconfiguration, answered `500` |
//! | [`HeaderKey`] | a header's value, such as an API key | header absent, empty or repeated |
//! | [`ExtensionKey`] | a value an auth layer put in the request's extensions | extension absent |
//! | [`GlobalKey`] | one key for every request | never |
//!
//! Every key is a [`ClientKey`]: an HMAC under the identity's secret,
//! in a namespace of its own (an address, a header, an extension type), so
//! no store ever holds an address, an API key or a user id, and a value in
//! one namespace never shares a quota with the same value in another.
//!
//! What happens to a request whose key cannot be extracted is the layer's
//! choice ([`MissingKey`](crate::layer::MissingKey)): by default it is
//! limited by its client address instead.
//!
//! # Implementing an extractor
//!
//! ```
//! use http::request::Parts;
//! use ratewarden::{ClientIdentity, ClientKey};
//! use ratewarden::identity::KeyHasher;
//! use ratewarden::key::KeyExtractor;
//!
//! /// One quota per tenant, named by the first segment of the path.
//! #[derive(Debug)]
//! struct Tenant(KeyHasher);
//!
//! impl KeyExtractor for Tenant {
//!     fn extract(&self, request: &Parts) -> Option<ClientKey> {
//!         let tenant = request.uri.path().trim_start_matches('/').split('/').next()?;
//!         (!tenant.is_empty()).then(|| self.0.key(tenant.as_bytes()))
//!     }
//! }
//!
//! let identity = ClientIdentity::new([7u8; 32])?;
//! let tenant = Tenant(identity.hasher("tenant"));
//! let (parts, ()) = http::Request::get("/acme/search").body(()).unwrap().into_parts();
//! assert_eq!(tenant.extract(&parts), Some(identity.hasher("tenant").key(b"acme")));
//! # Ok::<(), ratewarden::ConfigError>(())
//! ```

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;
use http::request::Parts;
use ratewarden_core::ConfigError;

use crate::identity::{ClientIdentity, ClientKey, KeyHasher, peer_addr};

/// Reads the rate-limit key of a request from its head.
///
/// Called once per request, before the limiter: keep it cheap and never
/// block. Return `None` when the request carries no key; the layer then
/// follows its [`MissingKey`](crate::layer::MissingKey) setting.
pub trait KeyExtractor: fmt::Debug + Send + Sync + 'static {
    /// The key of `request`, or `None` if it has none.
    fn extract(&self, request: &Parts) -> Option<ClientKey>;
}

/// Keys a request by its client's address ([`ClientIdentity::key`]): the
/// socket peer, or a forwarding header trusted to a configured depth.
///
/// Has no key for a request with no address at all: no trusted forwarding
/// header and no peer address in its extensions. That is a server that does
/// not pass connection information to the layer (axum without
/// `into_make_service_with_connect_info`), never a client's doing, so the
/// [`RateLimitLayer`](crate::RateLimitLayer) answers it `500` and logs how
/// to fix it, rather than putting every client under one shared key.
#[derive(Debug, Clone)]
pub struct ClientAddress {
    identity: ClientIdentity,
}

impl ClientAddress {
    /// Keys requests by the address `identity` reads.
    pub fn new(identity: ClientIdentity) -> Self {
        ClientAddress { identity }
    }
}

impl KeyExtractor for ClientAddress {
    fn extract(&self, request: &Parts) -> Option<ClientKey> {
        let addr = self
            .identity
            .client_addr(&request.headers, peer_addr(&request.extensions))?;
        Some(self.identity.key_for_addr(addr))
    }
}

/// Keys a request by the value of one header, such as `X-Api-Key`: each
/// value gets its own quota. The value is hashed under the identity's
/// secret (namespace `header:<name>`) and never stored.
///
/// A request without the header, with an empty value or with the header
/// more than once (which value would be the key?) has no key.
///
/// The header is whatever the client sends: unless a layer in front of this
/// one has checked it, a client can mint a fresh quota per request by
/// inventing values. Limit by header after authentication, or pair it with
/// an address limit.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    hasher: KeyHasher,
}

impl HeaderKey {
    /// Keys requests by the header `name`, hashed with `identity`'s secret.
    /// Refuses a name that is not a valid header name.
    pub fn new(identity: &ClientIdentity, name: &str) -> Result<Self, ConfigError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::Invalid(format!("{name:?} is not a valid header name")))?;
        let hasher = identity.hasher(&format!("header:{name}"));
        Ok(HeaderKey { name, hasher })
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, request: &Parts) -> Option<ClientKey> {
        let mut values = request.headers.get_all(&self.name).iter();
        let value = values.next()?;
        if values.next().is_some() || value.is_empty() {
            return None;
        }
        Some(self.hasher.key(value.as_bytes()))
    }
}

/// A value that identifies a caller, as an authentication layer leaves it in
/// a request's extensions (a user id, an account, a tenant).
///
/// Implemented for strings, byte vectors and unsigned integers; implement it
/// for an id type of your own by returning its bytes.
pub trait LimitKey: Clone + Send + Sync + 'static {
    /// The bytes that identify the caller. They are hashed before any store
    /// sees them.
    fn key_bytes(&self) -> impl AsRef<[u8]>;
}

impl LimitKey for String {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.as_bytes()
    }
}

impl LimitKey for std::sync::Arc<str> {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.as_bytes()
    }
}

impl LimitKey for Vec<u8> {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.as_slice()
    }
}

impl LimitKey for u32 {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.to_be_bytes()
    }
}

impl LimitKey for u64 {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.to_be_bytes()
    }
}

impl LimitKey for u128 {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.to_be_bytes()
    }
}

/// Keys a request by a `T` in its extensions, put there by a layer that
/// runs before this one (an authentication layer inserting the user id).
/// The value is hashed under the identity's secret, in a namespace of its
/// own (`extension:<namespace>`), and never stored.
///
/// A request without a `T` has no key.
///
/// ```
/// use ratewarden::ClientIdentity;
/// use ratewarden::key::{ExtensionKey, KeyExtractor, LimitKey};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl LimitKey for UserId {
///     fn key_bytes(&self) -> impl AsRef<[u8]> {
///         self.0.to_be_bytes()
///     }
/// }
///
/// let identity = ClientIdentity::new([7u8; 32])?;
/// let users = ExtensionKey::<UserId>::new(&identity, "user");
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(UserId(42));
/// let (parts, ()) = request.into_parts();
/// assert_eq!(users.extract(&parts), Some(identity.hasher("extension:user").key(&42u64.to_be_bytes())));
/// # Ok::<(), ratewarden::ConfigError>(())
/// ```
pub struct ExtensionKey<T> {
    hasher: KeyHasher,
    namespace: String,
    _type: PhantomData<fn() -> T>,
}

impl<T: LimitKey> ExtensionKey<T> {
    /// Keys requests by their `T` extension, hashed with `identity`'s secret
    /// in `namespace` (say `"user"`). Two extractors of one namespace share
    /// quotas for equal values; give each kind of id its own.
    pub fn new(identity: &ClientIdentity, namespace: &str) -> Self {
        ExtensionKey {
            hasher: identity.hasher(&format!("extension:{namespace}")),
            namespace: namespace.to_owned(),
            _type: PhantomData,
        }
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        ExtensionKey {
            hasher: self.hasher.clone(),
            namespace: self.namespace.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<T: LimitKey> KeyExtractor for ExtensionKey<T> {
    fn extract(&self, request: &Parts) -> Option<ClientKey> {
        let value = request.extensions.get::<T>()?;
        Some(self.hasher.key(value.key_bytes().as_ref()))
    }
}

/// One key for every request: the layer limits the total traffic it sees,
/// whoever sends it (a protected backend's capacity, a paid upstream API's
/// quota).
#[derive(Debug, Clone)]
pub struct GlobalKey {
    key: ClientKey,
}

impl GlobalKey {
    /// The global key of `identity` ([`ClientIdentity::global_key`]).
    pub fn new(identity: &ClientIdentity) -> Self {
        GlobalKey {
            key: identity.global_key(),
        }
    }
}

impl KeyExtractor for GlobalKey {
    fn extract(&self, _: &Parts) -> Option<ClientKey> {
        Some(self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> ClientIdentity {
        ClientIdentity::new([9u8; 32]).unwrap()
    }

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder();
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_header_key_needs_exactly_one_non_empty_value() {
        let id = identity();
        let api = HeaderKey::new(&id, "X-Api-Key").unwrap();
        let a = api.extract(&parts(&[("x-api-key", "a")])).unwrap();
        assert_eq!(a, id.hasher("header:x-api-key").key(b"a"));
        assert_ne!(Some(a), api.extract(&parts(&[("x-api-key", "b")])));
        assert_eq!(api.extract(&parts(&[])), None);
        assert_eq!(api.extract(&parts(&[("x-api-key", "")])), None);
        assert_eq!(
            api.extract(&parts(&[("x-api-key", "a"), ("x-api-key", "b")])),
            None
        );
        assert!(HeaderKey::new(&id, "bad name").is_err());
    }

    #[test]
    fn namespaces_never_share_a_key() {
        let id = identity();
        let keys = [
            id.hasher("header:x-api-key").key(b"1"),
            id.hasher("extension:user").key(b"1"),
            id.hasher("").key(b"1"),
            id.hasher("1").key(b""),
            id.global_key(),
            id.unknown_key(),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
