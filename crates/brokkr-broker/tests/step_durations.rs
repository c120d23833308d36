//! A step's duration — in its `step_finished` event and in `brokkr_step_duration_seconds` — is
//! the time it took, measured once it has run.

#[macro_use]
mod harness;

use std::sync::Arc;
use std::time::Duration;

use brokkr_engine::step::{StepContext, StepKind, StepOutcome, async_trait};
use harness::*;
use serde_json::json;

const CONFIG: &str = r#"
catalog:
  services:
  - name: slow
    id: svc-slow
    description: A step that takes its time
    bindable: false
    plans:
    - {name: p, id: plan-slow, description: d}
blueprints:
- service: slow
  plan: p
  instance:
    steps:
    - {name: slow, run: sleep, on: [provision]}
"#;

struct Sleep;
#[async_trait]
impl StepKind for Sleep {
    async fn run(&self, _: &StepContext<'_>) -> StepOutcome {
        tokio::time::sleep(Duration::from_millis(300)).await;
        StepOutcome::Done
    }
}

store_tests!(a_step_that_takes_300ms_is_measured_as_taking_that_long);

async fn a_step_that_takes_300ms_is_measured_as_taking_that_long(backend: Backend) {
    let b = start_with_steps(
        backend,
        CONFIG,
        vec![("sleep", Arc::new(Sleep) as Arc<dyn StepKind>)],
    )
    .await;
    let body = json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-slow", "plan_id": "plan-slow"});
    let op = b
        .put("/v2/service_instances/slow-1?accepts_incomplete=true", body)
        .await
        .operation();
    let done = b
        .wait_done("/v2/service_instances/slow-1/last_operation")
        .await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);

    let rb = b
        .client
        .get(format!("{}/admin/v1/operations/{op}", b.base))
        .basic_auth(ADMIN, Some(ADMIN_PASSWORD));
    let events = b.send(rb).await.body["events"].clone();
    let finished = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "step_finished" && e["step"] == "slow")
        .unwrap_or_else(|| panic!("{events:#}"));
    let took: u64 = finished["message"]
        .as_str()
        .and_then(|m| m.strip_suffix(" ms"))
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("{finished}"));
    assert!(took >= 300, "the step_finished event says {took} ms");

    let metrics = b
        .client
        .get(format!("{}/metrics", b.base))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    let sum: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("brokkr_step_duration_seconds_sum{kind=\"provision\",step=\"slow\"} ")
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(sum >= 0.3, "the histogram saw {sum} s");
}
