//! One exchange with a broker: the [`Client`], the headers every request carries, and its answer
//! read within the [`BodyLimits`] of its kind, its status checked and its body parsed into a
//! [`Response`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::address::AddressFilter;
use super::answer::{Answer, MAX_TEXT, clipped};
use super::error::{self, BrokerError, Error};
use crate::headers::{self, OriginatingIdentity};

/// The most bytes the client reads of each kind of answer's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// `GET /v2/catalog` (default 8 MiB).
    pub catalog: u64,
    /// Every other successful answer: operations, bindings with their credentials, fetched
    /// instances and bindings, `last_operation` (default 1 MiB).
    pub answer: u64,
    /// An error answer (only its `error` and `description` are used; default 64 KiB). A longer
    /// one is read as an error of its status with neither.
    pub error: u64,
}

impl BodyLimits {
    /// The default catalog limit: 8 MiB.
    pub const DEFAULT_CATALOG: u64 = 8 << 20;
    /// The default limit of other successful answers: 1 MiB.
    pub const DEFAULT_ANSWER: u64 = 1 << 20;
    /// The default limit of error answers: 64 KiB.
    pub const DEFAULT_ERROR: u64 = 64 << 10;
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            catalog: Self::DEFAULT_CATALOG,
            answer: Self::DEFAULT_ANSWER,
            error: Self::DEFAULT_ERROR,
        }
    }
}

/// Which kind of answer a call expects, for its [`BodyLimits`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Catalog,
    Answer,
}

/// A client of one broker. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub struct Client {
    pub(super) inner: Arc<Inner>,
    pub(super) originating_identity: Option<HeaderValue>,
    pub(super) request_identity: Option<HeaderValue>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) http: reqwest::Client,
    pub(super) base: reqwest::Url,
    pub(super) authorization: Option<HeaderValue>,
    pub(super) limits: BodyLimits,
    /// The URL's IP address, never resolved, with the filter it is checked with at every call.
    pub(super) checked_literal: Option<(AddressFilter, SocketAddr)>,
}

/// A successful answer: its status, its parsed body and the headers a platform acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Response<T> {
    /// The HTTP status, e.g. 201 (created) vs 200 (already there) vs 202 (accepted, poll).
    pub status: StatusCode,
    /// The parsed body.
    pub body: T,
    /// `Retry-After`: how long to wait before polling.
    pub retry_after: Option<Duration>,
    /// `X-Broker-API-Request-Identity` as the broker echoed it.
    pub request_identity: Option<String>,
}

impl<T> Response<T> {
    /// Whether the broker accepted the request as an asynchronous operation (202) to poll.
    pub fn is_async(&self) -> bool {
        self.status == StatusCode::ACCEPTED
    }

    /// Whether the broker said the resource is gone (410), which ends a delete.
    pub fn is_gone(&self) -> bool {
        self.status == StatusCode::GONE
    }
}

impl Client {
    /// This client, sending `identity` as the platform user behind its requests.
    pub fn with_originating_identity(&self, identity: &OriginatingIdentity) -> Result<Self, Error> {
        Ok(Self {
            originating_identity: Some(header_value(&identity.to_header())?),
            ..self.clone()
        })
    }

    /// This client, sending `id` as the request identity instead of a fresh one per request.
    pub fn with_request_identity(&self, id: &str) -> Result<Self, Error> {
        Ok(Self {
            request_identity: Some(header_value(id)?),
            ..self.clone()
        })
    }

    /// The broker's base URL.
    pub fn url(&self) -> &str {
        self.inner.base.as_str()
    }

    /// A request to `path_and_query` with the client's authentication and OSB headers, for what
    /// the typed calls do not cover (e.g. testing a broker with deliberately wrong bodies).
    pub fn request(&self, method: Method, path_and_query: &str) -> reqwest::RequestBuilder {
        let url = format!(
            "{}{path_and_query}",
            self.inner.base.as_str().trim_end_matches('/')
        );
        self.inner.http.request(method, url).headers(self.headers())
    }

    /// The headers every request carries.
    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            headers::API_VERSION,
            HeaderValue::from_static(LATEST_VERSION),
        );
        if let Some(auth) = &self.inner.authorization {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        if let Some(id) = &self.originating_identity {
            headers.insert(headers::ORIGINATING_IDENTITY, id.clone());
        }
        let request_id = self.request_identity.clone().unwrap_or_else(|| {
            HeaderValue::try_from(uuid::Uuid::new_v4().to_string()).expect("a UUID is a header")
        });
        headers.insert(headers::REQUEST_IDENTITY, request_id);
        headers
    }

    pub(super) async fn call<B: Serialize + ?Sized, T: DeserializeOwned + Answer>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
        ok: &[StatusCode],
        kind: Kind,
    ) -> Result<Response<T>, Error> {
        let mut url = self.inner.base.clone();
        url.set_path(&format!(
            "{}{path}",
            self.inner.base.path().trim_end_matches('/')
        ));
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let shown = format!("{}{}", self.inner.base.as_str().trim_end_matches('/'), path);
        if let Some((filter, address)) = &self.inner.checked_literal
            && !filter.accepts(*address)
        {
            return Err(Error::AddressRefused {
                url: shown,
                address: *address,
            });
        }
        let mut request = self.inner.http.request(method, url).headers(self.headers());
        if let Some(body) = body {
            request = request.json(body);
        }
        let transport = |source| error::transport(shown.clone(), source);
        let answer = request.send().await.map_err(transport)?;
        let status = answer.status();
        let retry_after = answer
            .headers()
            .get(RETRY_AFTER)
            .and_then(parse_retry_after);
        let request_identity = answer
            .headers()
            .get(headers::REQUEST_IDENTITY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if !ok.contains(&status) {
            // An error answer too long to read is still an error of its status.
            let bytes = read_at_most(answer, self.inner.limits.error)
                .await
                .map_err(transport)?
                .unwrap_or_default();
            return Err(BrokerError::new(status, &bytes, retry_after).into());
        }
        let (limit, what) = match kind {
            Kind::Catalog => (self.inner.limits.catalog, "a catalog"),
            Kind::Answer => (self.inner.limits.answer, "an answer"),
        };
        let declared = answer.content_length();
        let Some(bytes) = read_at_most(answer, limit).await.map_err(transport)? else {
            // Read as a body that is not a valid OSB answer, so that a platform treats it as
            // one (orphan mitigation after a 201 or 202).
            return Err(Error::InvalidResponse {
                status,
                message: format!(
                    "the body is larger than the {limit} bytes this client reads of {what} from \
                     the broker at {shown}{}",
                    declared
                        .filter(|&n| n > limit)
                        .map(|n| format!(" (Content-Length: {n})"))
                        .unwrap_or_default()
                ),
            });
        };
        // A 410 on delete and some brokers' synchronous answers carry no body: read it as `{}`.
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        // serde names an unexpected variant (`unknown variant `…``) as it was sent: cut.
        let mut body: T = serde_json::from_slice(bytes).map_err(|e| Error::InvalidResponse {
            status,
            message: clipped(&error::without_values(&e.to_string()), MAX_TEXT).into_owned(),
        })?;
        body.check()
            .map_err(|message| Error::InvalidResponse { status, message })?;
        Ok(Response {
            status,
            body,
            retry_after,
            request_identity,
        })
    }
}

pub(super) fn header_value(text: &str) -> Result<HeaderValue, Error> {
    HeaderValue::try_from(text)
        .map_err(|_| Error::Config(format!("{text:?} is not a valid header value")))
}

/// The body of `answer` if it has at most `limit` bytes, else `None`, having read at most
/// `limit` bytes of it: a `Content-Length` above the limit ends it before anything is read, and
/// the read stops as soon as the body passes the limit (the connection is then closed).
async fn read_at_most(
    mut answer: reqwest::Response,
    limit: u64,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if answer.content_length().is_some_and(|n| n > limit) {
        return Ok(None);
    }
    let expected = answer.content_length().unwrap_or(0).min(limit);
    let mut body = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    while let Some(chunk) = answer.chunk().await? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// The `X-Broker-API-Version` this client speaks.
const LATEST_VERSION: &str = "2.17";

/// `Retry-After` as seconds or as an HTTP date.
fn parse_retry_after(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date() {
        let header = |s: &str| HeaderValue::try_from(s).unwrap();
        assert_eq!(
            parse_retry_after(&header("7")),
            Some(Duration::from_secs(7))
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(90));
        let d = parse_retry_after(&header(&later)).unwrap();
        assert!(
            d > Duration::from_secs(85) && d <= Duration::from_secs(90),
            "{d:?}"
        );
        assert_eq!(parse_retry_after(&header("soon")), None);
    }
}
