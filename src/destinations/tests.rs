//! The policy's own cases: which addresses are refused with and without
//! a list, how lists parse, and the check at registration.

use super::*;

fn d(list: &str) -> Destinations {
    list.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn without_a_list_internal_link_local_and_metadata_addresses_are_refused() {
    let any = Destinations::default();
    for refused in [
        "169.254.169.254",
        "169.254.1.2",
        "fe80::1",
        "100.100.100.200",
        "fd00:ec2::254",
        "::ffff:169.254.169.254",
        // The embedded forms of the metadata address.
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        "::a9fe:a9fe",
        // This host, private networks, CGNAT.
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "0.0.0.0",
        "::",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "fc00::1",
        "fd12:3456::1",
        "::ffff:127.0.0.1",
        "64:ff9b::7f00:1",
        "2002:7f00:1::",
        "::10.0.0.1",
    ] {
        assert!(any.refusal(ip(refused), false).is_some(), "{refused}");
    }
    for allowed in [
        "93.184.216.34",
        "100.128.0.1",
        "172.32.0.1",
        "2606:4700::1",
        "64:ff9b::5db8:d822",
        "2002:5db8:d822::1",
    ] {
        assert!(any.refusal(ip(allowed), false).is_none(), "{allowed}");
    }
}

#[test]
fn internal_addresses_are_accepted_only_when_listed() {
    let loopback = Destinations::loopback();
    for allowed in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
        assert!(loopback.refusal(ip(allowed), false).is_none(), "{allowed}");
    }
    for refused in [
        "10.0.0.1",
        "0.0.0.0",
        "::",
        "169.254.169.254",
        "93.184.216.34",
    ] {
        assert!(loopback.refusal(ip(refused), false).is_some(), "{refused}");
    }
    // Through a listed name, a private address is fine; metadata never.
    let named = d("hooks.internal");
    assert!(named.refusal(ip("10.0.0.5"), true).is_none());
    assert!(named.refusal(ip("10.0.0.5"), false).is_some());
    assert!(named.refusal(ip("64:ff9b::a9fe:a9fe"), true).is_some());
}

#[test]
fn a_list_allows_its_networks_and_metadata_only_when_named() {
    let list = d("10.0.0.0/8, deploy.internal, 0.0.0.0/0");
    assert!(list.refusal(ip("10.9.9.9"), false).is_none());
    // A catch-all is not an explicit permission for metadata.
    assert!(list.refusal(ip("169.254.169.254"), false).is_some());
    assert!(list.lists_host("Deploy.Internal."));
    let named = d("169.254.169.254, fe80::/10");
    assert!(named.refusal(ip("169.254.169.254"), false).is_none());
    assert!(named.refusal(ip("169.254.169.253"), false).is_some());
    assert!(named.refusal(ip("fe80::9"), false).is_none());
    assert!(d("127.0.0.2").refusal(ip("127.0.0.1"), false).is_some());
    // A listed name may go to addresses outside the networks, but never
    // to metadata.
    assert!(d("x.internal").refusal(ip("10.0.0.1"), true).is_none());
    assert!(d("x.internal")
        .refusal(ip("169.254.169.254"), true)
        .is_some());
}

#[test]
fn lists_parse_or_say_what_is_wrong() {
    assert_eq!(d(""), Destinations::default());
    assert_eq!(d(" , "), Destinations::default());
    assert!(Destinations::parse("10.0.0.0/33").is_err());
    assert!(Destinations::parse("http://x").is_err());
    assert!(Destinations::parse("[::1], ::ffff:10.0.0.1/128").is_ok());
}

#[tokio::test]
async fn base_urls_are_checked_without_contacting_them() {
    let any = Destinations::default();
    assert!(any
        .check_url("http://169.254.169.254/latest")
        .await
        .is_err());
    assert!(any.check_url("http://[fd00:ec2::254]").await.is_err());
    assert!(any.check_url("http://127.0.0.1:9").await.is_err());
    for name in ["localhost", "LocalHost"] {
        let url = format!("http://{name}:9");
        let err = any.check_url(&url).await.unwrap_err();
        assert!(err.contains("names this host"), "{url}: {err}");
        assert!(
            Destinations::loopback().check_url(&url).await.is_ok(),
            "{url}"
        );
    }
    assert!(d("localhost").check_url("http://localhost:9").await.is_ok());
    assert!(any.check_url("http://localhost.:9").await.is_err());
    assert!(any.check_url("http://[::]:9").await.is_err());
    assert!(any.check_url("http://0.0.0.0:9").await.is_err());
    assert!(any.check_url("http://[64:ff9b::a9fe:a9fe]").await.is_err());
    assert!(any.check_url("http://unresolvable.invalid").await.is_ok());
    let list = d("127.0.0.2, hooks.internal");
    assert!(list.check_url("http://127.0.0.1:9").await.is_err());
    assert!(list.check_url("http://127.0.0.2:9").await.is_ok());
    assert!(list.check_url("http://hooks.internal:8080/x").await.is_ok());
    assert!(list.check_url("http://localhost:9").await.is_err());
}
