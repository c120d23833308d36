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
//! configured with and the addresses the API server advertises, see
//! [`UrlPolicy::follow_api_server`]: the `discovery.k8s.io/v1` EndpointSlices of the Service
//! `default/kubernetes`, or, on an API server that does not serve that version (Kubernetes
//! 1.20), the core `v1` Endpoints of that Service). An allow list of networks re-allows any of these, and host
//! names on it are not checked at all; a deny list adds networks refused whatever the allow list
//! says, and the controller's own listening socket (its metrics port) is always refused.
//!
//! An IPv6 address that embeds an IPv4 address counts as both: it is accepted only if the
//! IPv4 address it embeds would be too ([`embedded_ipv4`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use brokkr_osb::client::AddressFilter;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};

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
    /// The addresses the API server advertises, as last read: refused unless allowed. Shared
    /// by every clone, so that the filters of clients already built follow a re-read.
    advertised: Arc<RwLock<Vec<IpAddr>>>,
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
            advertised: Arc::default(),
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

    /// Whether a connection to `address` is allowed: to the address itself, and to the IPv4
    /// address an IPv6 one embeds, if any.
    pub fn accepts(&self, address: SocketAddr) -> bool {
        let ip = address.ip().to_canonical();
        self.accepts_one(ip, address.port())
            && embedded_ipv4(ip)
                .iter()
                .all(|v4| self.accepts_one(IpAddr::V4(*v4), address.port()))
    }

    fn accepts_one(&self, ip: IpAddr, port: u16) -> bool {
        if self.always_denied.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        let advertised = self.advertised.read().expect("lock");
        let denied =
            |ip: &IpAddr| self.denied.iter().any(|n| n.contains(ip)) || advertised.contains(ip);
        let own = |socket: &SocketAddr| {
            socket.port() == port
                && (socket.ip().to_canonical() == ip
                    || socket.ip().is_unspecified() && (ip.is_loopback() || denied(&ip)))
        };
        if self.own_sockets.iter().any(own) {
            return false;
        }
        self.allowed.iter().any(|n| n.contains(&ip)) || !denied(&ip)
    }

    /// Replaces the addresses the API server advertises (they are refused unless allowed).
    pub fn set_api_server_addresses(&self, addresses: Vec<IpAddr>) {
        let addresses = addresses.into_iter().map(|a| a.to_canonical()).collect();
        *self.advertised.write().expect("lock") = addresses;
    }

    /// Reads the addresses the API server advertises and refuses them from now on: every
    /// address of the `discovery.k8s.io/v1` EndpointSlices labelled
    /// `kubernetes.io/service-name=kubernetes` in `default` (ready or not), or, where the API
    /// server does not serve that version (404: Kubernetes 1.20, which has only `v1beta1`), of
    /// the core `v1` Endpoints `default/kubernetes`, which every version writes. So a current
    /// API server is never asked for the deprecated Endpoints. None advertised (an API server
    /// without its endpoint reconciler) refuses none. Returns where the addresses came from.
    pub async fn read_api_server_addresses(
        &self,
        client: &Client,
    ) -> Result<AdvertisedBy, kube::Error> {
        let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default")
            .list(&ListParams::default().labels(API_SERVER_SLICES))
            .await;
        let (addresses, source): (Vec<String>, _) = match slices {
            Ok(slices) => (
                slices
                    .items
                    .into_iter()
                    .flat_map(|slice| slice.endpoints)
                    .flat_map(|endpoint| endpoint.addresses)
                    .collect(),
                AdvertisedBy::EndpointSlices,
            ),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let endpoints = Api::<Endpoints>::namespaced(client.clone(), "default")
                    .get_opt("kubernetes")
                    .await?;
                (
                    endpoints
                        .into_iter()
                        .flat_map(|e| e.subsets.into_iter().flatten())
                        .flat_map(|s| {
                            let ready = s.addresses.into_iter().flatten();
                            ready.chain(s.not_ready_addresses.into_iter().flatten())
                        })
                        .map(|a| a.ip)
                        .collect(),
                    AdvertisedBy::Endpoints,
                )
            }
            Err(e) => return Err(e),
        };
        // An EndpointSlice of address type FQDN holds names: not addresses to refuse.
        let addresses = addresses
            .iter()
            .filter_map(|a| a.parse::<IpAddr>().ok())
            .collect();
        self.set_api_server_addresses(addresses);
        Ok(source)
    }

    /// Reads the addresses the API server advertises now, then again every `every` (the
    /// controller: [`API_SERVER_REREAD`]) in the task returned, until it is aborted. A failed
    /// read (an install that may not read them, say) keeps the addresses read before, if any;
    /// the log says so once, until a read succeeds again.
    pub async fn follow_api_server(
        &self,
        client: Client,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let policy = self.clone();
        let mut failing = policy.reread(&client, false).await;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                failing = policy.reread(&client, failing).await;
            }
        })
    }

    /// One read of [`UrlPolicy::follow_api_server`]: whether it failed. The log says what
    /// was read when it differs from what was read before.
    async fn reread(&self, client: &Client, failing: bool) -> bool {
        let before = self.advertised.read().expect("lock").clone();
        match self.read_api_server_addresses(client).await {
            Ok(source) => {
                let now = self.advertised.read().expect("lock").clone();
                if failing || now != before {
                    tracing::info!(
                        from = ?source,
                        addresses = ?now,
                        "the addresses the API server advertises, refused to namespaced brokers"
                    );
                }
                false
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        error = %e,
                        "cannot read the addresses the API server advertises (the \
                         EndpointSlices of the Service default/kubernetes): they are not refused \
                         to namespaced brokers (only those read before, and its address in the \
                         controller's configuration); grant `list` on them, or refuse them with \
                         --broker-url-deny"
                    );
                }
                true
            }
        }
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

/// How often the API server's advertised addresses are read again.
pub const API_SERVER_REREAD: Duration = Duration::from_secs(30);

/// The label selector of the EndpointSlices the API server writes for itself.
pub const API_SERVER_SLICES: &str = "kubernetes.io/service-name=kubernetes";

/// Where the API server's advertised addresses were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdvertisedBy {
    /// `discovery.k8s.io/v1` EndpointSlices (Kubernetes 1.21 and later).
    EndpointSlices,
    /// The core `v1` Endpoints `default/kubernetes`, on an API server that does not serve
    /// EndpointSlices at `discovery.k8s.io/v1`.
    Endpoints,
}

/// The IPv4 addresses an IPv6 address carries, by the standard ways of embedding one, which
/// reach (or may be translated to) that IPv4 address:
///
/// - IPv4-compatible, `::a.b.c.d` (`::/96`, but `::` and `::1`);
/// - NAT64's well-known prefix `64:ff9b::/96` (the last 32 bits), and its local-use prefix
///   `64:ff9b:1::/48` at every place RFC 6052 allows for a prefix within it (/48, /56, /64, /96);
/// - 6to4, `2002::/16` (bits 16 to 48);
/// - Teredo, `2001::/32`: its client's address (the last 32 bits, inverted).
///
/// IPv4-mapped addresses (`::ffff:a.b.c.d`) are made IPv4 ones before this is asked.
pub fn embedded_ipv4(ip: IpAddr) -> Vec<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else {
        return Vec::new();
    };
    let o = v6.octets();
    let at = |i: [usize; 4]| Ipv4Addr::new(o[i[0]], o[i[1]], o[i[2]], o[i[3]]);
    let s = v6.segments();
    if s[..6] == [0; 6] {
        return if v6 == Ipv6Addr::UNSPECIFIED || v6 == Ipv6Addr::LOCALHOST {
            Vec::new()
        } else {
            vec![at([12, 13, 14, 15])]
        };
    }
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => vec![at([12, 13, 14, 15])],
        [0x64, 0xff9b, 1, ..] => vec![
            at([6, 7, 9, 10]),
            at([7, 9, 10, 11]),
            at([9, 10, 11, 12]),
            at([12, 13, 14, 15]),
        ],
        [0x2002, ..] => vec![at([2, 3, 4, 5])],
        [0x2001, 0, ..] => vec![Ipv4Addr::from(!u32::from(at([12, 13, 14, 15])))],
        _ => Vec::new(),
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

    #[test]
    fn an_ipv6_address_counts_as_the_ipv4_address_it_embeds() {
        let mut policy = UrlPolicy::default();
        policy.deny("10.0.0.0/8").unwrap();
        for refused in [
            // IPv4-compatible.
            "[::127.0.0.1]:80",
            "[::169.254.169.254]:80",
            "[::10.1.2.3]:80",
            // NAT64, the well-known prefix and the local-use one (here as a /96 and a /48).
            "[64:ff9b::7f00:1]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "[64:ff9b:1::7f00:1]:80",
            "[64:ff9b:1:7f00:0:100::]:80",
            // 6to4.
            "[2002:7f00:1::]:80",
            "[2002:a9fe:a9fe::1]:80",
            "[2002:a01:203:1::1]:80",
            // Teredo: the client's address inverted (127.0.0.1, 169.254.169.254).
            "[2001:0:4136:e378:8000:63bf:80ff:fffe]:80",
            "[2001:0:4136:e378::5601:5601]:80",
        ] {
            assert!(!policy.accepts(at(refused)), "{refused}");
        }
        for accepted in [
            "[::203.0.113.7]:80",
            "[64:ff9b::cb00:7107]:80",
            "[64:ff9b:1:cbcb:cb:cbcb:cbcb:cbcb]:80",
            "[2002:cb00:7107::1]:80",
            "[2001:0:4136:e378:8000:63bf:34ff:8ef8]:80",
            // Not an embedding: documentation addresses beside Teredo, other 2001::/16.
            "[2001:db8::7f00:1]:80",
            "[2001:4860::7f00:1]:80",
        ] {
            assert!(policy.accepts(at(accepted)), "{accepted}");
        }
        // What the allow list re-allows as IPv4 it re-allows embedded; the deny list wins.
        policy
            .allow("127.0.0.0/8")
            .unwrap()
            .deny("169.254.0.0/16")
            .unwrap();
        assert!(policy.accepts(at("[64:ff9b::7f00:1]:80")));
        assert!(!policy.accepts(at("[2002:a9fe:a9fe::1]:80")));
        // ::1 and :: are IPv6's own loopback and unspecified addresses, not IPv4-compatible.
        let mut policy = UrlPolicy::default();
        policy.allow("::1").unwrap();
        assert!(policy.accepts(at("[::1]:80")));
        assert!(!policy.accepts(at("[::]:80")));
    }

    #[test]
    fn the_api_servers_advertised_addresses_are_refused_as_last_read() {
        let policy = UrlPolicy::default();
        let filter = policy.filter_for("http://192.0.2.2:6443").unwrap();
        assert!(filter.accepts(at("192.0.2.2:6443")));
        policy.set_api_server_addresses(vec!["192.0.2.2".parse().unwrap()]);
        // Filters made before follow.
        assert!(!filter.accepts(at("192.0.2.2:6443")));
        assert!(!policy.accepts(at("[::ffff:192.0.2.2]:443")));
        assert!(!policy.accepts(at("[64:ff9b::c000:202]:443")));
        policy.set_api_server_addresses(vec!["192.0.2.3".parse().unwrap()]);
        assert!(filter.accepts(at("192.0.2.2:6443")));
        assert!(!filter.accepts(at("192.0.2.3:6443")));
        // The allow list re-allows them, as it does the controller's other addresses.
        let mut policy = policy.clone();
        policy.allow("192.0.2.0/24").unwrap();
        assert!(policy.accepts(at("192.0.2.3:6443")));
    }
}
