use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use serde_json::json;

use super::*;
use serde_json::Value;

fn pod_spec() -> Value {
    json!({
        "containers": [
            {"name": "app", "image": "app:1",
             "env": [{"name": "LOG", "value": "debug"}],
             "envFrom": [{"configMapRef": {"name": "settings"}}],
             "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            {"name": "sidecar", "image": "proxy:1"}
        ],
        "initContainers": [{"name": "migrate", "image": "app:1"}],
        "volumes": [{"name": "data", "emptyDir": {}}]
    })
}

fn template() -> Value {
    json!({"metadata": {"labels": {"app": "shop"}}, "spec": pod_spec()})
}

/// Every built-in kind, with its pod template where that kind keeps it.
fn builtins() -> Vec<(&'static str, &'static str, Value, &'static str)> {
    let workload = |api: &str, kind: &str, spec: Value| json!({"apiVersion": api, "kind": kind, "metadata": {"name": "shop"}, "spec": spec});
    vec![
        (
            "apps",
            "Deployment",
            workload(
                "apps/v1",
                "Deployment",
                json!({"replicas": 2, "template": template()}),
            ),
            "/spec/template",
        ),
        (
            "apps",
            "StatefulSet",
            workload(
                "apps/v1",
                "StatefulSet",
                json!({"serviceName": "shop", "template": template()}),
            ),
            "/spec/template",
        ),
        (
            "apps",
            "DaemonSet",
            workload("apps/v1", "DaemonSet", json!({"template": template()})),
            "/spec/template",
        ),
        (
            "batch",
            "Job",
            workload(
                "batch/v1",
                "Job",
                json!({"backoffLimit": 1, "template": template()}),
            ),
            "/spec/template",
        ),
        (
            "batch",
            "CronJob",
            workload(
                "batch/v1",
                "CronJob",
                json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template()}}}),
            ),
            "/spec/jobTemplate/spec/template",
        ),
    ]
}

fn injection(usage: &str, secret: &str, prefix: &str) -> Injection {
    Injection {
        usage: usage.into(),
        secret: secret.into(),
        prefix: prefix.into(),
        digest: "sha256:00".into(),
    }
}

fn projection(binding: &str, secret: &str) -> Projection {
    Projection {
        binding: binding.into(),
        name: binding.into(),
        secret: secret.into(),
        ..Projection::default()
    }
}

#[test]
fn injection_on_every_builtin_kind_reaches_every_container_and_is_removed_exactly() {
    for (group, kind, original, at) in builtins() {
        let mapping = Mapping::builtin(group, kind).expect(kind);
        let mut workload = original.clone();
        inject(
            &mut workload,
            &mapping,
            &injection("redis-usage", "redis", "REDIS_"),
        )
        .unwrap();
        let template = workload.pointer(at).unwrap();
        for container in [
            "/spec/containers/0",
            "/spec/containers/1",
            "/spec/initContainers/0",
        ] {
            let env_from = template.pointer(&format!("{container}/envFrom")).unwrap();
            assert_eq!(
                env_from.as_array().unwrap().last().unwrap(),
                &json!({"secretRef": {"name": "redis"}, "prefix": "REDIS_"}),
                "{kind}{container}"
            );
        }
        // What was there stays, first.
        assert_eq!(
            template["spec"]["containers"][0]["envFrom"][0],
            json!({"configMapRef": {"name": "settings"}})
        );
        let record = &template["metadata"]["annotations"]["usage.services.brokkr.dev/redis-usage"];
        let record: Value = serde_json::from_str(record.as_str().unwrap()).unwrap();
        assert_eq!(
            record,
            json!({"secret": "redis", "prefix": "REDIS_", "digest": "sha256:00"})
        );
        assert_eq!(injected_usages(&workload, &mapping), vec!["redis-usage"]);

        let once = workload.clone();
        inject(
            &mut workload,
            &mapping,
            &injection("redis-usage", "redis", "REDIS_"),
        )
        .unwrap();
        assert_eq!(workload, once, "{kind}: injecting is idempotent");

        uninject(&mut workload, &mapping, "redis-usage").unwrap();
        assert_eq!(
            workload, original,
            "{kind}: uninjecting restores the original"
        );
        uninject(&mut workload, &mapping, "redis-usage").unwrap();
        assert_eq!(workload, original);
    }
}

#[test]
fn projection_on_every_builtin_kind_mounts_every_container_and_is_removed_exactly() {
    for (group, kind, original, at) in builtins() {
        let mapping = Mapping::builtin(group, kind).expect(kind);
        let mut workload = original.clone();
        let mut edit = projection("account-db", "account-db-secret");
        edit.env = vec![("DB_HOST".into(), "host".into())];
        project(&mut workload, &mapping, &edit).unwrap();
        let template = workload.pointer(at).unwrap();
        let volumes = template["spec"]["volumes"].as_array().unwrap();
        assert_eq!(volumes[0]["name"], "data");
        assert_eq!(
            volumes[1],
            json!({"name": "servicebinding-account-db", "projected": {"sources": [
                {"secret": {"name": "account-db-secret"}}
            ]}})
        );
        for container in [
            "/spec/containers/0",
            "/spec/containers/1",
            "/spec/initContainers/0",
        ] {
            let container = template.pointer(container).unwrap();
            let mounts = container["volumeMounts"].as_array().unwrap();
            assert_eq!(
                mounts.last().unwrap(),
                &json!({"name": "servicebinding-account-db", "mountPath": "/bindings/account-db", "readOnly": true}),
                "{kind}"
            );
            let env = container["env"].as_array().unwrap();
            assert!(env.contains(&json!({"name": "SERVICE_BINDING_ROOT", "value": "/bindings"})));
            assert!(env.contains(&json!({"name": "DB_HOST", "valueFrom": {"secretKeyRef": {"name": "account-db-secret", "key": "host"}}})));
        }
        assert_eq!(
            template["spec"]["containers"][0]["env"][0],
            json!({"name": "LOG", "value": "debug"})
        );
        assert_eq!(
            projected_volumes(&workload, &mapping),
            vec!["servicebinding-account-db"]
        );

        let once = workload.clone();
        project(&mut workload, &mapping, &edit).unwrap();
        assert_eq!(workload, once, "{kind}: projecting is idempotent");

        unproject(&mut workload, &mapping, "account-db").unwrap();
        assert_eq!(
            workload, original,
            "{kind}: unprojecting restores the original"
        );
    }
}

#[test]
fn an_unknown_kind_has_no_builtin_mapping_and_the_default_is_pod_spec_able() {
    assert_eq!(Mapping::builtin("example.com", "Thing"), None);
    assert_eq!(
        Mapping::builtin("apps", "Deployment"),
        Some(Mapping::pod_spec_able())
    );
    // An empty ClusterWorkloadResourceMapping version means PodSpec-able.
    assert_eq!(
        Mapping::new(None, &[], None).unwrap(),
        Mapping::pod_spec_able()
    );
    let spelled_out = Mapping::new(
        Some(".spec.template.metadata.annotations"),
        &[
            ContainerPaths {
                path: ".spec.template.spec.containers[*]",
                name: Some(".name"),
                env: Some(".env"),
                volume_mounts: Some(".volumeMounts"),
                ..ContainerPaths::default()
            },
            ContainerPaths {
                path: ".spec.template.spec.initContainers[*]",
                name: Some(".name"),
                ..ContainerPaths::default()
            },
        ],
        Some(".spec.template.spec.volumes"),
    )
    .unwrap();
    assert_eq!(spelled_out, Mapping::pod_spec_able());
    assert!(Mapping::new(Some(".spec.containers[*]"), &[], None).is_err());
}

/// A kind without a pod template: containers in two lists under `.spec.runtime`, one of them
/// keeping its variables elsewhere, annotations and volumes in their own places.
fn custom() -> (Mapping, Value) {
    let mapping = Mapping::new(
        Some(".metadata.annotations"),
        &[
            ContainerPaths {
                path: ".spec.runtime.workers[*]",
                name: Some(".id"),
                ..ContainerPaths::default()
            },
            ContainerPaths {
                path: "$.spec['runtime'].setup[*]",
                name: None,
                env: Some(".config.env"),
                env_from: Some(".config.envFrom"),
                volume_mounts: Some(".config.mounts"),
            },
        ],
        Some(".spec.storage.volumes"),
    )
    .unwrap();
    let workload = json!({
        "apiVersion": "example.com/v1", "kind": "Pipeline",
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"runtime": {
            "workers": [
                {"id": "fetch", "image": "f", "env": [{"name": "X", "value": "1"}]},
                {"id": "store", "image": "s"}
            ],
            "setup": [{"image": "init"}]
        }}
    });
    (mapping, workload)
}

#[test]
fn a_custom_kind_is_edited_where_its_mapping_says_and_restored() {
    let (mapping, original) = custom();
    let mut workload = original.clone();
    inject(&mut workload, &mapping, &injection("u", "s", "")).unwrap();
    let mut edit = projection("b", "b-secret");
    edit.containers = vec!["store".into()];
    edit.env = vec![("B_URI".into(), "uri".into())];
    project(&mut workload, &mapping, &edit).unwrap();

    let runtime = &workload["spec"]["runtime"];
    // No prefix: no `prefix` field.
    assert_eq!(
        runtime["workers"][0]["envFrom"],
        json!([{"secretRef": {"name": "s"}}])
    );
    assert_eq!(
        runtime["setup"][0]["config"]["envFrom"],
        json!([{"secretRef": {"name": "s"}}])
    );
    // `fetch` is filtered out by name; `setup` has no name mapping, so it is bound.
    assert!(runtime["workers"][0].get("volumeMounts").is_none());
    assert_eq!(
        runtime["workers"][0]["env"],
        json!([{"name": "X", "value": "1"}])
    );
    assert_eq!(
        runtime["workers"][1]["volumeMounts"],
        json!([{"name": "servicebinding-b", "mountPath": "/bindings/b", "readOnly": true}])
    );
    assert_eq!(
        runtime["setup"][0]["config"]["mounts"][0]["mountPath"],
        "/bindings/b"
    );
    assert_eq!(
        runtime["setup"][0]["config"]["env"][0],
        json!({"name": "SERVICE_BINDING_ROOT", "value": "/bindings"})
    );
    assert_eq!(
        workload["spec"]["storage"]["volumes"][0]["name"],
        "servicebinding-b"
    );
    assert!(
        workload["metadata"]["annotations"]["projection.services.brokkr.dev/servicebinding-b"]
            .is_string()
    );
    assert_eq!(workload["metadata"]["labels"], json!({"a": "b"}));

    let once = workload.clone();
    inject(&mut workload, &mapping, &injection("u", "s", "")).unwrap();
    project(&mut workload, &mapping, &edit).unwrap();
    assert_eq!(workload, once);

    unproject(&mut workload, &mapping, "b").unwrap();
    uninject(&mut workload, &mapping, "u").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn two_usages_coexist_and_removing_one_keeps_the_other() {
    let mapping = Mapping::pod_spec_able();
    let (_, _, original, _) = builtins().remove(0);
    let mut workload = original.clone();
    inject(&mut workload, &mapping, &injection("a", "redis", "A_")).unwrap();
    inject(&mut workload, &mapping, &injection("b", "mysql", "")).unwrap();
    // The same Secret and prefix twice: one entry, kept until both are gone.
    inject(&mut workload, &mapping, &injection("c", "redis", "A_")).unwrap();
    let containers = |w: &Value| w["spec"]["template"]["spec"]["containers"][1]["envFrom"].clone();
    assert_eq!(
        containers(&workload),
        json!([
            {"secretRef": {"name": "redis"}, "prefix": "A_"},
            {"secretRef": {"name": "mysql"}}
        ])
    );
    // Re-applying the first does not move it (no rolling back and forth).
    let before = workload.clone();
    inject(&mut workload, &mapping, &injection("a", "redis", "A_")).unwrap();
    assert_eq!(workload, before);

    uninject(&mut workload, &mapping, "a").unwrap();
    assert_eq!(
        containers(&workload),
        json!([
            {"secretRef": {"name": "redis"}, "prefix": "A_"},
            {"secretRef": {"name": "mysql"}}
        ])
    );
    uninject(&mut workload, &mapping, "c").unwrap();
    assert_eq!(
        containers(&workload),
        json!([{"secretRef": {"name": "mysql"}}])
    );
    uninject(&mut workload, &mapping, "b").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn a_changed_secret_or_prefix_replaces_the_old_entry_and_the_digest_is_updated() {
    let mapping = Mapping::pod_spec_able();
    let (_, _, original, _) = builtins().remove(0);
    let mut workload = original.clone();
    inject(&mut workload, &mapping, &injection("a", "redis", "A_")).unwrap();
    let mut changed = injection("a", "redis-2", "B_");
    changed.digest = "sha256:11".into();
    inject(&mut workload, &mapping, &changed).unwrap();
    let app = &workload["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        app["envFrom"],
        json!([{"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "redis-2"}, "prefix": "B_"}])
    );
    let record =
        workload["spec"]["template"]["metadata"]["annotations"]["usage.services.brokkr.dev/a"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(record.contains("sha256:11"), "{record}");
    uninject(&mut workload, &mapping, "a").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn the_digest_follows_the_data_not_its_order() {
    let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect()
    };
    let one = secret_digest(Some(&data(&[("a", "1"), ("b", "2")])));
    assert_eq!(one, secret_digest(Some(&data(&[("b", "2"), ("a", "1")]))));
    assert_ne!(one, secret_digest(Some(&data(&[("a", "1"), ("b", "3")]))));
    // Entry boundaries count: "ab"+"c" is not "a"+"bc".
    assert_ne!(
        secret_digest(Some(&data(&[("ab", "c")]))),
        secret_digest(Some(&data(&[("a", "bc")])))
    );
    assert!(one.starts_with("sha256:"));
    assert_eq!(secret_digest(None), secret_digest(Some(&BTreeMap::new())));
}

#[test]
fn a_service_binding_root_that_is_set_is_used_and_never_changed() {
    let mapping = Mapping::pod_spec_able();
    let (_, _, mut original, _) = builtins().remove(0);
    original["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "SERVICE_BINDING_ROOT", "value": "/etc/bindings/"}));
    let mut workload = original.clone();
    project(&mut workload, &mapping, &projection("db", "db")).unwrap();
    project(&mut workload, &mapping, &projection("cache", "cache")).unwrap();
    let containers = &workload["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        containers[0]["volumeMounts"][1]["mountPath"],
        "/etc/bindings/db"
    );
    assert_eq!(
        containers[0]["volumeMounts"][2]["mountPath"],
        "/etc/bindings/cache"
    );
    assert_eq!(
        containers[0]["env"],
        json!([
            {"name": "LOG", "value": "debug"},
            {"name": "SERVICE_BINDING_ROOT", "value": "/etc/bindings/"}
        ])
    );
    assert_eq!(
        containers[1]["volumeMounts"][0]["mountPath"],
        "/bindings/db"
    );
    // The variable the first projection added stays while the second needs it.
    unproject(&mut workload, &mapping, "db").unwrap();
    let containers = &workload["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        containers[1]["env"],
        json!([{"name": "SERVICE_BINDING_ROOT", "value": "/bindings"}])
    );
    assert_eq!(
        containers[1]["volumeMounts"][0]["mountPath"],
        "/bindings/cache"
    );
    unproject(&mut workload, &mapping, "cache").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn type_and_provider_overrides_are_projected_from_annotations() {
    let mapping = Mapping::pod_spec_able();
    let (_, _, original, _) = builtins().remove(0);
    let mut workload = original.clone();
    let mut edit = projection("db", "db-secret");
    edit.name = "account-db".into();
    edit.type_ = Some("mysql".into());
    edit.provider = Some("bitnami".into());
    edit.env = vec![
        ("DB_TYPE".into(), "type".into()),
        ("DB_PROVIDER".into(), "provider".into()),
        ("DB_PASSWORD".into(), "password".into()),
    ];
    project(&mut workload, &mapping, &edit).unwrap();
    let template = &workload["spec"]["template"];
    let annotations = &template["metadata"]["annotations"];
    assert_eq!(
        annotations["type.projection.services.brokkr.dev/servicebinding-db"],
        "mysql"
    );
    assert_eq!(
        annotations["provider.projection.services.brokkr.dev/servicebinding-db"],
        "bitnami"
    );
    assert_eq!(
        template["spec"]["volumes"][1]["projected"]["sources"],
        json!([
            {"secret": {"name": "db-secret"}},
            {"downwardAPI": {"items": [{"path": "type", "fieldRef": {"fieldPath": "metadata.annotations['type.projection.services.brokkr.dev/servicebinding-db']"}}]}},
            {"downwardAPI": {"items": [{"path": "provider", "fieldRef": {"fieldPath": "metadata.annotations['provider.projection.services.brokkr.dev/servicebinding-db']"}}]}}
        ])
    );
    let env = &template["spec"]["containers"][1]["env"];
    assert_eq!(
        env,
        &json!([
            {"name": "SERVICE_BINDING_ROOT", "value": "/bindings"},
            {"name": "DB_TYPE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['type.projection.services.brokkr.dev/servicebinding-db']"}}},
            {"name": "DB_PROVIDER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['provider.projection.services.brokkr.dev/servicebinding-db']"}}},
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db-secret", "key": "password"}}}
        ])
    );
    assert_eq!(
        template["spec"]["containers"][1]["volumeMounts"][0]["mountPath"],
        "/bindings/account-db"
    );

    // Dropping the overrides and a variable updates in place.
    edit.type_ = None;
    edit.provider = None;
    edit.env.remove(1);
    project(&mut workload, &mapping, &edit).unwrap();
    let template = &workload["spec"]["template"];
    assert!(
        template["metadata"]["annotations"]
            .get("type.projection.services.brokkr.dev/servicebinding-db")
            .is_none()
    );
    assert_eq!(
        template["spec"]["volumes"][1]["projected"]["sources"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        template["spec"]["containers"][1]["env"],
        json!([
            {"name": "SERVICE_BINDING_ROOT", "value": "/bindings"},
            {"name": "DB_TYPE", "valueFrom": {"secretKeyRef": {"name": "db-secret", "key": "type"}}},
            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db-secret", "key": "password"}}}
        ])
    );
    unproject(&mut workload, &mapping, "db").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn a_container_dropped_from_the_filter_loses_the_projection() {
    let mapping = Mapping::pod_spec_able();
    let (_, _, original, _) = builtins().remove(0);
    let mut workload = original.clone();
    let mut edit = projection("db", "db");
    edit.env = vec![("H".into(), "host".into())];
    project(&mut workload, &mapping, &edit).unwrap();
    edit.containers = vec!["sidecar".into(), "no-such-container".into()];
    project(&mut workload, &mapping, &edit).unwrap();
    let spec = &workload["spec"]["template"]["spec"];
    assert_eq!(
        spec["containers"][0],
        original["spec"]["template"]["spec"]["containers"][0]
    );
    assert_eq!(
        spec["initContainers"][0],
        original["spec"]["template"]["spec"]["initContainers"][0]
    );
    assert_eq!(
        spec["containers"][1]["volumeMounts"][0]["name"],
        "servicebinding-db"
    );
    assert_eq!(spec["containers"][1]["env"][1]["name"], "H");
    unproject(&mut workload, &mapping, "db").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn a_projection_and_a_usage_on_one_workload_are_independent() {
    let mapping = Mapping::builtin("batch", "CronJob").unwrap();
    let (_, _, original, _) = builtins().remove(4);
    let mut workload = original.clone();
    inject(&mut workload, &mapping, &injection("u", "s", "P_")).unwrap();
    let injected = workload.clone();
    project(&mut workload, &mapping, &projection("b", "s")).unwrap();
    unproject(&mut workload, &mapping, "b").unwrap();
    assert_eq!(workload, injected);
    uninject(&mut workload, &mapping, "u").unwrap();
    assert_eq!(workload, original);
}

#[test]
fn long_names_give_valid_volume_and_annotation_names() {
    let long = "a".repeat(200) + ".example";
    let volume = volume_name(&long);
    assert!(
        volume.len() <= 63 && volume.starts_with(VOLUME_PREFIX),
        "{volume}"
    );
    assert_eq!(volume, volume_name(&long));
    assert_ne!(volume, volume_name(&(long.clone() + "x")));
    assert_eq!(volume_name("db.prod").len(), VOLUME_PREFIX.len() + 32);
    let annotation = usage_annotation(&long);
    let name = annotation.strip_prefix(USAGE_ANNOTATION_PREFIX).unwrap();
    assert!(name.len() <= 63, "{name}");
    assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
    assert_eq!(
        usage_annotation("redis.usage"),
        "usage.services.brokkr.dev/redis.usage"
    );
}

#[test]
fn a_broken_record_or_a_blocked_path_is_an_error_not_a_guess() {
    let mapping = Mapping::pod_spec_able();
    let (_, _, mut workload, _) = builtins().remove(0);
    workload["spec"]["template"]["metadata"]["annotations"] =
        json!({"usage.services.brokkr.dev/a": "not json"});
    assert!(matches!(
        uninject(&mut workload, &mapping, "a"),
        Err(Error::Record { .. })
    ));
    workload["spec"]["template"]["spec"]["volumes"] = json!("x");
    assert!(matches!(
        project(&mut workload, &mapping, &projection("b", "s")),
        Err(Error::NotA { .. })
    ));
}
