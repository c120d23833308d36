//! Polling `last_operation` until an asynchronous operation ends.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use super::error::Error;
use super::exchange::Client;
use super::request_target::Poll;
use crate::catalog::Plan;
use crate::messages::{LastOperation, OperationState};

/// How often and how long to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitOptions {
    /// The first pause between polls.
    pub interval: Duration,
    /// The longest pause: each pause is 1.5 times the previous one, up to this.
    pub max_interval: Duration,
    /// When to give up (the plan's `maximum_polling_duration`); `None` polls until the end.
    pub max_duration: Option<Duration>,
}

impl Default for WaitOptions {
    /// From 250 ms to 15 s between polls, with no time limit.
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            max_interval: Duration::from_secs(15),
            max_duration: None,
        }
    }
}

impl WaitOptions {
    /// These options, stopping at `plan`'s `maximum_polling_duration` if it has one.
    #[must_use]
    pub fn for_plan(mut self, plan: &Plan) -> Self {
        if let Some(seconds) = plan.maximum_polling_duration {
            self.max_duration = Some(Duration::from_secs(seconds));
        }
        self
    }
}

impl Client {
    /// Polls `poll`'s last_operation until the operation succeeds or fails, and returns its last
    /// state (a failed operation is `Ok` with [`OperationState::Failed`]). `on_poll` sees every
    /// state the broker reports. Between polls it waits the broker's `Retry-After` if it sent one,
    /// else a pause that grows from `options.interval` to `options.max_interval`. With a deleting
    /// poll, 410 Gone ends the wait as `succeeded`. Past `options.max_duration` it stops with
    /// [`Error::PollingTimedOut`]. A poll that fails for a reason that may pass (the broker
    /// unreachable or not answering in time, a 5xx or 429 answer) is retried with the same
    /// pauses, as platforms keep polling; past the deadline that failure is returned (with no
    /// `max_duration`, it is retried until the broker answers). Any other error of a poll ends
    /// the wait with that error.
    pub async fn wait(
        &self,
        poll: &Poll,
        options: &WaitOptions,
        mut on_poll: impl FnMut(&LastOperation),
    ) -> Result<LastOperation, Error> {
        let started = Instant::now();
        let deadline = options.max_duration.map(|d| started + d);
        let mut pause = options.interval;
        loop {
            let answer = match self.last_operation(poll).await {
                Ok(answer) => answer,
                Err(Error::Broker(e)) if poll.deleting && e.status == StatusCode::GONE => {
                    let gone = LastOperation {
                        state: OperationState::Succeeded,
                        description: e.description,
                        instance_usable: None,
                        update_repeatable: None,
                    };
                    on_poll(&gone);
                    return Ok(gone);
                }
                Err(e) if e.is_transient() => {
                    let retry_after = match &e {
                        Error::Broker(broker) => broker.retry_after,
                        _ => None,
                    };
                    match next_pause(deadline, retry_after, &mut pause, options) {
                        Some(sleep) => {
                            tokio::time::sleep(sleep).await;
                            continue;
                        }
                        None => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            on_poll(&answer.body);
            if answer.body.state != OperationState::InProgress {
                return Ok(answer.body);
            }
            match next_pause(deadline, answer.retry_after, &mut pause, options) {
                Some(sleep) => tokio::time::sleep(sleep).await,
                None => {
                    return Err(Error::PollingTimedOut {
                        after: started.elapsed(),
                        last: Some(answer.body),
                    });
                }
            }
        }
    }
}

/// The pause before the next poll: the broker's `Retry-After`, else `pause` (which then grows),
/// cut at the deadline; `None` once the deadline has passed.
fn next_pause(
    deadline: Option<Instant>,
    retry_after: Option<Duration>,
    pause: &mut Duration,
    options: &WaitOptions,
) -> Option<Duration> {
    let sleep = retry_after.unwrap_or(*pause);
    *pause = options.max_interval.min(pause.mul_f64(1.5));
    match deadline {
        None => Some(sleep),
        Some(deadline) => {
            let now = Instant::now();
            (now < deadline).then(|| sleep.min(deadline - now))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::http::StatusCode as Status;
    use axum::routing::get;

    use super::*;

    /// A broker whose last_operation answers `failures` times 503, then `succeeded`; returns
    /// its client and the count of polls.
    async fn flaky_broker(failures: usize) -> (Client, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        let app = Router::new().route(
            "/v2/service_instances/i1/last_operation",
            get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < failures {
                        (
                            Status::SERVICE_UNAVAILABLE,
                            r#"{"description":"restarting"}"#,
                        )
                    } else {
                        (Status::OK, r#"{"state":"succeeded"}"#)
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (Client::builder(url).build().unwrap(), polls)
    }

    fn quick(max_duration: Duration) -> WaitOptions {
        WaitOptions {
            interval: Duration::from_millis(10),
            max_interval: Duration::from_millis(20),
            max_duration: Some(max_duration),
        }
    }

    #[tokio::test]
    async fn a_failed_poll_is_retried_until_the_broker_answers() {
        let (client, polls) = flaky_broker(1).await;
        let last = client
            .wait(
                &Poll::instance("i1"),
                &quick(Duration::from_secs(10)),
                |_| {},
            )
            .await
            .expect("the wait outlives one 503");
        assert_eq!(last.state, OperationState::Succeeded);
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn failed_polls_end_the_wait_at_its_deadline_with_the_failure() {
        let (client, polls) = flaky_broker(usize::MAX).await;
        let err = client
            .wait(
                &Poll::instance("i1"),
                &quick(Duration::from_millis(200)),
                |_| {},
            )
            .await
            .expect_err("the broker never recovers");
        assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE), "{err}");
        assert!(
            polls.load(Ordering::SeqCst) > 2,
            "polled until the deadline"
        );
    }

    #[tokio::test]
    async fn a_client_error_ends_the_wait_at_once() {
        let (client, _) = flaky_broker(0).await;
        let started = Instant::now();
        let err = client
            .wait(
                &Poll::instance("unknown"),
                &quick(Duration::from_secs(10)),
                |_| {},
            )
            .await
            .expect_err("no such instance");
        assert_eq!(err.status(), Some(StatusCode::NOT_FOUND), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn an_unreachable_broker_is_polled_until_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let client = Client::builder(url).build().unwrap();
        let started = Instant::now();
        let err = client
            .wait(
                &Poll::instance("i1"),
                &quick(Duration::from_millis(200)),
                |_| {},
            )
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, Error::Transport { .. }), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(200));
    }
}
