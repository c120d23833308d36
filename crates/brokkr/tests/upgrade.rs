//! Fleet upgrades through `brokkr upgrade` and the admin API, on the real binary: a fleet moved
//! to the plan's new maintenance version through a `kill -9` of the broker in the middle, on a
//! SQLite store, and on PostgreSQL with a second replica taking over, each instance upgraded
//! exactly once; a dry run that changes nothing; a failed canary and `max_failures` that stop an
//! upgrade, leaving the failed instances usable at their old version; pause, resume and cancel,
//! and an instance the platform upgraded meanwhile taken as done.

mod support;

use std::time::Duration;

use brokkr_test_support::PgSchema;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::eventually;
use support::upgrade::{Broker, cli, config, fleet_behind, ids};

#[tokio::test]
async fn a_fleet_upgrade_survives_a_kill_and_upgrades_each_instance_once() {
    let dir = tempfile::tempdir().unwrap();
    // Provisioned at 1.0.0; the plan moves to 1.1.0.
    let (provisions, broker) = fleet_behind(dir.path(), "f", 50).await;

    // A dry run says what would change, and changes nothing.
    let dry = cli(
        &broker,
        &[
            "--service",
            "fleet",
            "--plan",
            "small",
            "--dry-run",
            "-o",
            "json",
        ],
    );
    let dry: Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(dry["instances"].as_array().unwrap().len(), 50);
    assert_eq!(
        dry["instances"][0],
        json!({"instance_id": "f-00", "from_version": "1.0.0", "to_version": "1.1.0"})
    );
    let (_, list) = broker.admin(Method::GET, "/admin/v1/upgrades", None).await;
    assert_eq!(list, json!({"upgrades": []}));

    let begun = std::time::Instant::now();
    let started = cli(
        &broker,
        &[
            "--service",
            "fleet",
            "--plan",
            "small",
            "--max-parallel",
            "5",
            "-o",
            "json",
        ],
    );
    let started: Value = serde_json::from_str(&started).unwrap();
    let id = started["id"].as_str().unwrap().to_owned();
    assert_eq!(started["state"], "running");

    // Killed in the middle, restarted on the same store: the upgrade goes on from there.
    let midway = eventually("some instances to be upgraded", async || {
        let upgrade = broker.upgrade(&id).await;
        (upgrade["counts"]["succeeded"].as_u64()? >= 10).then_some(upgrade)
    })
    .await;
    assert!(
        midway["counts"]["pending"].as_u64().unwrap() > 0,
        "{midway}"
    );
    drop(broker);
    let broker = Broker::start(dir.path()).await;
    let done = broker.upgrade_reaches(&id, "succeeded").await;
    assert_eq!(done["counts"]["succeeded"], 50, "{done}");
    eprintln!(
        "50 instances upgraded, 5 at a time, through a kill -9 and a restart: {:.1?}",
        begun.elapsed()
    );

    // Each instance ran exactly one update since its provision, and is at 1.1.0.
    let instances = broker.instances().await;
    assert_eq!(instances.len(), 50);
    for i in &instances {
        let n: usize = i["instance_id"].as_str().unwrap()[2..].parse().unwrap();
        assert_eq!(i["maintenance_version"], "1.1.0", "{i}");
        assert_eq!(i["operation"]["kind"], "update", "{i}");
        assert_eq!(i["operation"]["state"], "succeeded", "{i}");
        assert_eq!(i["operation"]["steps"], json!(["migrate", "break"]), "{i}");
        assert_eq!(i["previous_operation"]["id"], provisions[n], "{i}");
    }
    let (_, fetched) = broker
        .osb(Method::GET, "/v2/service_instances/f-07", None)
        .await;
    assert_eq!(fetched["maintenance_info"]["version"], "1.1.0");

    let status = cli(&broker, &["status", &id]);
    assert!(
        status.contains("[####################] 50/50 succeeded"),
        "{status}"
    );
    let metrics = broker
        .http
        .get(format!("{}/metrics", broker.url))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains(r#"brokkr_instances{service="fleet",plan="small",version="1.1.0"} 50"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_failed_canary_or_too_many_failures_stop_an_upgrade_and_leave_instances_usable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.0.0")).unwrap();
    let fleet = ids("c", 8);
    {
        let broker = Broker::start(dir.path()).await;
        broker.provision(&fleet, &["c-00", "c-05"]).await;
    }
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.1.0")).unwrap();
    let broker = Broker::start(dir.path()).await;

    // c-00 is a canary and fails: nothing past the canaries starts.
    let body = json!({"service": "fleet", "plan": "small-plan", "canary": 2, "max_parallel": 2, "max_failures": 5});
    let id = broker.start_upgrade(body).await;
    let failed = broker.upgrade_reaches(&id, "failed").await;
    assert!(
        failed["description"]
            .as_str()
            .unwrap()
            .contains("canary instance c-00"),
        "{failed}"
    );
    assert_eq!(failed["counts"]["pending"], 6, "{failed}");
    assert_eq!(failed["instances"][0]["state"], "failed");
    assert!(
        failed["instances"][0]["description"]
            .as_str()
            .unwrap()
            .contains("not a URL"),
        "{failed}"
    );

    // The failed upgrade left c-00 usable at its old version.
    let last = broker.last_operation_ends("c-00").await;
    assert_eq!(last["state"], "failed");
    assert_eq!(last["instance_usable"], true);
    let (_, fetched) = broker
        .osb(Method::GET, "/v2/service_instances/c-00", None)
        .await;
    assert_eq!(fetched["maintenance_info"]["version"], "1.0.0");

    // max_failures 2: c-00 and c-05 fail, and c-06 and c-07 are never started.
    let body = json!({"service": "fleet", "plan": "small", "max_failures": 2});
    let id = broker.start_upgrade(body).await;
    let failed = broker.upgrade_reaches(&id, "failed").await;
    assert!(
        failed["description"]
            .as_str()
            .unwrap()
            .contains("max_failures 2"),
        "{failed}"
    );
    let states: Vec<&str> = (failed["instances"].as_array().unwrap().iter())
        .map(|i| i["state"].as_str().unwrap())
        .collect();
    // c-01 was upgraded by the canary wave, so it is not taken again.
    assert_eq!(
        states,
        [
            "failed",
            "succeeded",
            "succeeded",
            "succeeded",
            "failed",
            "pending",
            "pending"
        ],
        "{failed}"
    );
    for i in broker.instances().await {
        let upgraded =
            ["c-01", "c-02", "c-03", "c-04"].contains(&i["instance_id"].as_str().unwrap());
        let version = if upgraded { "1.1.0" } else { "1.0.0" };
        assert_eq!(i["maintenance_version"], version, "{i}");
    }
}

#[tokio::test]
async fn an_upgrade_can_be_paused_resumed_and_cancelled_and_takes_the_platforms_own() {
    let dir = tempfile::tempdir().unwrap();
    let (provisions, broker) = fleet_behind(dir.path(), "p", 6).await;

    let id = broker
        .start_upgrade(json!({"service": "fleet", "plan": "small"}))
        .await;
    let paused = cli(&broker, &["pause", &id]);
    assert!(paused.contains(": paused"), "{paused}");
    // While paused, what was started ends and nothing more starts.
    let settled = eventually("the paused upgrade to settle", async || {
        let u = broker.upgrade(&id).await;
        (u["counts"]["in_progress"] == 0).then_some(u)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = broker.upgrade(&id).await;
    assert_eq!(still["counts"], settled["counts"]);
    assert!(still["counts"]["pending"].as_u64().unwrap() >= 5, "{still}");

    // Meanwhile the platform upgrades p-01 itself: the orchestration takes that as done.
    let body = json!({"service_id": "fleet-svc", "maintenance_info": {"version": "1.1.0"}});
    let path = "/v2/service_instances/p-01?accepts_incomplete=true";
    let (status, answer) = broker.osb(Method::PATCH, path, Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let platforms = answer["operation"].as_str().unwrap().to_owned();
    assert_eq!(
        broker.last_operation_ends("p-01").await["state"],
        "succeeded"
    );

    cli(&broker, &["resume", &id]);
    eventually("the upgrade to go on", async || {
        let u = broker.upgrade(&id).await;
        (u["counts"]["succeeded"].as_u64()? >= 3).then_some(())
    })
    .await;
    let cancelled = cli(&broker, &["cancel", &id]);
    assert!(cancelled.contains(": cancelled"), "{cancelled}");
    let after = eventually("the cancelled upgrade to settle", async || {
        let u = broker.upgrade(&id).await;
        (u["counts"]["in_progress"] == 0).then_some(u)
    })
    .await;
    assert_eq!(after["state"], "cancelled");
    assert!(after["counts"]["pending"].as_u64().unwrap() >= 1, "{after}");
    let by_platform = &after["instances"][1];
    assert_eq!(by_platform["state"], "succeeded", "{after}");
    let description = by_platform["description"].as_str().unwrap();
    assert!(description.contains(&platforms), "{after}");

    // A cancelled upgrade cannot be resumed; a new one takes the instances left.
    let resume = format!("/admin/v1/upgrades/{id}/resume");
    let (status, answer) = broker.admin(Method::POST, &resume, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    let bad = json!({"service": "fleet", "plan": "small", "max_parallel": 0});
    let (status, _) = (broker.admin(Method::POST, "/admin/v1/upgrades", Some(bad))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let next = broker
        .start_upgrade(json!({"service": "fleet", "plan": "small", "max_parallel": 3}))
        .await;
    let done = broker.upgrade_reaches(&next, "succeeded").await;
    let left = after["counts"]["pending"].as_u64().unwrap();
    assert_eq!(done["counts"]["total"].as_u64().unwrap(), left, "{done}");

    // Every instance had exactly one update since its provision.
    for i in broker.instances().await {
        let n: usize = i["instance_id"].as_str().unwrap()[2..].parse().unwrap();
        assert_eq!(i["maintenance_version"], "1.1.0", "{i}");
        assert_eq!(i["previous_operation"]["id"], provisions[n], "{i}");
    }
}

#[tokio::test]
async fn on_postgres_another_replica_takes_over_a_dead_replicas_fleet_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let pg = PgSchema::create().await;
    let lease = [("BROKKR_LEASE", "2s")];
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.0.0")).unwrap();
    let fleet = ids("r", 20);
    let provisions = {
        let a = Broker::start_on(dir.path(), &pg.url, &lease).await;
        a.provision(&fleet, &[]).await
    };
    std::fs::write(dir.path().join("brokkr.yaml"), config("1.1.0")).unwrap();
    let a = Broker::start_on(dir.path(), &pg.url, &lease).await;
    let body = json!({"service": "fleet", "plan": "small", "max_parallel": 5});
    let id = a.start_upgrade(body).await;
    // Replica A holds the upgrade; B starts once A is under way, and A dies.
    let midway = eventually("some instances to be upgraded", async || {
        let upgrade = a.upgrade(&id).await;
        (upgrade["counts"]["succeeded"].as_u64()? >= 5).then_some(upgrade)
    })
    .await;
    assert!(
        midway["counts"]["pending"].as_u64().unwrap() > 0,
        "{midway}"
    );
    let b = Broker::start_on(dir.path(), &pg.url, &lease).await;
    drop(a);
    let killed = std::time::Instant::now();
    let done = b.upgrade_reaches(&id, "succeeded").await;
    assert_eq!(done["counts"]["succeeded"], 20, "{done}");
    eprintln!(
        "replica B finished the upgrade {:.1?} after A was killed (lease 2s)",
        killed.elapsed()
    );
    for i in b.instances().await {
        let n: usize = i["instance_id"].as_str().unwrap()[2..].parse().unwrap();
        assert_eq!(i["maintenance_version"], "1.1.0", "{i}");
        assert_eq!(i["operation"]["state"], "succeeded", "{i}");
        assert_eq!(i["previous_operation"]["id"], provisions[n], "{i}");
    }
    drop(b);
    pg.drop_schema().await;
}
