//! Micro-benchmarks of template rendering and registry evaluation, the CPU work brokkr does per
//! operation of a templated plan: rendering a blueprint-like tree of ten Kubernetes resources, and
//! evaluating an instance's registry (passwords, names, derived values) and a binding's
//! credentials. Run with `cargo bench -p brokkr-blueprint`.

use std::hint::black_box;

use brokkr_blueprint::RegistryEntry;
use brokkr_blueprint::evaluate::{Evaluator, Subject};
use brokkr_blueprint::template::Renderer;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

/// One resource of the tree: a Deployment-like object whose leaves use parameters, registry
/// values and filters.
fn resource(i: usize) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": format!("{{{{ instance_id }}}}-part{i}"),
            "labels": {
                "app.kubernetes.io/instance": "{{ instance_id }}",
                "app.kubernetes.io/name": "{{ registry.name }}",
                "brokkr.dev/plan": "{{ plan_id }}"
            }
        },
        "spec": {
            "replicas": "{{ parameters.replicas }}",
            "template": {
                "spec": {
                    "containers": [{
                        "name": "server",
                        "image": "postgres:{{ parameters.version }}",
                        "resources": {"limits": {"memory": "{{ parameters.memory }}"}},
                        "env": [
                            {"name": "POSTGRES_USER", "value": "{{ registry.username }}"},
                            {"name": "POSTGRES_PASSWORD", "value": "{{ registry.password }}"},
                            {"name": "POSTGRES_DB", "value": "{{ parameters.database | lower }}"},
                            {"name": "CHECKSUM", "value": "{{ registry.password | sha256 }}"},
                            {"name": "CONFIG", "value": "{{ parameters | tojson | b64encode }}"}
                        ]
                    }]
                }
            }
        }
    })
}

fn context() -> Value {
    json!({
        "instance_id": "7b7c7c1b-0365-4361-9101-0c7cf2d2a9dc",
        "binding_id": null,
        "service_id": "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10",
        "plan_id": "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21",
        "parameters": {"replicas": 3, "version": "17", "memory": "512Mi", "database": "Orders"},
        "context": {"platform": "kubernetes", "namespace": "shop"},
        "instance": {"id": "7b7c7c1b-0365-4361-9101-0c7cf2d2a9dc", "parameters": {}, "context": {}},
        "registry": {"name": "orders-db", "username": "u_orders", "password": "s3cret-s3cret-s3cret"}
    })
}

fn registry_entries() -> Vec<RegistryEntry> {
    let entry = |name: &str, value: Value| RegistryEntry {
        name: name.into(),
        value,
        secret: false,
    };
    vec![
        entry("name", json!("{{ pet_name(2) }}")),
        entry("username", json!("u_{{ registry.name | lower }}")),
        entry("password", json!("{{ password(32) }}")),
        entry(
            "host",
            json!("{{ registry.name }}.{{ context.namespace }}.svc"),
        ),
        entry("port", json!("{{ parameters.port }}")),
        entry(
            "uri",
            json!(
                "postgresql://{{ registry.username }}:{{ registry.password }}@{{ registry.host }}:{{ registry.port }}/{{ parameters.database }}"
            ),
        ),
    ]
}

fn benches(c: &mut Criterion) {
    let renderer = Renderer::with_seed(7);
    let tree = Value::Array((0..10).map(resource).collect());
    renderer.check(&tree).expect("the tree parses");
    let ctx = context();
    // The baseline: copying the same tree, what any renderer must at least do.
    c.bench_function("baseline/copy 10 resources", |b| {
        b.iter(|| black_box(&tree).clone())
    });
    c.bench_function("template/render 10 resources", |b| {
        b.iter(|| {
            renderer
                .render(black_box(&tree), black_box(&ctx))
                .expect("renders")
        })
    });

    let evaluator = Evaluator::new(Renderer::with_seed(7), Value::Null);
    let entries = registry_entries();
    let parameters = json!({"port": 5432, "database": "orders"});
    let context = json!({"namespace": "shop"});
    let nothing = serde_json::Map::new();
    let instance = Subject {
        id: "7b7c7c1b-0365-4361-9101-0c7cf2d2a9dc",
        service_id: "3b5f3c0e-6f7d-4d0c-9a59-7a4c1f6b2e10",
        plan_id: "8d2c7e4a-5b1f-4f6e-8a3d-2c9b0e7f1a21",
        parameters: parameters.as_object(),
        context: context.as_object(),
        registry: &nothing,
    };
    c.bench_function("evaluate/registry 6 entries", |b| {
        b.iter(|| {
            evaluator
                .registry(black_box(&entries), &instance, None)
                .expect("evaluates")
        })
    });

    let registry = evaluator
        .registry(&entries, &instance, None)
        .expect("evaluates");
    let instance = Subject {
        registry: &registry,
        ..instance
    };
    let binding_parameters = json!({"credentials": {"username": "checkout"}});
    let binding = Subject {
        id: "checkout",
        parameters: binding_parameters.as_object(),
        registry: &registry,
        ..instance
    };
    let template = json!({
        "type": "postgresql",
        "provider": "brokkr",
        "host": "{{ registry.host }}",
        "port": "{{ registry.port }}",
        "database": "{{ instance.parameters.database }}",
        "username": "{{ parameters.credentials.username }}",
        "password": "{{ registry.password }}",
        "uri": "{{ registry.uri }}"
    });
    c.bench_function("evaluate/credentials", |b| {
        b.iter(|| {
            evaluator
                .credentials(black_box(&template), &instance, &binding)
                .expect("evaluates")
        })
    });
}

criterion_group!(render, benches);
criterion_main!(render);
