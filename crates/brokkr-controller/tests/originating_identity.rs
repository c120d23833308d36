//! Whose identity each broker call carries, against the fake API server and a scripted broker:
//! with the `brokkr-user-info` policy installed, a provision, an update of a new generation and
//! a bind carry the `spec.userInfo` of the change that caused them; a parameters Secret's
//! change, a rotation, an unbind and a deprovision carry none, whoever set the spec before; an
//! object created before the policy carries none; without the policy nothing carries one.

mod support;

use axum::http::StatusCode;
use base64::Engine as _;
use brokkr_controller::resources::{ServiceBinding, ServiceInstance};
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::{
    ADMISSION, API, Broker, Cluster, Seen, condition, install_user_info_policy,
    install_user_info_policy_as,
};

fn user(name: &str) -> Value {
    json!({"username": name, "groups": ["team-a"]})
}

fn secret(name: &str, value: &str) -> Value {
    let data = base64::engine::general_purpose::STANDARD.encode(value);
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"}, "data": {"parameters": data}})
}

/// Answers every call synchronously, binds with credentials.
fn answers(seen: &Seen) -> (StatusCode, Value) {
    match seen.verb() {
        "BIND" => (
            StatusCode::CREATED,
            json!({"credentials": {"type": "postgresql", "password": "pw"}}),
        ),
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" | "BINDING_POLL" => (StatusCode::OK, json!({"state": "succeeded"})),
        _ => (StatusCode::OK, json!({})),
    }
}

/// The users of the calls with this verb, in order.
fn users(broker: &Broker, verb: &str) -> Vec<Option<String>> {
    broker.seen_verb(verb).into_iter().map(|s| s.user).collect()
}

fn alice() -> Option<String> {
    Some("alice".into())
}

#[tokio::test]
async fn each_call_carries_the_identity_of_the_change_that_caused_it_or_none() {
    let broker = Broker::start(answers).await;
    let cluster = Cluster::start(&broker).await;
    install_user_info_policy(&cluster.fake);
    cluster.fake.create(secret("db-params", r#"{"size": 1}"#));

    // Alice creates the instance: the provision is hers.
    cluster.create_instance(
        "default",
        "db",
        json!({"userInfo": user("alice"),
               "parametersFrom": [{"secretKeyRef": {"name": "db-params", "key": "parameters"}}]}),
    );
    let ready = cluster.ready("default", "db").await;
    assert_eq!(users(&broker, "PUT"), [alice()]);
    assert_eq!(
        ready["status"]["externalProperties"]["userInfo"]["username"],
        "alice"
    );

    // Carol changes the parameters Secret: the update is not Alice's.
    cluster.fake.create(secret("db-params", r#"{"size": 2}"#));
    cluster
        .eventually("the Secret's update", || {
            (broker.seen_verb("PATCH").len() == 1).then_some(())
        })
        .await;
    assert_eq!(users(&broker, "PATCH"), [None]);

    // Carol changes the spec, with her own userInfo: that update is hers.
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["userInfo"] = user("carol");
        o["spec"]["parameters"] = json!({"tier": "gold"});
    });
    cluster
        .eventually("the spec's update", || {
            (broker.seen_verb("PATCH").len() == 2).then_some(())
        })
        .await;
    assert_eq!(users(&broker, "PATCH")[1], Some("carol".into()));

    // Alice binds: the bind is hers; a rotation and the unbinds are nobody's.
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "app", "namespace": "default"},
        "spec": {"instanceRef": {"name": "db"}, "userInfo": user("alice"),
                 "rotationGracePeriodSeconds": 0}}));
    cluster
        .eventually("the bind", || {
            let b = cluster
                .fake
                .get(API, "ServiceBinding", Some("default"), "app")?;
            (condition(&b, "Ready")?["status"] == "True").then_some(())
        })
        .await;
    cluster.edit(API, "ServiceBinding", Some("default"), "app", |b| {
        b["metadata"]["annotations"] = json!({"services.brokkr.dev/rotate": "now"});
    });
    cluster
        .eventually("the rotation's bind and unbind", || {
            (broker.seen_verb("BIND").len() == 2 && broker.seen_verb("UNBIND").len() == 1)
                .then_some(())
        })
        .await;
    assert_eq!(users(&broker, "BIND"), [alice(), None]);
    Api::<ServiceBinding>::namespaced(cluster.fake.client(), "default")
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    Api::<ServiceInstance>::namespaced(cluster.fake.client(), "default")
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually("the instance deprovisioned", || {
            cluster.instance("default", "db").is_none().then_some(())
        })
        .await;
    assert_eq!(users(&broker, "UNBIND"), [None, None]);
    assert_eq!(users(&broker, "DELETE"), [None]);
}

#[tokio::test]
async fn an_identity_written_before_the_policy_or_without_it_is_never_forwarded() {
    let broker = Broker::start(answers).await;
    let cluster = Cluster::start(&broker).await;

    // No policy: nothing is forwarded.
    cluster.create_instance("default", "before", json!({"userInfo": user("alice")}));
    let ready = cluster.ready("default", "before").await;
    assert_eq!(users(&broker, "PUT"), [None]);
    assert!(ready["status"]["externalProperties"]["userInfo"].is_null());

    // An instance created before the policy (as while an admin had removed it), provisioned
    // once the policy is back: its userInfo was never checked.
    install_user_info_policy(&cluster.fake);
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceInstance",
        "metadata": {"name": "forged", "namespace": "default",
                     "creationTimestamp": "2025-11-01T00:00:00Z"},
        "spec": {"clusterServiceClassExternalName": "db",
                 "clusterServicePlanExternalName": "small", "externalID": "forged",
                 "userInfo": {"username": "alice", "groups": ["system:masters"]}}}));
    cluster.ready("default", "forged").await;
    // One created after it is trusted.
    cluster.create_instance("default", "after", json!({"userInfo": user("alice")}));
    cluster.ready("default", "after").await;
    assert_eq!(users(&broker, "PUT"), [None, None, alice()]);
}

/// The instance's `OriginatingIdentity` condition: (status, reason, message).
fn identity_condition(cluster: &Cluster, name: &str) -> Option<(String, String, String)> {
    let c = condition(&cluster.instance("default", name)?, "OriginatingIdentity")?;
    let text = |key: &str| c[key].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

#[tokio::test]
async fn a_policy_or_binding_narrowed_or_weakened_by_an_admin_is_not_trusted_and_the_object_says_so()
 {
    // Each of these leaves some writes unchecked: a namespace or object left out, the shipped
    // expression changed, a binding that only audits. The instance's forged identity (alice in
    // system:masters, written by whoever) is withheld, and its condition says so.
    type Change = fn(&mut Value, &mut Value);
    let changes: [(&str, Change); 4] = [
        ("namespaces", |_, b| {
            b["spec"]["matchResources"] =
                json!({"namespaceSelector": {"matchLabels": {"checked": "yes"}}});
        }),
        ("objects", |p, _| {
            p["spec"]["matchConstraints"]["objectSelector"] =
                json!({"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]});
        }),
        ("expression", |p, _| {
            p["spec"]["validations"][0]["expression"] = json!("true");
        }),
        ("audit", |_, b| {
            b["spec"]["validationActions"] = json!(["Audit"])
        }),
    ];
    for (what, change) in changes {
        let broker = Broker::start(answers).await;
        let cluster = Cluster::start(&broker).await;
        install_user_info_policy_as(&cluster.fake, change);
        cluster.create_instance(
            "default",
            "db",
            json!({"userInfo": {"username": "alice", "groups": ["team-a", "system:masters"]}}),
        );
        cluster.ready("default", "db").await;
        assert_eq!(users(&broker, "PUT"), [None], "{what}");
        let (status, reason, message) = identity_condition(&cluster, "db").expect(what);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "UserInfoNotChecked"),
            "{what}"
        );
        assert!(
            message.contains("not in force as brokkr ships it"),
            "{what}: {message}"
        );
    }

    // As shipped, the same instance's identity goes, and its condition says so.
    let broker = Broker::start(answers).await;
    let cluster = Cluster::start(&broker).await;
    install_user_info_policy(&cluster.fake);
    cluster.create_instance("default", "db", json!({"userInfo": user("alice")}));
    cluster.ready("default", "db").await;
    assert_eq!(users(&broker, "PUT"), [alice()]);
    let (status, reason, _) = identity_condition(&cluster, "db").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "UserInfoForwarded")
    );
}

#[tokio::test]
async fn a_policy_changed_and_stripped_of_its_managed_fields_trusts_nothing_older_than_its_sight() {
    // The binding was changed after its creation (generation 2: narrowed, then put back, say)
    // and its managedFields stripped: when it became what it is is unknown, so it counts from
    // when the controller first saw it — after the instance was created.
    let broker = Broker::start(answers).await;
    let cluster = Cluster::start(&broker).await;
    install_user_info_policy(&cluster.fake);
    let mut binding = cluster
        .fake
        .get(
            ADMISSION,
            "ValidatingAdmissionPolicyBinding",
            None,
            "brokkr-user-info",
        )
        .unwrap();
    binding["spec"]["validationActions"] = json!(["Deny", "Audit"]);
    binding["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    cluster.fake.create(binding);
    cluster.create_instance("default", "db", json!({"userInfo": user("alice")}));
    cluster.ready("default", "db").await;
    assert_eq!(users(&broker, "PUT"), [None]);
    let (status, _, message) = identity_condition(&cluster, "db").unwrap();
    assert_eq!(status, "False");
    assert!(message.contains("older than"), "{message}");
}
