//! Client identity: address sources, trust depth, normalisation and keys.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue};
use ratewarden::ConfigError;
use ratewarden::identity::{AddressSource, ClientIdentity, MIN_SECRET_LEN, peer_addr};
use rstest::rstest;

const SECRET: &[u8; 32] = b"test secret, thirty-two bytes!!!";
const PEER: &str = "10.0.0.1";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn headers(name: &str, lines: &[&str]) -> HeaderMap {
    let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
    let mut map = HeaderMap::new();
    for line in lines {
        map.append(
            name.clone(),
            HeaderValue::from_bytes(line.as_bytes()).unwrap(),
        );
    }
    map
}

fn resolve(source: &str, name: &str, lines: &[&str], peer: Option<&str>) -> Option<IpAddr> {
    let identity = ClientIdentity::new(SECRET)
        .unwrap()
        .with_source(source.parse().unwrap());
    identity.client_addr(&headers(name, lines), peer.map(ip))
}

#[rstest]
// One trusted hop: the rightmost entry, whatever the client wrote before it.
#[case::rightmost("x-forwarded-for:1", &["203.0.113.7"], "203.0.113.7")]
#[case::spoofed_entries_ignored("x-forwarded-for:1", &["1.1.1.1, 2.2.2.2, 203.0.113.7"], "203.0.113.7")]
#[case::two_hops("x-forwarded-for:2", &["6.6.6.6, 198.51.100.4, 10.0.0.9"], "198.51.100.4")]
#[case::lines_are_one_list("x-forwarded-for:1", &["6.6.6.6", "203.0.113.7"], "203.0.113.7")]
#[case::lines_are_one_list_two_hops("x-forwarded-for:2", &["6.6.6.6, 198.51.100.4", "10.0.0.9"], "198.51.100.4")]
#[case::empty_elements_skipped("x-forwarded-for:1", &["203.0.113.7, ,"], "203.0.113.7")]
#[case::with_port("x-forwarded-for:1", &["203.0.113.7:51234"], "203.0.113.7")]
#[case::bare_ipv6("x-forwarded-for:1", &["2001:db8::7"], "2001:db8::7")]
#[case::bracketed_ipv6_port("x-forwarded-for:1", &["[2001:db8::7]:443"], "2001:db8::7")]
#[case::mapped_is_ipv4("x-forwarded-for:1", &["::ffff:203.0.113.7"], "203.0.113.7")]
#[case::client_garbage_left("x-forwarded-for:1", &["\u{80}é;drop table, <script>, 203.0.113.7"], "203.0.113.7")]
// The trusted entry is unusable or missing: the peer, never a left entry.
#[case::garbage("x-forwarded-for:1", &["not-an-address"], PEER)]
#[case::garbage_trusted_slot("x-forwarded-for:1", &["203.0.113.7, garbage"], PEER)]
#[case::empty("x-forwarded-for:1", &[""], PEER)]
#[case::only_commas("x-forwarded-for:1", &[" , ,, "], PEER)]
#[case::too_short("x-forwarded-for:2", &["203.0.113.7"], PEER)]
#[case::no_header("x-forwarded-for:1", &[], PEER)]
#[case::unknown("x-forwarded-for:1", &["unknown"], PEER)]
// RFC 7239 Forwarded.
#[case::fwd_plain("forwarded:1", &["for=192.0.2.60;proto=http;by=203.0.113.43"], "192.0.2.60")]
#[case::fwd_case_insensitive("forwarded:1", &["For=192.0.2.60"], "192.0.2.60")]
#[case::fwd_quoted_v6_port("forwarded:1", &["for=\"[2001:db8:cafe::17]:4711\""], "2001:db8:cafe::17")]
#[case::fwd_quoted_v6("forwarded:1", &["for=\"[2001:db8:cafe::17]\""], "2001:db8:cafe::17")]
#[case::fwd_quoted_v4_port("forwarded:1", &["for=\"192.0.2.43:47011\""], "192.0.2.43")]
#[case::fwd_obfuscated_port("forwarded:1", &["for=\"[2001:db8::1]:_port\""], "2001:db8::1")]
#[case::fwd_list("forwarded:1", &["for=1.1.1.1, for=198.51.100.17;proto=https"], "198.51.100.17")]
#[case::fwd_two_hops("forwarded:2", &["for=9.9.9.9, for=198.51.100.17, for=10.0.0.2"], "198.51.100.17")]
#[case::fwd_client_unterminated_quote("forwarded:1", &["for=\"1.1.1.1, for=198.51.100.17"], "198.51.100.17")]
#[case::fwd_client_quoted_comma("forwarded:2", &["for=\"a,b\";x=1, for=198.51.100.17, for=10.0.0.2"], "198.51.100.17")]
#[case::fwd_unknown("forwarded:1", &["for=unknown"], PEER)]
#[case::fwd_obfuscated("forwarded:1", &["for=_gazonk"], PEER)]
#[case::fwd_obfuscated_quoted("forwarded:1", &["for=\"_gazonk\""], PEER)]
#[case::fwd_no_for("forwarded:1", &["proto=https;by=10.0.0.1"], PEER)]
#[case::fwd_two_fors("forwarded:1", &["for=1.1.1.1;for=2.2.2.2"], PEER)]
#[case::fwd_escape("forwarded:1", &["for=\"1.1.1.\\1\""], PEER)]
#[case::fwd_too_short("forwarded:2", &["for=198.51.100.17"], PEER)]
#[case::fwd_empty("forwarded:1", &[""], PEER)]
// A single-value header set by the edge.
#[case::cf("header:cf-connecting-ip", &["203.0.113.9"], "203.0.113.9")]
#[case::cf_v6("header:CF-Connecting-IP", &["2001:db8::5"], "2001:db8::5")]
#[case::cf_twice("header:cf-connecting-ip", &["203.0.113.9", "1.1.1.1"], PEER)]
#[case::cf_list("header:cf-connecting-ip", &["1.1.1.1, 203.0.113.9"], PEER)]
#[case::cf_garbage("header:cf-connecting-ip", &["nonsense"], PEER)]
#[case::cf_missing("header:cf-connecting-ip", &[], PEER)]
fn trust_depth(#[case] source: &str, #[case] lines: &[&str], #[case] expected: &str) {
    let name = match source.split_once(':').unwrap().0 {
        "header" => source.split_once(':').unwrap().1,
        "x-forwarded-for" => "x-forwarded-for",
        _ => "forwarded",
    };
    assert_eq!(resolve(source, name, lines, Some(PEER)), Some(ip(expected)));
}

#[rstest]
#[case("x-forwarded-for:1", "x-forwarded-for", "garbage")]
#[case("x-forwarded-for:3", "x-forwarded-for", "1.2.3.4, 5.6.7.8")]
#[case("forwarded:1", "forwarded", "for=unknown")]
#[case("peer", "x-forwarded-for", "1.2.3.4")]
fn no_usable_address_and_no_peer_is_the_constant_key(
    #[case] source: &str,
    #[case] name: &str,
    #[case] line: &str,
) {
    assert_eq!(resolve(source, name, &[line], None), None);
    let identity = ClientIdentity::new(SECRET)
        .unwrap()
        .with_source(source.parse().unwrap());
    let key = identity.key(&headers(name, &[line]), None);
    assert_eq!(key, identity.unknown_key());
    assert_ne!(key, identity.key_for_addr(ip("1.2.3.4")));
}

#[test]
fn the_peer_source_ignores_forwarding_headers() {
    let hs = headers("x-forwarded-for", &["203.0.113.7"]);
    let identity = ClientIdentity::new(SECRET).unwrap();
    assert_eq!(identity.client_addr(&hs, Some(ip(PEER))), Some(ip(PEER)));
    // A mapped peer (dual-stack socket) is its IPv4 address.
    assert_eq!(
        identity.client_addr(&hs, Some(ip("::ffff:10.0.0.1"))),
        Some(ip(PEER))
    );
}

#[rstest]
#[case::same_64("2001:db8:1:2::1", "2001:db8:1:2:ffff:eeee:dddd:cccc", 64, true)]
#[case::other_64("2001:db8:1:2::1", "2001:db8:1:3::1", 64, false)]
#[case::same_48("2001:db8:1:2::1", "2001:db8:1:3::1", 48, true)]
#[case::other_48("2001:db8:1:2::1", "2001:db8:2:2::1", 48, false)]
#[case::full_128("2001:db8::1", "2001:db8::2", 128, false)]
#[case::mapped_equals_v4("::ffff:192.0.2.1", "192.0.2.1", 64, true)]
#[case::mapped_not_grouped("::ffff:192.0.2.1", "::ffff:192.0.2.2", 64, false)]
#[case::v4_not_grouped("192.0.2.1", "192.0.2.2", 64, false)]
#[case::v4_vs_v6("192.0.2.1", "::192.0.2.1", 64, false)]
fn grouping(#[case] a: &str, #[case] b: &str, #[case] prefix: u8, #[case] same: bool) {
    let identity = ClientIdentity::new(SECRET)
        .unwrap()
        .with_ipv6_prefix(prefix)
        .unwrap();
    assert_eq!(
        identity.key_for_addr(ip(a)) == identity.key_for_addr(ip(b)),
        same,
        "{a} vs {b} at /{prefix}"
    );
}

#[test]
fn keys_are_stable_32_lowercase_hex_and_secret_dependent() {
    let identity = ClientIdentity::new(SECRET).unwrap();
    let key = identity.key_for_addr(ip("203.0.113.7"));
    assert_eq!(key, identity.key_for_addr(ip("203.0.113.7")));
    assert_eq!(key, identity.clone().key_for_addr(ip("203.0.113.7")));
    assert_eq!(key.as_str().len(), 32);
    assert!(
        key.as_str()
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    );
    assert_eq!(key.as_bytes(), key.as_str().as_bytes());
    assert_eq!(key.to_string(), key.as_str());
    assert_ne!(key, identity.key_for_addr(ip("203.0.113.8")));
    let other = ClientIdentity::new([b'x'; 32]).unwrap();
    assert_ne!(key, other.key_for_addr(ip("203.0.113.7")));
    assert_ne!(identity.unknown_key(), other.unknown_key());
    // The same address through any source is the same client.
    let via_xff = identity
        .clone()
        .with_source(AddressSource::x_forwarded_for(1).unwrap())
        .key(&headers("x-forwarded-for", &["203.0.113.7"]), None);
    assert_eq!(via_xff, key);
}

/// Keys are part of what a shared store holds: a release that derived them
/// differently would start every client's counters afresh at upgrade, the
/// offenders' included. These are HMAC-SHA-256 under `[7; 32]` of the
/// inputs the `identity` module documents (and, for the constant and
/// namespaced keys, of the inputs written beside them), computed outside
/// the crate (Python's `hmac`), first 16 bytes in hex.
#[rstest]
#[case::ipv4("203.0.113.7", "6fb1d695ddd6ce930b26a780b2996e92")] // client:ip4:<4 octets>
#[case::ipv4_mapped("::ffff:203.0.113.7", "6fb1d695ddd6ce930b26a780b2996e92")]
#[case::ipv6_by_64("2001:db8:0:1:aaaa::1", "87fb4ff5fcfa4d9c04bfe51dc4b86fce")] // client:ip6/<64>:<masked 16>
fn address_keys_are_the_documented_hmac(#[case] addr: &str, #[case] expected: &str) {
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    assert_eq!(identity.key_for_addr(ip(addr)).as_str(), expected);
}

#[test]
fn namespaced_and_constant_keys_are_the_documented_hmac() {
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    // client:unknown
    assert_eq!(
        identity.unknown_key().as_str(),
        "c4e9d148e93cb5252e8787ff2b46e187"
    );
    // client:ns<u32 length, big-endian><namespace><value>
    assert_eq!(
        identity.global_key().as_str(),
        "7ec541d0c37d5874c664c1a6d497ab51"
    );
    assert_eq!(
        identity.hasher("tenant").key(b"acme").as_str(),
        "c33b556d808754eafa86c69ab39b98d7"
    );
}

#[rstest]
#[case::empty(0)]
#[case::short(31)]
fn short_secrets_are_refused(#[case] got: usize) {
    let secret = vec![7u8; got];
    assert_eq!(
        ClientIdentity::new(&secret).unwrap_err(),
        ConfigError::SecretTooShort {
            got,
            min: MIN_SECRET_LEN
        }
    );
}

/// No part of the secret shows in the `Debug` of an identity or of a hasher
/// made from it: not eight of its characters in a row, nor four of its
/// bytes as hex or as a list of numbers.
#[test]
fn the_secret_is_not_in_debug_output() {
    let plain = ClientIdentity::new(SECRET).unwrap();
    let configured = ClientIdentity::new(SECRET)
        .unwrap()
        .with_ipv6_prefix(48)
        .unwrap();
    for identity in [plain, configured] {
        let hasher = identity.hasher("tenant");
        let debug = format!("{identity:?} {identity:#?} {hasher:?} {hasher:#?}");
        for window in SECRET.windows(8) {
            let text = std::str::from_utf8(window).unwrap();
            assert!(!debug.contains(text), "{text:?} shown: {debug}");
        }
        let hex: String = SECRET.iter().map(|b| format!("{b:02x}")).collect();
        for at in (0..=hex.len() - 8).step_by(2) {
            let digits = &hex[at..at + 8];
            assert!(
                !debug.to_ascii_lowercase().contains(digits),
                "{digits} shown: {debug}"
            );
        }
        let numbers = format!("{:?}", &SECRET[..4]);
        let numbers = numbers.trim_matches(['[', ']']);
        assert!(!debug.contains(numbers), "{numbers} shown: {debug}");
        assert!(debug.contains("peer"), "{debug}");
    }
}

#[rstest]
#[case(0)]
#[case(129)]
#[case(255)]
fn bad_ipv6_prefixes_are_refused(#[case] bits: u8) {
    let err = ClientIdentity::new(SECRET)
        .unwrap()
        .with_ipv6_prefix(bits)
        .unwrap_err();
    assert!(err.to_string().contains("between 1 and 128"), "{err}");
}

#[rstest]
#[case("peer", Some("peer"))]
#[case("x-forwarded-for:2", Some("x-forwarded-for:2"))]
#[case("XFF", Some("x-forwarded-for:1"))]
#[case("forwarded:1", Some("forwarded:1"))]
#[case("header:CF-Connecting-IP", Some("header:cf-connecting-ip"))]
#[case("x-forwarded-for:0", None)]
#[case("x-forwarded-for:65", None)]
#[case("x-forwarded-for:two", None)]
#[case("header:bad header", None)]
#[case("header", None)]
#[case("peer:1", None)]
#[case("socket", None)]
fn address_sources_parse(#[case] text: &str, #[case] expected: Option<&str>) {
    match (text.parse::<AddressSource>(), expected) {
        (Ok(source), Some(shown)) => assert_eq!(source.to_string(), shown),
        (Err(ConfigError::Invalid(_)), None) => {}
        (other, _) => panic!("{text:?} parsed as {other:?}"),
    }
}

#[test]
fn peer_address_comes_from_connect_info_or_socket_addr() {
    let mut ext = http::Extensions::new();
    assert_eq!(peer_addr(&ext), None);
    ext.insert("192.0.2.1:4000".parse::<SocketAddr>().unwrap());
    assert_eq!(peer_addr(&ext), Some(ip("192.0.2.1")));
    #[cfg(feature = "axum")]
    {
        ext.insert(axum::extract::ConnectInfo(
            "198.51.100.1:80".parse::<SocketAddr>().unwrap(),
        ));
        assert_eq!(peer_addr(&ext), Some(ip("198.51.100.1")));
    }
}
