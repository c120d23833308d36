//! The generated CustomResourceDefinitions are ones an API server accepts (structural schemas),
//! and Service Catalog v1beta1 manifests port by changing `apiVersion` only: every field they set
//! is in the schema (so the API server keeps it) and survives a round trip through the Rust types.

use brokkr_controller::resources::{
    self, ClusterServiceBroker, ServiceBinding, ServiceBroker, ServiceInstance,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The first schema of `crd`'s only version, as JSON.
fn schema(crd: &CustomResourceDefinition) -> Value {
    assert_eq!(
        crd.spec.versions.len(),
        1,
        "{}",
        crd.metadata.name.as_deref().unwrap_or("")
    );
    let version = &crd.spec.versions[0];
    let schema = version.schema.as_ref().expect("a schema");
    serde_json::to_value(
        schema
            .open_api_v3_schema
            .as_ref()
            .expect("an OpenAPI schema"),
    )
    .unwrap()
}

/// Where `node` breaks the rules of a structural schema: every node has a type (unless it keeps
/// unknown fields), no references, no junctors, arrays have items.
fn structural_errors(path: &str, node: &Value, errors: &mut Vec<String>) {
    let Some(object) = node.as_object() else {
        errors.push(format!("{path}: not a schema object: {node}"));
        return;
    };
    for forbidden in [
        "$ref",
        "$schema",
        "$defs",
        "definitions",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
    ] {
        if object.contains_key(forbidden) {
            errors.push(format!("{path}: has {forbidden}"));
        }
    }
    let preserves = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let Some(kind) = object.get("type").and_then(Value::as_str) else {
        if !preserves && !object.contains_key("x-kubernetes-int-or-string") {
            errors.push(format!("{path}: no type"));
        }
        return;
    };
    match kind {
        "object" => {
            if object.contains_key("properties") && object.contains_key("additionalProperties") {
                errors.push(format!("{path}: both properties and additionalProperties"));
            }
            for (name, child) in object
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                structural_errors(&format!("{path}.{name}"), child, errors);
            }
            if let Some(extra) = object.get("additionalProperties").filter(|v| v.is_object()) {
                structural_errors(&format!("{path}[*]"), extra, errors);
            }
            if !preserves
                && object.get("properties").is_none()
                && object.get("additionalProperties").is_none()
            {
                errors.push(format!(
                    "{path}: an object without properties drops every field"
                ));
            }
        }
        "array" => match object.get("items") {
            Some(items) => structural_errors(&format!("{path}[]"), items, errors),
            None => errors.push(format!("{path}: an array without items")),
        },
        "string" | "integer" | "number" | "boolean" => {}
        other => errors.push(format!("{path}: unknown type {other}")),
    }
}

#[test]
fn every_crd_is_structural_and_served_with_status() {
    let crds = resources::crds();
    assert_eq!(crds.len(), 12);
    for crd in crds.iter().filter(|c| c.spec.group != "servicebinding.io") {
        let name = crd.metadata.name.clone().unwrap();
        assert!(name.ends_with(".services.brokkr.dev"), "{name}");
        assert_eq!(crd.spec.group, "services.brokkr.dev");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage, "{name}");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{name} has no status subresource"
        );
        let mut errors = Vec::new();
        structural_errors(&name, &schema(crd), &mut errors);
        assert!(
            errors.is_empty(),
            "{name} is not structural:\n{}",
            errors.join("\n")
        );
        assert!(
            crd.spec
                .names
                .categories
                .as_deref()
                .unwrap_or_default()
                .contains(&"servicecatalog".to_owned())
        );
    }
}

#[test]
fn servicebinding_io_crds_serve_v1beta1_and_store_v1_with_structural_schemas() {
    let crds: Vec<_> = resources::crds()
        .into_iter()
        .filter(|c| c.spec.group == "servicebinding.io")
        .collect();
    let names: Vec<_> = crds
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "servicebindings.servicebinding.io",
            "clusterworkloadresourcemappings.servicebinding.io"
        ]
    );
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap();
        let versions: Vec<_> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [("v1", true, true), ("v1beta1", true, false)],
            "{name}"
        );
        for version in &crd.spec.versions {
            let schema = serde_json::to_value(
                version
                    .schema
                    .as_ref()
                    .unwrap()
                    .open_api_v3_schema
                    .as_ref()
                    .unwrap(),
            )
            .unwrap();
            let mut errors = Vec::new();
            structural_errors(&name, &schema, &mut errors);
            assert!(
                errors.is_empty(),
                "{name} is not structural:\n{}",
                errors.join("\n")
            );
            let has_status = version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some();
            assert_eq!(
                has_status,
                crd.spec.names.kind == "ServiceBinding",
                "{name}"
            );
        }
    }
}

/// Where `ours` lacks a property of the spec's exemplar schema `theirs`, or types it otherwise.
fn missing_from(path: &str, theirs: &Value, ours: &Value, errors: &mut Vec<String>) {
    if theirs.get("type") != ours.get("type") {
        errors.push(format!(
            "{path}: type {:?} is {:?}",
            theirs.get("type"),
            ours.get("type")
        ));
    }
    for (name, child) in theirs
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        match ours.pointer(&format!("/properties/{name}")) {
            Some(mine) => missing_from(&format!("{path}.{name}"), child, mine, errors),
            None => errors.push(format!("{path}.{name}: missing")),
        }
    }
    if let (Some(items), Some(mine)) = (theirs.get("items"), ours.get("items")) {
        missing_from(&format!("{path}[]"), items, mine, errors);
    }
}

#[test]
fn servicebinding_io_schemas_have_every_field_of_the_spec_exemplars() {
    for (file, kind) in [
        ("servicebinding.io_servicebindings.yaml", "ServiceBinding"),
        (
            "servicebinding.io_clusterworkloadresourcemappings.yaml",
            "ClusterWorkloadResourceMapping",
        ),
    ] {
        let path = format!(
            "{}/tests/servicebinding-spec/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let exemplar: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let ours = resources::crds()
            .into_iter()
            .find(|c| c.spec.names.kind == kind && c.spec.group == "servicebinding.io")
            .unwrap();
        assert_eq!(ours.spec.scope, exemplar.spec.scope, "{kind}");
        assert_eq!(ours.spec.names.plural, exemplar.spec.names.plural, "{kind}");
        let theirs = serde_json::to_value(&exemplar.spec.versions[0].schema).unwrap();
        for version in &ours.spec.versions {
            let mine = serde_json::to_value(&version.schema).unwrap();
            let mut errors = Vec::new();
            // apiVersion, kind and metadata are the API server's.
            for part in ["spec", "status"] {
                let at = format!("/openAPIV3Schema/properties/{part}");
                if let Some(theirs) = theirs.pointer(&at) {
                    let mine = mine.pointer(&at).unwrap_or(&Value::Null);
                    missing_from(&format!("{kind}.{part}"), theirs, mine, &mut errors);
                }
            }
            assert!(
                errors.is_empty(),
                "{kind} {}:\n{}",
                version.name,
                errors.join("\n")
            );
        }
    }
}

#[test]
fn free_form_fields_keep_unknown_fields() {
    let instance = schema(&ServiceInstance::crd());
    let spec = &instance["properties"]["spec"]["properties"];
    assert_eq!(
        spec["parameters"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(spec["parameters"]["type"], "object");
    let plan = schema(&resources::ClusterServicePlan::crd());
    let plan = &plan["properties"]["spec"]["properties"];
    for field in [
        "instanceCreateParameterSchema",
        "instanceUpdateParameterSchema",
        "serviceBindingCreateParameterSchema",
        "externalMetadata",
    ] {
        assert_eq!(
            plan[field]["x-kubernetes-preserve-unknown-fields"], true,
            "{field}"
        );
    }
    // The Service Catalog's spelling of identifiers, not serde's camelCase.
    assert!(plan.get("externalID").is_some());
    assert!(spec.get("clusterServicePlanExternalID").is_some());
    let broker = schema(&ClusterServiceBroker::crd());
    assert!(
        broker["properties"]["spec"]["properties"]
            .get("insecureSkipTLSVerify")
            .is_some()
    );
}

#[test]
fn kubectl_get_shows_class_plan_version_status_and_age() {
    let columns = |crd: CustomResourceDefinition| -> Vec<(String, String)> {
        crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.json_path))
            .collect()
    };
    let instance = ServiceInstance::crd();
    assert_eq!(instance.spec.names.plural, "serviceinstances");
    assert_eq!(instance.spec.names.short_names, Some(vec!["si".to_owned()]));
    assert_eq!(
        columns(instance),
        [
            ("Class", ".status.userSpecifiedClassName"),
            ("Plan", ".status.userSpecifiedPlanName"),
            (
                "Version",
                ".status.externalProperties.maintenanceInfoVersion"
            ),
            ("Status", ".status.lastConditionState"),
            ("Age", ".metadata.creationTimestamp"),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
    let binding: Vec<String> = columns(ServiceBinding::crd())
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(
        binding,
        ["Service-Instance", "Secret-Name", "Status", "Age"]
    );
}

/// Where `value` has a field `schema` does not declare, or a value of another type.
fn fields_outside(path: &str, value: &Value, schema: &Value, errors: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    let matches = match schema["type"].as_str().unwrap_or_default() {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => false,
    };
    if !matches {
        errors.push(format!("{path}: {value} is not of type {}", schema["type"]));
        return;
    }
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                match schema["properties"]
                    .get(name)
                    .or_else(|| schema.get("additionalProperties"))
                {
                    Some(child) => fields_outside(&format!("{path}.{name}"), field, child, errors),
                    None => errors.push(format!("{path}.{name}: not in the schema")),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                fields_outside(&format!("{path}[{i}]"), item, &schema["items"], errors);
            }
        }
        _ => {}
    }
}

/// Whether everything `part` holds is in `whole` with the same value (durations such as `15m0s`
/// and `900s` are the same value).
fn contained(part: &Value, whole: &Value) -> bool {
    let duration = |v: &str| v.parse::<kube::core::Duration>().ok();
    match (part, whole) {
        (Value::String(p), Value::String(w)) if duration(p).is_some() => duration(p) == duration(w),
        (Value::Object(p), Value::Object(w)) => p
            .iter()
            .all(|(k, v)| w.get(k).is_some_and(|x| contained(v, x))),
        (Value::Array(p), Value::Array(w)) => {
            p.len() == w.len() && p.iter().zip(w).all(|(a, b)| contained(a, b))
        }
        _ => part == whole,
    }
}

/// Reads a Service Catalog manifest with only its `apiVersion` changed, checks every field
/// against the CRD's schema and returns it as the Rust type.
fn port<K: kube::CustomResourceExt + Serialize + DeserializeOwned>(file: &str) -> K {
    let path = format!(
        "{}/tests/service-catalog/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let mut manifest: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(manifest["apiVersion"], "servicecatalog.k8s.io/v1beta1");
    manifest["apiVersion"] = "services.brokkr.dev/v1alpha1".into();

    let mut errors = Vec::new();
    let schema = schema(&K::crd());
    for part in ["spec", "status"] {
        if let Some(value) = manifest.get(part) {
            fields_outside(part, value, &schema["properties"][part], &mut errors);
        }
    }
    assert!(
        errors.is_empty(),
        "{file}: the API server would drop or refuse:\n{}",
        errors.join("\n")
    );

    let object: K =
        serde_json::from_value(manifest.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let back = serde_json::to_value(&object).unwrap();
    assert!(
        contained(&manifest, &back),
        "{file}: lost in a round trip:\n{manifest:#}\nbecame\n{back:#}"
    );
    object
}

#[test]
fn service_catalog_instances_port_by_changing_api_version() {
    let instance: ServiceInstance = port("instance.yaml");
    assert_eq!(
        instance.spec.cluster_service_class_external_name.as_deref(),
        Some("postgresql")
    );
    assert_eq!(
        instance.spec.cluster_service_plan_external_name.as_deref(),
        Some("small")
    );
    assert_eq!(
        instance.spec.external_id.as_deref(),
        Some("1a9c7f0e-5b1d-4c8e-9a52-6f3f1e0c2d7b")
    );
    assert_eq!(
        instance.spec.parameters_from[0]
            .secret_key_ref
            .as_ref()
            .unwrap()
            .key,
        "parameters"
    );
    assert_eq!(
        instance.spec.user_info.as_ref().unwrap().extra["scopes"],
        ["read", "write"]
    );

    let by_id: ServiceInstance = port("instance-by-id.yaml");
    assert_eq!(
        by_id.spec.service_plan_ref.unwrap().name,
        "86064792-7ea2-467b-af93-ac9694d96d52"
    );
}

#[test]
fn service_catalog_bindings_port_by_changing_api_version() {
    let binding: ServiceBinding = port("binding.yaml");
    assert_eq!(binding.spec.instance_ref.name, "mydb");
    assert_eq!(
        binding.spec.secret_name.as_deref(),
        Some("mydb-credentials")
    );
    assert_eq!(binding.spec.secret_transforms.len(), 6);
    assert_eq!(
        binding.spec.secret_transforms[0]
            .rename_key
            .as_ref()
            .unwrap()
            .to,
        "DATABASE_URL"
    );
}

#[test]
fn service_catalog_brokers_port_by_changing_api_version() {
    let cluster: ClusterServiceBroker = port("cluster-broker.yaml");
    assert_eq!(
        cluster.spec.common.url,
        "https://brokkr.brokkr-system.svc:8443"
    );
    let secret = cluster.spec.auth_info.unwrap().basic.unwrap().secret_ref;
    assert_eq!(secret.namespace.as_deref(), Some("brokkr-system"));
    assert_eq!(
        cluster
            .spec
            .common
            .relist_duration
            .map(std::time::Duration::from),
        Some(std::time::Duration::from_secs(15 * 60))
    );
    let namespaced: ServiceBroker = port("broker.yaml");
    assert_eq!(
        namespaced
            .spec
            .auth_info
            .unwrap()
            .bearer
            .unwrap()
            .secret_ref
            .name,
        "team-broker-token"
    );
}
