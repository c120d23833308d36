//! Checks of `catalog:`: required fields, unique ids and names, maintenance versions and
//! parameter schemas.

use std::collections::HashSet;

use brokkr_osb::Service;

use crate::schema::ParameterSchema;

use super::validator::Validator;

impl Validator {
    /// Checks every service offering and plan; ids are unique across the catalog, plan names
    /// within their service.
    pub(super) fn check_catalog(&mut self, services: &[(String, usize, Service)]) {
        let mut service_ids = HashSet::new();
        let mut service_names = HashSet::new();
        let mut plan_ids = HashSet::new();
        for (file, i, s) in services {
            let at = format!("catalog.services[{i}]");
            for (field, value) in [
                ("id", &s.id),
                ("name", &s.name),
                ("description", &s.description),
            ] {
                if value.trim().is_empty() {
                    self.error(file, format!("{at}.{field}"), "must be a non-empty string");
                }
            }
            if !service_ids.insert(&s.id) {
                self.error(
                    file,
                    format!("{at}.id"),
                    format!("duplicate service id {:?}", s.id),
                );
            }
            if !service_names.insert(&s.name) {
                self.error(
                    file,
                    format!("{at}.name"),
                    format!("duplicate service name {:?}", s.name),
                );
            }
            if s.plans.is_empty() {
                self.error(
                    file,
                    format!("{at}.plans"),
                    "a service needs at least one plan",
                );
            }
            let mut plan_names = HashSet::new();
            for (j, p) in s.plans.iter().enumerate() {
                let at = format!("{at}.plans[{j}]");
                for (field, value) in [
                    ("id", &p.id),
                    ("name", &p.name),
                    ("description", &p.description),
                ] {
                    if value.trim().is_empty() {
                        self.error(file, format!("{at}.{field}"), "must be a non-empty string");
                    }
                }
                if !plan_ids.insert(&p.id) {
                    self.error(
                        file,
                        format!("{at}.id"),
                        format!("duplicate plan id {:?}", p.id),
                    );
                }
                if !plan_names.insert(&p.name) {
                    self.error(
                        file,
                        format!("{at}.name"),
                        format!("duplicate plan name {:?}", p.name),
                    );
                }
                if let Some(mi) = &p.maintenance_info
                    && semver::Version::parse(&mi.version).is_err()
                {
                    self.error(
                        file,
                        format!("{at}.maintenance_info.version"),
                        "must be a semantic version 2.0 string, like 1.2.3",
                    );
                }
                let schemas = [
                    ("service_instance.create", p.instance_create_schema()),
                    ("service_instance.update", p.instance_update_schema()),
                    ("service_binding.create", p.binding_create_schema()),
                ];
                for (name, schema) in schemas {
                    if let Some(Err(e)) = schema.map(ParameterSchema::compile) {
                        self.error(file, format!("{at}.schemas.{name}.parameters"), e);
                    }
                }
            }
        }
    }
}
