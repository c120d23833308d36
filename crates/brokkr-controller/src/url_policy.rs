//! Which addresses a namespaced ServiceBroker may point the controller at.
//!
//! A tenant writes a ServiceBroker's URL, and the controller connects to it from inside the
//! cluster: without a policy, a tenant could make it call the API server, a cloud's metadata
//! endpoint or the controller's own ports, and learn from the broker's status what answers
//! there. [`UrlPolicy`] decides before any connection: the broker's host is resolved by the
//! client, every address it resolves to is checked, and the connection goes only to a checked
//! address (see [`brokkr_osb::client::ClientBuilder::connect_only_to`]).
//!
//! Refused by default: loopback (`127.0.0.0/8`, `::1`), link-local (`169.254.0.0/16` with the
//! cloud metadata address `169.254.169.254`, `fe80::/10`), unspecified and "this network"
//! (`0.0.0.0/8`, `::`), multicast and broadcast, AWS's IPv6 metadata address `fd00:ec2::254`,
//! and the controller's own addresses (its pod's IPs, the API server's address it was
//! configured with). An allow list of networks re-allows any of these, and host names on it are
//! not checked at all; a deny list adds networks refused whatever the allow list says, and the
//! controller's own listening socket (its metrics port) is always refused.

use std::net::{IpAddr, SocketAddr};

use brokkr_osb::client::AddressFilter;
use ipnet::IpNet;

/// The networks refused by default.
const DEFAULT_DENIED: &[&str] = &[
    "127.0.0.0/8",
    "::1/128",
    "169.254.0.0/16",
    "fe80::/10",
    "0.0.0.0/8",
    "::/128",
    "224.0.0.0/4",
    "ff00::/8",
    "255.255.255.255/32",
    "fd00:ec2::254/128",
];

/// The policy for namespaced brokers' URLs.
#[derive(Debug, Clone)]
pub struct UrlPolicy {
    /// Refused unless allowed: the defaults and the controller's own addresses.
    denied: Vec<IpNet>,
    /// Re-allowed networks.
    allowed: Vec<IpNet>,
    /// Host names whose addresses are not checked.
    allowed_hosts: Vec<String>,
    /// Refused whatever the allow list says.
    always_denied: Vec<IpNet>,
    /// The controller's own listening sockets: always refused.
    own_sockets: Vec<SocketAddr>,
}

impl Default for UrlPolicy {
    /// The default networks refused, nothing allowed.
    fn default() -> Self {
        Self {
            denied: DEFAULT_DENIED
                .iter()
                .map(|n| n.parse().expect("a valid network"))
                .collect(),
            allowed: Vec::new(),
            allowed_hosts: Vec::new(),
            always_denied: Vec::new(),
            own_sockets: Vec::new(),
        }
    }
}

/// An entry of the allow or deny list that is not a network, an address or a host name.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a network (10.0.0.0/8, fd00::/8), an IP address or a host name")]
pub struct InvalidEntry(String);

fn network(entry: &str) -> Option<IpNet> {
    let entry = entry.trim();
    entry
        .parse::<IpNet>()
        .ok()
        .or_else(|| entry.parse::<IpAddr>().ok().map(IpNet::from))
}

impl UrlPolicy {
    /// Allows `entry`: a network (`10.0.0.0/8`), an address, or a host name (exactly that
    /// name in a broker URL, whatever it resolves to).
    pub fn allow(&mut self, entry: &str) -> Result<&mut Self, InvalidEntry> {
        if let Some(net) = network(entry) {
            self.allowed.push(net);
        } else {
            let host = entry.trim().trim_end_matches('.').to_ascii_lowercase();
            let valid = !host.is_empty()
                && host.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                });
            if !valid {
                return Err(InvalidEntry(entry.to_owned()));
            }
            self.allowed_hosts.push(host);
        }
        Ok(self)
    }

    /// Refuses the network or address `entry`, whatever the allow list says.
    pub fn deny(&mut self, entry: &str) -> Result<&mut Self, InvalidEntry> {
        let net = network(entry).ok_or_else(|| InvalidEntry(entry.to_owned()))?;
        self.always_denied.push(net);
        Ok(self)
    }

    /// Refuses one of the controller's own addresses (unless the allow list re-allows it).
    pub fn own_address(&mut self, address: IpAddr) -> &mut Self {
        self.denied.push(IpNet::from(address.to_canonical()));
        self
    }

    /// Refuses the controller's own listening socket. One on an unspecified address
    /// (`0.0.0.0:8081`) refuses its port on loopback and on the controller's own addresses.
    pub fn own_socket(&mut self, socket: SocketAddr) -> &mut Self {
        self.own_sockets.push(socket);
        self
    }

    /// Whether a connection to `address` is allowed.
    pub fn accepts(&self, address: SocketAddr) -> bool {
        let ip = address.ip().to_canonical();
        if self.always_denied.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        let own = |socket: &SocketAddr| {
            socket.port() == address.port()
                && (socket.ip().to_canonical() == ip
                    || socket.ip().is_unspecified()
                        && (ip.is_loopback() || self.denied.iter().any(|n| n.contains(&ip))))
        };
        if self.own_sockets.iter().any(own) {
            return false;
        }
        self.allowed.iter().any(|n| n.contains(&ip)) || !self.denied.iter().any(|n| n.contains(&ip))
    }

    /// The address filter for a broker at `url`, or `None` when its host is on the allow list.
    pub fn filter_for(&self, url: &str) -> Option<AddressFilter> {
        let host = url::Url::parse(url).ok().and_then(|u| {
            u.host_str()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        });
        if host.is_some_and(|h| self.allowed_hosts.contains(&h)) {
            return None;
        }
        let policy = self.clone();
        Some(AddressFilter::new(move |address| policy.accepts(address)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_link_local_and_unspecified_addresses_are_refused_by_default() {
        let policy = UrlPolicy::default();
        for refused in [
            "127.0.0.1:8080",
            "127.1.2.3:80",
            "[::1]:80",
            "[::ffff:127.0.0.1]:80",
            "169.254.169.254:80",
            "[fe80::1]:443",
            "0.0.0.0:8080",
            "[::]:80",
            "[fd00:ec2::254]:80",
            "224.0.0.1:80",
        ] {
            assert!(!policy.accepts(at(refused)), "{refused}");
        }
        for accepted in ["10.96.0.10:8080", "203.0.113.7:443", "[2001:db8::1]:443"] {
            assert!(policy.accepts(at(accepted)), "{accepted}");
        }
    }

    #[test]
    fn the_controllers_own_addresses_are_refused() {
        let mut policy = UrlPolicy::default();
        policy
            .own_address("10.244.1.7".parse().unwrap())
            .own_socket(at("0.0.0.0:8081"));
        assert!(!policy.accepts(at("10.244.1.7:9999")));
        assert!(policy.accepts(at("10.244.1.8:8081")));
        // Re-allowing loopback (as tests do) never re-allows the metrics port.
        policy.allow("127.0.0.0/8").unwrap();
        assert!(policy.accepts(at("127.0.0.1:8080")));
        assert!(!policy.accepts(at("127.0.0.1:8081")));
    }

    #[test]
    fn the_allow_list_re_allows_and_the_deny_list_refuses_whatever_it_says() {
        let mut policy = UrlPolicy::default();
        policy
            .allow("127.0.0.1")
            .unwrap()
            .allow("fe80::/10")
            .unwrap();
        assert!(policy.accepts(at("127.0.0.1:8080")));
        assert!(!policy.accepts(at("127.0.0.2:8080")));
        assert!(policy.accepts(at("[fe80::1]:80")));
        policy
            .deny("10.0.0.0/8")
            .unwrap()
            .deny("127.0.0.1")
            .unwrap();
        assert!(!policy.accepts(at("10.1.2.3:80")));
        assert!(!policy.accepts(at("127.0.0.1:8080")));
        assert!(policy.deny("internal.example").is_err());
        assert!(policy.allow("not a host").is_err());
    }

    #[test]
    fn an_allowed_host_name_is_not_checked_and_others_are() {
        let mut policy = UrlPolicy::default();
        policy.allow("Broker.Internal.").unwrap();
        assert!(policy.filter_for("http://broker.internal:8080").is_none());
        let filter = policy.filter_for("http://localhost:8080").unwrap();
        assert!(!filter.accepts(at("127.0.0.1:8080")));
    }
}
