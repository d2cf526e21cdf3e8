//! Where the runtime may call out for users (DESIGN, invariant 12): an MCP server named by an
//! app's manifest, and later webhooks, A2A agents and model endpoints, never reach the
//! deployment's own internal addresses — loopback, link-local (cloud metadata among them),
//! private and shared ranges, multicast, unspecified — unless the operator allows that address
//! (or host, or range) explicitly.
//!
//! Contract: the check runs **after** DNS resolution, on every address the name resolves to,
//! and the caller connects to exactly the addresses that were checked (pinned), so a name
//! that resolves to something else a moment later (DNS rebinding) reaches nothing new.
//! Redirects are not followed by the clients that use it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What the operator allows besides public addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outbound {
    allow: Vec<Allowed>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    /// An address or a range (`127.0.0.1`, `10.0.0.0/8`, `fd00::/8`).
    Net(ipnet::IpNet),
    /// A host name, as the URL spells it (case aside): whatever it resolves to.
    Host(String),
}

impl Outbound {
    /// The operator's allowlist: addresses, ranges (CIDR) and host names. The error names
    /// the entry that is none of these.
    pub fn parse(items: &[String]) -> Result<Self, String> {
        let mut allow = Vec::new();
        for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
            if let Ok(net) = item.parse::<ipnet::IpNet>() {
                allow.push(Allowed::Net(net));
            } else if let Ok(ip) = item.parse::<IpAddr>() {
                allow.push(Allowed::Net(ipnet::IpNet::from(ip)));
            } else if item.len() <= 253
                && item
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                allow.push(Allowed::Host(item.to_ascii_lowercase()));
            } else {
                return Err(format!(
                    "{item:?} is not an address, a range (CIDR) or a host name"
                ));
            }
        }
        Ok(Self { allow })
    }

    /// The addresses of `url`'s host, every one of them public or allowed; the caller
    /// connects to these and no others. The error says which address was refused and how
    /// an operator would allow it.
    pub async fn resolve(&self, url: &url::Url) -> Result<Vec<SocketAddr>, String> {
        let host = url
            .host_str()
            .ok_or_else(|| format!("{url} names no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("{url} names no port"))?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("{host} does not resolve: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("{host} resolves to no address"));
        }
        let host_allowed = self
            .allow
            .iter()
            .any(|a| matches!(a, Allowed::Host(h) if *h == host));
        for addr in &addrs {
            let ip = addr.ip();
            let allowed = host_allowed
                || self
                    .allow
                    .iter()
                    .any(|a| matches!(a, Allowed::Net(n) if n.contains(&ip)));
            if internal(ip) && !allowed {
                return Err(format!(
                    "{host} resolves to {ip}, an internal address this deployment does not call for apps; an operator allows it with --outbound-allow {ip}"
                ));
            }
        }
        Ok(addrs)
    }
}

/// Whether `ip` is one of the deployment's own kinds of address rather than the internet's.
pub fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped().or_else(|| embedded_v4(v6)) {
                return internal_v4(v4);
            }
            let s = v6.segments();
            let first = s[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (first & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || (first == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64 64:ff9b:1::/48
                || (first == 0x2001 && s[1] == 0x0db8) // documentation
                || v6 == Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1)
                // IPv4-compatible ::a.b.c.d (deprecated, still routed by some stacks)
                || (v6.segments()[..6].iter().all(|s| *s == 0))
        }
    }
}

/// The IPv4 address an IPv6 one stands for, where a translation carries it inside: NAT64's
/// well-known prefix (`64:ff9b::/96`), SIIT (`::ffff:0:a.b.c.d`) and 6to4 (`2002:a.b.c.d::/48`).
/// Such an address reaches what its IPv4 address reaches, and is judged as that.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let tail =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return Some(tail(s[6], s[7]));
    }
    if s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0 {
        return Some(tail(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(tail(s[1], s[2]));
    }
    None
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: cloud metadata lives here
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space 100.64/10
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240 // reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_told_from_the_internet() {
        for inside in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b:1::8.8.8.8",
            "::ffff:0:10.0.0.1",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::",
        ] {
            assert!(
                internal(inside.parse().unwrap()),
                "{inside} passed as public"
            );
        }
        for outside in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
        ] {
            assert!(!internal(outside.parse().unwrap()), "{outside} refused");
        }
    }

    #[tokio::test]
    async fn an_internal_address_is_refused_after_resolution_unless_the_operator_allows_it() {
        let none = Outbound::default();
        for url in [
            "http://127.0.0.1:9/mcp",
            "http://localhost:9/mcp",
            "http://[::1]:9/mcp",
            "http://0x7f000001:9/mcp",
            "http://2130706433:9/mcp",
            "http://169.254.169.254/latest/meta-data",
        ] {
            let url = url::Url::parse(url).unwrap();
            let e = none.resolve(&url).await.unwrap_err();
            assert!(e.contains("internal address"), "{url}: {e}");
        }
        let by_ip = Outbound::parse(&["127.0.0.1".into()]).unwrap();
        let url = url::Url::parse("http://127.0.0.1:9/mcp").unwrap();
        assert_eq!(
            by_ip.resolve(&url).await.unwrap(),
            vec!["127.0.0.1:9".parse::<SocketAddr>().unwrap()]
        );
        // The metadata address stays out when only loopback is allowed.
        let url = url::Url::parse("http://169.254.169.254/").unwrap();
        assert!(by_ip.resolve(&url).await.is_err());
        let by_range = Outbound::parse(&["169.254.0.0/16".into()]).unwrap();
        assert!(by_range.resolve(&url).await.is_ok());
        let by_host = Outbound::parse(&["LocalHost".into()]).unwrap();
        let url = url::Url::parse("http://localhost:9/").unwrap();
        assert!(by_host.resolve(&url).await.is_ok());
        assert!(Outbound::parse(&["not a host!".into()]).is_err());
    }
}
