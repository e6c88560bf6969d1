//! Strings kept for the life of the process, one copy of each.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::policy::Policy;

/// `text` as a `&'static str`, the same one for every call with equal text.
/// Each distinct text is leaked once, for the life of the process.
///
/// A [`Rule`](crate::Rule)'s name is interned so that every decision can
/// name its rule without a reference count, and the HTTP layer interns the
/// header values it derives from a limiter's configuration, so that every
/// response can carry them without one: a reference count on a value that
/// every request shares is a cache line bounced between every core serving
/// requests. Intern only text that comes from configuration, whose distinct
/// values are few however many limiters are built with them; never text
/// from a request, which an attacker would grow without bound.
///
/// ```
/// let a = ratewarden_core::intern("search");
/// let b = ratewarden_core::intern(&String::from("search"));
/// assert!(std::ptr::eq(a, b));
/// ```
pub fn intern(text: &str) -> &'static str {
    static TEXTS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut texts = TEXTS
        .get_or_init(Mutex::default)
        .lock()
        // A set of strings is whole after any panic.
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(interned) = texts.get(text) {
        return interned;
    }
    let interned: &'static str = Box::leak(text.into());
    texts.insert(interned);
    interned
}

/// `policy` as a `&'static Policy`, the same one for every equal policy, for
/// [`Source::policy`](crate::Source::policy): interned for the reasons a
/// rule's name is, and from configuration only, as it is.
pub(crate) fn intern_policy(policy: &Policy) -> &'static Policy {
    static POLICIES: OnceLock<Mutex<HashSet<&'static Policy>>> = OnceLock::new();
    let mut policies = POLICIES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(interned) = policies.get(policy) {
        return interned;
    }
    let interned: &'static Policy = Box::leak(Box::new(*policy));
    policies.insert(interned);
    interned
}
