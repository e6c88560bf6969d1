//! Store URLs: `limiter::store::from_url` (memory://, redis://, rediss://,
//! redis+cluster://, postgres:// and garbage) and the Redis builder. Never
//! panics, never contacts anything, and never echoes a password in an
//! error.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    // Only the parse layer is compiled in (see Cargo.toml), so the future
    // completes without waiting on anything.
    let mut fut = pin!(limiter::store::from_url(url));
    let result = match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("from_url waited on I/O for {url:?}"),
    };
    if let Err(e) = result {
        let message = e.to_string();
        assert!(!message.is_empty());
        // A password between "user:" and "@" must not appear in the error.
        if let Some((_, rest)) = url.split_once("://") {
            let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
            if let Some((userinfo, _)) = authority.rsplit_once('@')
                && let Some((_, password)) = userinfo.split_once(':')
                && password.len() >= 6
                && !url.replacen(password, "", 1).contains(password)
            {
                assert!(
                    !message.contains(password),
                    "{message:?} leaks {password:?}"
                );
            }
        }
    }
    // The Redis builder directly: it parses and checks without connecting.
    if let Err(e) = limiter_redis::RedisStore::from_url(url) {
        assert!(!e.to_string().is_empty());
    }
});
