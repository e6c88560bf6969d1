//! Store URLs: `ratewarden::store::from_url` (memory://, redis://, rediss://,
//! redis+cluster://, postgres:// and garbage) and the Redis builder. Never
//! panics, never contacts anything, and never echoes a password in an
//! error.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;

/// The error `from_url` answers for `url`, if any. Only the parse layer is
/// compiled in (see Cargo.toml), so the future completes without waiting on
/// anything.
fn error_of(url: &str) -> Option<String> {
    let mut fut = pin!(ratewarden::store::from_url(url));
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => r.err().map(|e| e.to_string()),
        Poll::Pending => panic!("from_url waited on I/O for {url:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(message) = error_of(url) {
        assert!(!message.is_empty());
        // A password between "user:" and "@" must not appear in the error.
        if let Some((_, rest)) = url.split_once("://") {
            let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
            if let Some((userinfo, _)) = authority.rsplit_once('@')
                && let Some((_, password)) = userinfo.split_once(':')
                && password.len() >= 6
                && !url.replacen(password, "", 1).contains(password)
                // Text the error says whatever the password (a scheme
                // named `memory`, say) is not a leak: the same URL with
                // the password swapped for other characters must not
                // mention it either.
                && !error_of(&url.replacen(password, &"\u{1}".repeat(password.len()), 1))
                    .is_some_and(|other| other.contains(password))
            {
                assert!(
                    !message.contains(password),
                    "{message:?} leaks {password:?}"
                );
            }
        }
    }
    // The Redis builder directly: it parses and checks without connecting.
    if let Err(e) = ratewarden_redis::RedisStore::from_url(url) {
        assert!(!e.to_string().is_empty());
    }
});
