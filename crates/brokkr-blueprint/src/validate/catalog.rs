//! Checks of `catalog:`: known keys only (with a "did you mean" for near misses), required
//! fields, unique ids and names, maintenance versions and parameter schemas.

use std::collections::HashSet;

use brokkr_osb::catalog::{BindingSchemas, InputParameters, InstanceSchemas};
use brokkr_osb::{MaintenanceInfo, Plan, Schemas, Service};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::schema::ParameterSchema;

use super::Validator;

impl Validator {
    /// Reports `key` (a path below `catalog.services`, `[0].plans[1].fre`), a key that is not a
    /// field of the OSB catalog, with the nearest field of its object when one is close.
    pub(super) fn unknown_catalog_key(&mut self, file: &str, key: &str) {
        let (parent, name) = key.rsplit_once('.').unwrap_or(("", key));
        // The object's kind, from the field names along its path (indices dropped).
        let shape: Vec<&str> = parent
            .split('.')
            .map(|part| part.split('[').next().unwrap_or_default())
            .filter(|part| !part.is_empty())
            .collect();
        let fields = match shape.as_slice() {
            [] => field_names::<Service>(),
            ["plans"] => field_names::<Plan>(),
            ["plans", "schemas"] => field_names::<Schemas>(),
            ["plans", "schemas", "service_instance"] => field_names::<InstanceSchemas>(),
            ["plans", "schemas", "service_binding"] => field_names::<BindingSchemas>(),
            ["plans", "schemas", _, _] => field_names::<InputParameters>(),
            ["plans", "maintenance_info"] => field_names::<MaintenanceInfo>(),
            _ => &[],
        };
        let nearest = fields
            .iter()
            .map(|f| (strsim::damerau_levenshtein(name, f), *f))
            .filter(|(distance, f)| *distance <= 2.max(f.len() / 4))
            .min();
        let message = match nearest {
            Some((_, f)) => format!("unknown field `{name}`; did you mean `{f}`?"),
            None if fields.is_empty() => format!("unknown field `{name}`"),
            None => format!(
                "unknown field `{name}`; expected one of {}",
                fields
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        self.error(file, format!("catalog.services{key}"), message);
    }

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

/// The field names `T`'s derived `Deserialize` asks for, read by a deserializer that only
/// listens (so the lists of known keys never drift from the OSB types).
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Listener<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Listener<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only structs are listened to"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("heard"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Listener(&mut fields));
    fields
}
