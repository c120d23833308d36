//! A typed async OSB client: what a platform sends to a broker, and the broker's answers.
//!
//! ```no_run
//! # async fn example() -> Result<(), brokkr_osb::client::Error> {
//! use brokkr_osb::client::{Client, Poll, WaitOptions};
//! use brokkr_osb::messages::ProvisionRequest;
//!
//! let client = Client::builder("https://broker.example.com")
//!     .basic_auth("platform", "secret")
//!     .build()?;
//! let catalog = client.catalog().await?.body;
//! let request = ProvisionRequest {
//!     service_id: catalog.services[0].id.clone(),
//!     plan_id: catalog.services[0].plans[0].id.clone(),
//!     // Required by OSB 2.17 (deprecated in favour of `context`).
//!     organization_guid: Some("my-org".into()),
//!     space_guid: Some("my-space".into()),
//!     ..ProvisionRequest::default()
//! };
//! let answer = client.provision("i-1", &request, true).await?;
//! if answer.is_async() {
//!     let poll = Poll::instance("i-1").operation(answer.body.operation.clone());
//!     let last = client.wait(&poll, &WaitOptions::default(), |_| {}).await?;
//!     println!("{:?}", last.state);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every call returns a [`Response`] with the HTTP status (`200` vs `201` vs `202` matters to a
//! platform), the parsed body and `Retry-After`; statuses an endpoint does not succeed with become
//! [`Error::Broker`], with the broker's `error` code and `description`. Each request carries
//! `X-Broker-API-Version: 2.17`, a fresh `X-Broker-API-Request-Identity` (unless one is set with
//! [`Client::with_request_identity`]) and, when set, `X-Broker-API-Originating-Identity`.
//!
//! TLS uses rustls with ring: with the system's roots, or only the roots of a given CA bundle.
//! Building a client installs ring as rustls' process-wide default provider if none is installed.
//!
//! What a broker sends is bounded: every answer's body is read as a stream and the read stops
//! at the [`BodyLimits`] of its kind (a catalog, another answer, an error answer), so a broker
//! can never make the client hold more than that; an honest `Content-Length` above the limit
//! fails before anything is read. Texts for people are cut at [`MAX_TEXT`] characters, and an
//! `operation` or `dashboard_url` a platform could not keep or send back is refused as an
//! answer that is not valid OSB (see `answer.rs`: [`MAX_OPERATION`], [`MAX_DASHBOARD_URL`]). Set [`ClientBuilder::timeout`] to bound the time as well (it
//! covers the body: a broker trickling bytes is cut off at it). With
//! [`ClientBuilder::connect_only_to`] the client connects only to addresses a filter accepts:
//! it resolves the broker's host itself, checks every address, and connects to the checked ones.
//!
//! Building a client is in `builder`; one exchange with the broker (the headers, the bounded
//! read, the answer's status and body) in `exchange`; the endpoints' typed calls in
//! `endpoints`; what a call is about (paths, query parameters, the operation polled) in
//! `request_target`; polling until an operation ends in `wait`. What an answer may hold is
//! checked in `answer`, the errors are in `error`, the address filter in `address`.

mod address;
mod answer;
mod builder;
mod endpoints;
mod error;
mod exchange;
mod request_target;
#[cfg(test)]
mod tests;
mod wait;

pub use reqwest::{Method, StatusCode};

pub use address::AddressFilter;
pub use answer::{MAX_DASHBOARD_URL, MAX_OPERATION, MAX_TEXT, clipped};
pub use builder::{Auth, ClientBuilder, install_crypto_provider};
pub use error::{BrokerError, Error};
pub use exchange::{BodyLimits, Client, Response};
pub use request_target::{PlanRef, Poll};
pub use wait::WaitOptions;
