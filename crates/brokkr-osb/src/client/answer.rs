//! What the client keeps of a broker's answer beyond its shape. Texts meant for people (a
//! `last_operation` description, an error answer's `error` and `description`, what is wrong
//! with a body that could not be read) are cut at [`MAX_TEXT`] characters, so that no broker
//! can make a platform write a whole body into a log line or a resource's status. The values a
//! platform keeps and sends back are refused when a platform could not: an `operation` longer
//! than [`MAX_OPERATION`] bytes (it goes into every poll's URL) and a `dashboard_url` longer than
//! [`MAX_DASHBOARD_URL`] bytes or that is not an absolute `http(s)` URL. A refused answer is one
//! that is not valid OSB ([`Error::InvalidResponse`](super::Error::InvalidResponse)): after a
//! 201 or 202 of a provision or bind, a platform mitigates the orphan.

use std::borrow::Cow;

use crate::catalog::Catalog;
use crate::messages::{
    AsyncResponse, BindResponse, BindingResource, InstanceOperationResponse, InstanceResource,
    LastOperation,
};

/// The most characters kept of a text a broker sends for people.
pub const MAX_TEXT: usize = 1024;
/// The most bytes of an `operation` a broker may send.
pub const MAX_OPERATION: usize = 1024;
/// The most bytes of a `dashboard_url` a broker may send.
pub const MAX_DASHBOARD_URL: usize = 2048;

/// `text`, cut after `max` characters and then marked with `…`.
pub fn clipped(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((at, _)) => Cow::Owned(format!("{}…", &text[..at])),
        None => Cow::Borrowed(text),
    }
}

/// An answer's body as the client hands it on.
pub(super) trait Answer {
    /// Cuts the texts for people, and says what is wrong (never the value) with a value a
    /// platform could not keep or send back.
    fn check(&mut self) -> Result<(), String> {
        Ok(())
    }
}

impl Answer for Catalog {}

impl Answer for BindingResource {}

impl Answer for LastOperation {
    fn check(&mut self) -> Result<(), String> {
        if let Some(description) = &mut self.description
            && let Cow::Owned(cut) = clipped(description, MAX_TEXT)
        {
            *description = cut;
        }
        Ok(())
    }
}

impl Answer for InstanceOperationResponse {
    fn check(&mut self) -> Result<(), String> {
        operation(self.operation.as_deref())?;
        dashboard_url(&mut self.dashboard_url)
    }
}

impl Answer for InstanceResource {
    fn check(&mut self) -> Result<(), String> {
        dashboard_url(&mut self.dashboard_url)
    }
}

impl Answer for AsyncResponse {
    fn check(&mut self) -> Result<(), String> {
        operation(self.operation.as_deref())
    }
}

impl Answer for BindResponse {
    fn check(&mut self) -> Result<(), String> {
        operation(self.operation.as_deref())
    }
}

fn operation(operation: Option<&str>) -> Result<(), String> {
    match operation {
        Some(op) if op.len() > MAX_OPERATION => Err(format!(
            "the operation is {} bytes long, more than the {MAX_OPERATION} a platform keeps",
            op.len()
        )),
        _ => Ok(()),
    }
}

/// Checks a `dashboard_url`; an empty one counts as absent.
fn dashboard_url(url: &mut Option<String>) -> Result<(), String> {
    let Some(text) = url.as_deref() else {
        return Ok(());
    };
    if text.is_empty() {
        *url = None;
        return Ok(());
    }
    if text.len() > MAX_DASHBOARD_URL {
        return Err(format!(
            "the dashboard_url is {} bytes long, more than the {MAX_DASHBOARD_URL} a platform keeps",
            text.len()
        ));
    }
    match reqwest::Url::parse(text) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(()),
        _ => Err("the dashboard_url is not an absolute http or https URL".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::OperationState;

    #[test]
    fn texts_are_cut_on_a_character_boundary_with_a_marker() {
        assert_eq!(clipped("short", 10), "short");
        assert_eq!(clipped("ééééé", 3), "ééé…");
        let mut last = LastOperation {
            state: OperationState::Failed,
            description: Some("€".repeat(1_000_000)),
            instance_usable: None,
            update_repeatable: None,
        };
        last.check().unwrap();
        let description = last.description.unwrap();
        assert_eq!(description.chars().count(), MAX_TEXT + 1);
        assert!(description.ends_with("€…"), "{description}");
    }

    #[test]
    fn an_operation_a_platform_could_not_send_back_is_refused() {
        let mut ok = AsyncResponse {
            operation: Some("o".repeat(MAX_OPERATION)),
        };
        ok.check().unwrap();
        let mut long = BindResponse {
            operation: Some("o".repeat(500_000)),
            ..BindResponse::default()
        };
        let message = long.check().unwrap_err();
        assert!(message.contains("500000 bytes"), "{message}");
        assert!(!message.contains("ooo"), "{message}");
    }

    #[test]
    fn a_dashboard_url_must_be_a_short_absolute_http_url() {
        let answer = |url: &str| InstanceOperationResponse {
            dashboard_url: Some(url.to_owned()),
            ..InstanceOperationResponse::default()
        };
        for good in ["https://dash.example.com/i/1?x=y", "http://10.0.0.1:8080/"] {
            answer(good).check().unwrap();
        }
        let mut empty = answer("");
        empty.check().unwrap();
        assert_eq!(empty.dashboard_url, None);
        let long = format!("https://dash.example.com/{}", "a".repeat(MAX_DASHBOARD_URL));
        for bad in [
            "/relative/path",
            "javascript:alert(1)",
            "ftp://files.example.com/",
            "dash.example.com",
            "http://",
            long.as_str(),
        ] {
            let message = answer(bad).check().unwrap_err();
            assert!(message.contains("dashboard_url"), "{bad}: {message}");
            let mut fetched = InstanceResource {
                dashboard_url: Some(bad.to_owned()),
                ..InstanceResource::default()
            };
            assert!(fetched.check().is_err(), "{bad}");
        }
    }
}
