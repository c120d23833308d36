//! Validation: everything about a configuration that can be known before a request, reported all
//! at once, each problem with its file, field and position.
//!
//! [`validate`] merges the parsed files (a name defined twice is an error) and checks, in turn:
//! the targets ([`targets`]), the catalog ([`catalog`]), the templates, and each blueprint against
//! its plan ([`blueprint`]: registries and the keys templates read; [`steps`]: step actions,
//! targets, templates and their extra fields), each recording its problems on the
//! [`Validator`](validator::Validator). A configuration without errors becomes the [`Config`]
//! index.

mod blueprint;
mod catalog;
mod steps;
mod targets;
mod validator;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use brokkr_osb::{Catalog, Service};
use serde_json::Value;

use crate::config::{Blueprint, BrokerConfig, File, TargetConfig};
use crate::error::ConfigErrors;
use crate::index::{Config, plan_entry};
use crate::span::SourceMap;
use crate::template::Renderer;
use steps::Names;
use validator::Validator;

/// Checks parsed `files` (with their source `maps`, for positions) and builds the index.
pub(crate) fn validate(
    files: Vec<(String, File)>,
    maps: HashMap<String, SourceMap>,
) -> Result<Config, ConfigErrors> {
    Validator::new(maps).run(files)
}

impl Validator {
    fn run(mut self, files: Vec<(String, File)>) -> Result<Config, ConfigErrors> {
        let mut broker: Option<(String, BrokerConfig)> = None;
        let mut store: Option<(String, String)> = None;
        let mut services: Vec<(String, usize, Service)> = Vec::new();
        let mut blueprints: Vec<(String, usize, Blueprint)> = Vec::new();
        let mut targets: BTreeMap<String, (String, TargetConfig)> = BTreeMap::new();
        let mut templates: BTreeMap<String, (String, Value)> = BTreeMap::new();
        for (name, file) in files {
            for (t, target) in file.targets {
                if let Some((first, _)) = targets.get(&t) {
                    let message = format!("target {t:?} is already defined in {first}");
                    self.error(&name, format!("targets.{t}"), message);
                } else {
                    self.check_target(&name, &t, &target);
                    targets.insert(t, (name.clone(), target));
                }
            }
            for (t, tree) in file.templates {
                if let Some((first, _)) = templates.get(&t) {
                    let message = format!("template {t:?} is already defined in {first}");
                    self.error(&name, format!("templates.{t}"), message);
                } else {
                    templates.insert(t, (name.clone(), tree));
                }
            }
            if let Some(b) = file.broker {
                match &broker {
                    Some((first, _)) => {
                        self.error(&name, "broker", format!("already defined in {first}"))
                    }
                    None => broker = Some((name.clone(), b)),
                }
            }
            if let Some(s) = file.store {
                match &store {
                    Some((first, _)) => {
                        self.error(&name, "store", format!("already defined in {first}"))
                    }
                    None => store = Some((name.clone(), s)),
                }
            }
            let offerings = file.catalog.unwrap_or_default().services;
            for (i, s) in offerings.into_iter().enumerate() {
                services.push((name.clone(), i, s));
            }
            for (i, b) in file.blueprints.into_iter().enumerate() {
                blueprints.push((name.clone(), i, b));
            }
        }
        if let Some((file, b)) = &broker
            && let Some(listen) = &b.listen
            && listen.parse::<std::net::SocketAddr>().is_err()
        {
            self.error(
                file,
                "broker.listen",
                "must be an address like 127.0.0.1:8080",
            );
        }

        self.check_catalog(&services);
        let renderer = Renderer::new();
        for (t, (file, tree)) in &templates {
            if let Err(e) = renderer.check(tree) {
                self.template_error(file, &format!("templates.{t}"), tree, &e);
            }
        }
        let target_configs: HashMap<String, TargetConfig> = targets
            .iter()
            .map(|(name, (_, target))| (name.clone(), target.clone()))
            .collect();
        self.template_files = templates
            .iter()
            .map(|(name, (file, _))| (name.clone(), file.clone()))
            .collect();
        let template_trees: HashMap<String, Value> = templates
            .into_iter()
            .map(|(name, (_, tree))| (name, tree))
            .collect();
        let names = Names {
            targets: &target_configs,
            templates: &template_trees,
        };
        let mut plans = HashMap::new();
        let mut seen = HashSet::new();
        // Plans whose blueprint has a `rotation`: served with `binding_rotatable: true`.
        let mut rotatable = HashSet::new();
        for (file, i, mut blueprint) in blueprints {
            let field = format!("blueprints[{i}]");
            let found = services.iter().find_map(|(_, _, s)| {
                (s.name == blueprint.service)
                    .then(|| {
                        s.plans
                            .iter()
                            .find(|p| p.name == blueprint.plan)
                            .map(|p| (s, p))
                    })
                    .flatten()
            });
            let Some((service, plan)) = found else {
                self.error(
                    &file,
                    &field,
                    format!(
                        "no plan {:?} of service {:?} in the catalog",
                        blueprint.plan, blueprint.service
                    ),
                );
                continue;
            };
            if !seen.insert((service.id.clone(), plan.id.clone())) {
                self.error(
                    &file,
                    &field,
                    format!(
                        "plan {:?} of service {:?} already has a blueprint",
                        plan.name, service.name
                    ),
                );
                continue;
            }
            self.check_blueprint(
                &file,
                &field,
                &mut blueprint,
                plan.is_bindable(service),
                &renderer,
                &names,
            );
            let mut plan = plan.clone();
            let rotates = blueprint
                .binding
                .as_ref()
                .is_some_and(|b| b.rotation.is_some());
            if rotates {
                if plan.binding_rotatable == Some(false) {
                    self.error(
                        &file,
                        format!("{field}.binding.rotation"),
                        format!(
                            "plan {:?} says `binding_rotatable: false` in the catalog; remove one of the two",
                            plan.name
                        ),
                    );
                }
                plan.binding_rotatable = Some(true);
                rotatable.insert(plan.id.clone());
            }
            let entry = plan_entry(service, &plan, blueprint);
            plans.insert((service.id.clone(), plan.id.clone()), Arc::new(entry));
        }
        for (file, i, service) in &services {
            for (j, plan) in service.plans.iter().enumerate() {
                if !seen.contains(&(service.id.clone(), plan.id.clone())) {
                    self.error(
                        file,
                        format!("catalog.services[{i}].plans[{j}]"),
                        format!(
                            "plan {:?} of service {:?} has no blueprint",
                            plan.name, service.name
                        ),
                    );
                }
            }
        }
        if !self.errors.is_empty() {
            return Err(ConfigErrors(self.errors));
        }
        let mut services: Vec<Service> = services.into_iter().map(|(_, _, s)| s).collect();
        for plan in services.iter_mut().flat_map(|s| s.plans.iter_mut()) {
            if rotatable.contains(&plan.id) {
                plan.binding_rotatable = Some(true);
            }
        }
        let catalog = Catalog { services };
        let catalog_json = serde_json::to_vec(&catalog)
            .expect("a catalog always serializes")
            .into();
        Ok(Config {
            broker: broker.map(|(_, b)| b).unwrap_or_default(),
            store: store.map(|(_, s)| s),
            catalog,
            targets: targets.into_iter().map(|(n, (_, t))| (n, t)).collect(),
            catalog_json,
            plans,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Phase;
    use crate::load::load_str;

    fn errors(yaml: &str) -> Vec<String> {
        load_str("broken.yaml", yaml)
            .unwrap_err()
            .0
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_plan_needs_exactly_one_matching_blueprint() {
        let base = "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: true,\n     plans: [{name: p, id: p1, description: d}, {name: q, id: q1, description: d}]}\n";
        let errs = errors(&format!(
            "{base}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}}}}}\n- {{service: s, plan: p}}\n- {{service: s, plan: nope}}\n"
        ));
        assert!(
            errs.iter().any(|e| e
                .contains("blueprints[1]: plan \"p\" of service \"s\" already has a blueprint")),
            "{errs:#?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("blueprints[2]: no plan \"nope\"")),
            "{errs:#?}"
        );
        assert!(
            errs.iter().any(|e| e.contains(
                "catalog.services[0].plans[1]: plan \"q\" of service \"s\" has no blueprint"
            )),
            "{errs:#?}"
        );
    }

    #[test]
    fn catalog_rules_are_enforced() {
        let errs = errors(
            "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: false, plans: [\n      {name: p, id: p1, description: d, maintenance_info: {version: one},\n       schemas: {service_instance: {create: {parameters: {type: object}}}}}]}\n  - {name: s, id: s1, description: '', bindable: false, plans: []}\nblueprints:\n- {service: s, plan: p, binding: {credentials: {}}, instance: {steps: [{name: a}, {name: a, delay: 1s, on: [bind]}]}}\n",
        );
        for expected in [
            "maintenance_info.version: must be a semantic version",
            "schemas.service_instance.create.parameters: a schema must declare its draft",
            "catalog.services[1].id: duplicate service id",
            "catalog.services[1].description: must be a non-empty string",
            "catalog.services[1].plans: a service needs at least one plan",
            "blueprints[0].binding: the plan is not bindable",
            "instance.steps[0]: a step needs an action",
            "instance.steps[1].name: duplicate step name",
            "instance.steps[1].on: `bind` is not one of provision, update, upgrade, deprovision",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected}\n{errs:#?}"
            );
        }
    }

    #[test]
    fn upgrade_steps_run_only_in_an_upgrade_of_an_instance() {
        let catalog = "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: true,\n     plans: [{name: p, id: p1, description: d, maintenance_info: {version: 1.0.0}}]}\n";
        let steps = "[{name: build, delay: 1s}, {name: migrate, delay: 1s, on: [upgrade]}, {name: tune, delay: 1s, on: [update]}]";
        let yaml = format!(
            "{catalog}blueprints:\n- {{service: s, plan: p, instance: {{steps: {steps}}}, binding: {{credentials: {{type: x}}}}}}\n"
        );
        let config = load_str("fine.yaml", &yaml).unwrap();
        let entry = config.plan("s1", "p1").unwrap();
        let names = |phase| -> Vec<String> {
            (entry.instance_steps(phase).into_iter())
                .map(|s| s.name)
                .collect()
        };
        assert_eq!(names(Phase::Provision), ["build"]);
        assert_eq!(names(Phase::Update), ["build", "tune"]);
        assert_eq!(names(Phase::Upgrade), ["build", "migrate", "tune"]);

        let yaml = format!(
            "{catalog}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}, steps: [{{name: g, delay: 1s, on: [upgrade]}}]}}}}\n"
        );
        let errs = errors(&yaml);
        let expected = "binding.steps[0].on: `upgrade` is not one of bind, unbind";
        assert!(errs.iter().any(|e| e.contains(expected)), "{errs:#?}");
    }

    #[test]
    fn revoking_expired_bindings_needs_a_lifetime() {
        let catalog = "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: true,\n     plans: [{name: p, id: p1, description: d}]}\n";
        let blueprint = |rotation: &str| {
            format!(
                "{catalog}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}, rotation: {rotation}}}}}\n"
            )
        };
        let config = load_str(
            "fine.yaml",
            &blueprint("{lifetime: 1h, revoke_expired: true}"),
        )
        .unwrap();
        let entry = config.plan("s1", "p1").unwrap();
        let rotation = entry.blueprint.binding.as_ref().unwrap().rotation.as_ref();
        assert!(rotation.unwrap().revoke_expired);
        let errs = errors(&blueprint("{revoke_expired: true}"));
        assert!(
            errs.iter()
                .any(|e| e
                    .contains("blueprints[0].binding.rotation.revoke_expired: needs `lifetime`")),
            "{errs:#?}"
        );
    }

    #[test]
    fn a_rotation_makes_the_plan_rotatable_and_its_durations_are_checked() {
        let catalog = "catalog:\n  services:\n  - {name: s, id: s1, description: d, bindable: true,\n     plans: [{name: p, id: p1, description: d}, {name: q, id: q1, description: d, binding_rotatable: false}]}\n";
        let yaml = format!(
            "{catalog}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}, rotation: {{lifetime: 30d, renew_before: 7d}}}}}}\n- {{service: s, plan: q, binding: {{credentials: {{type: x}}}}}}\n"
        );
        let config = load_str("fine.yaml", &yaml).unwrap();
        let plans = &config.catalog.services[0].plans;
        assert_eq!(
            plans[0].binding_rotatable,
            Some(true),
            "served as rotatable"
        );
        assert_eq!(plans[1].binding_rotatable, Some(false), "served as written");
        let catalog_json: serde_json::Value =
            serde_json::from_slice(&config.catalog_json()).unwrap();
        assert_eq!(
            catalog_json["services"][0]["plans"][0]["binding_rotatable"],
            true
        );
        let entry = config.plan("s1", "p1").unwrap();
        assert_eq!(entry.plan.binding_rotatable, Some(true));

        let errs = errors(&format!(
            "{catalog}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}, rotation: {{renew_before: 1h}}}}}}\n- {{service: s, plan: q, binding: {{credentials: {{type: x}}, rotation: {{lifetime: 1h, renew_before: 2h}}}}}}\n"
        ));
        for expected in [
            "blueprints[0].binding.rotation.renew_before: needs `lifetime`",
            "blueprints[1].binding.rotation.renew_before: must be shorter than `lifetime` (1h)",
            "blueprints[1].binding.rotation: plan \"q\" says `binding_rotatable: false` in the catalog",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected}\n{errs:#?}"
            );
        }
        let errs = errors(&format!(
            "{catalog}blueprints:\n- {{service: s, plan: p, binding: {{credentials: {{type: x}}, rotation: {{lifetme: 1h}}}}}}\n- {{service: s, plan: q, binding: {{credentials: {{type: x}}}}}}\n"
        ));
        assert!(
            errs.iter().any(|e| e
                .contains("rotation.lifetme: unknown field `lifetme`; did you mean `lifetime`?")),
            "{errs:#?}"
        );
    }

    #[test]
    fn kubernetes_targets_and_their_step_fields_are_checked() {
        let yaml = r#"
targets:
  cluster: {kind: kubernetes, url_env: X, namespace: {fixed: Team_A}}
  pg: {kind: postgres, url_env: PG, namespace: per-instance}
catalog:
  services:
  - {name: s, id: s1, description: d, bindable: true, plans: [{name: p, id: p1, description: d}]}
blueprints:
- service: s
  plan: p
  instance:
    steps:
    - {name: a, run: noop, readiness: [{kind: Pod}]}
    - name: b
      target: cluster
      read: [{apiVersion: v1, kind: Secret, name: x, values: {password: /data/password}}]
      outputs: [username]
    - {name: c, target: cluster, secret: {name: x}}
  binding:
    steps:
    - {name: s, target: cluster, secret: {}}
    credentials: {type: t}
"#;
        let errs = errors(yaml);
        for expected in [
            "targets.cluster.url_env: a kubernetes target has no admin URL",
            "targets.cluster.namespace.fixed: a namespace name is a DNS label",
            "targets.pg.namespace: only a kubernetes target has `namespace` (this one is postgres)",
            "instance.steps[0].readiness: `readiness` belongs to a `target` step",
            "instance.steps[1].read[0].values.password: \"password\" is read but not declared",
            "instance.steps[2].secret: only a binding's steps publish credentials",
            "binding.steps[0].secret: needs `name`",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected}\n{errs:#?}"
            );
        }
        let fine = r#"
targets:
  cluster: {kind: kubernetes, namespace: per-instance, pvc_policy: retain}
catalog:
  services:
  - {name: s, id: s1, description: d, bindable: true, plans: [{name: p, id: p1, description: d}]}
blueprints:
- service: s
  plan: p
  instance:
    steps:
    - name: db
      target: cluster
      templates: [{apiVersion: v1, kind: ConfigMap, metadata: {name: x}}]
      readiness: [{apiVersion: v1, kind: ConfigMap, name: x, jsonpath: "{.data.a}", equals: "1"}]
      read: [{apiVersion: v1, kind: ConfigMap, name: x, values: {a: /data/a}}]
      outputs: [a]
  binding:
    steps:
    - {name: s, target: cluster, secret: {name: "b-{{ binding_id }}"}}
    credentials: {type: t, value: "{{ registry('a') }}"}
"#;
        load_str("fine.yaml", fine).unwrap();
    }
}
