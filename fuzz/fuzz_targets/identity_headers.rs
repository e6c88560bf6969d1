//! Forwarding headers and address parsing: any header bytes, any address
//! source text, any trust depth. Never panics; the key is always 32 hex
//! characters; a request whose headers hold no usable trusted address is
//! keyed by its peer; the peer source ignores headers entirely.
#![no_main]

use std::net::{IpAddr, Ipv6Addr};

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use ratewarden::identity::{AddressSource, ClientIdentity};

fuzz_target!(|data: &[u8]| {
    // Layout: [selector, hops, prefix bits, peer kind, 16 peer bytes] then
    // header values separated by 0xFF, the last being the source text.
    if data.len() < 20 {
        return;
    }
    let (head, rest) = data.split_at(20);
    let hops = usize::from(head[1] % 70);
    let mut parts: Vec<&[u8]> = rest.split(|b| *b == 0xFF).collect();
    let source_text = parts.pop().unwrap_or_default();
    let source = match head[0] % 5 {
        0 => Some(AddressSource::peer()),
        1 => AddressSource::x_forwarded_for(hops).ok(),
        2 => AddressSource::forwarded(hops).ok(),
        3 => AddressSource::header("x-real-ip").ok(),
        _ => std::str::from_utf8(source_text)
            .ok()
            .and_then(|s| s.parse::<AddressSource>().ok()),
    };
    let Some(source) = source else { return };
    // Display and FromStr round-trip.
    let shown = source.to_string();
    assert_eq!(
        shown.parse::<AddressSource>().ok().as_ref(),
        Some(&source),
        "{shown}"
    );

    let Ok(identity) = ClientIdentity::new([42u8; 32]) else {
        panic!("a 32-byte secret is accepted")
    };
    let identity = match identity.clone().with_ipv6_prefix(head[2]) {
        Ok(i) => i,
        Err(_) => {
            assert!(head[2] == 0 || head[2] > 128);
            identity
        }
    };
    let identity = identity.with_source(source.clone());

    let mut headers = HeaderMap::new();
    let names = [
        HeaderName::from_static("x-forwarded-for"),
        HeaderName::from_static("forwarded"),
        HeaderName::from_static("x-real-ip"),
    ];
    for (i, value) in parts.iter().enumerate() {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(names[i % names.len()].clone(), v);
        }
    }
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&head[4..20]);
    let peer = match head[3] % 3 {
        0 => None,
        1 => Some(IpAddr::from([octets[0], octets[1], octets[2], octets[3]])),
        _ => Some(IpAddr::V6(Ipv6Addr::from(octets))),
    };

    let key = identity.key(&headers, peer);
    assert_eq!(key.as_str().len(), 32);
    assert!(
        key.as_str()
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    let addr = identity.client_addr(&headers, peer);
    match addr {
        Some(a) => assert_eq!(key, identity.key_for_addr(a)),
        None => {
            assert!(peer.is_none());
            assert_eq!(key, identity.unknown_key());
        }
    }
    if source == AddressSource::peer() {
        assert_eq!(key, identity.key(&HeaderMap::new(), peer));
    }
    // Never mapped v4-in-v6: one client, one key.
    assert!(!matches!(addr, Some(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some()));
});
