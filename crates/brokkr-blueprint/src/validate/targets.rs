//! Checks of `targets:`: names, and the fields each kind of target takes.

use crate::config::{NamespacePolicy, TargetConfig, TargetKind};

use super::validator::Validator;

impl Validator {
    /// Checks a target's name and the fields its kind allows.
    pub(super) fn check_target(&mut self, file: &str, name: &str, target: &TargetConfig) {
        let at = format!("targets.{name}");
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.error(file, &at, "a target name is letters, digits, `-` and `_`");
        }
        if target.kind == TargetKind::Kubernetes {
            let fields = [
                ("url_env", target.url_env.is_some()),
                ("url_file", target.url_file.is_some()),
                ("host", target.host.is_some()),
                ("port", target.port.is_some()),
            ];
            self.refuse_fields(file, &at, &fields, |_| {
                "a kubernetes target has no admin URL, host or port; it reaches the cluster \
                 through `kubeconfig` (or in-cluster configuration)"
                    .into()
            });
            if let Some(NamespacePolicy::Fixed(ns)) = &target.namespace
                && !is_dns_label(ns)
            {
                self.error(
                    file,
                    format!("{at}.namespace.fixed"),
                    "a namespace name is a DNS label: lowercase letters, digits and `-`, at most 63",
                );
            }
            self.refuse_local_fields(file, &at, target);
            return;
        }
        if target.kind == TargetKind::Local {
            let fields = [
                ("url_env", target.url_env.is_some()),
                ("url_file", target.url_file.is_some()),
                ("host", target.host.is_some()),
                ("port", target.port.is_some()),
                ("kubeconfig", target.kubeconfig.is_some()),
                ("context", target.context.is_some()),
                ("namespace", target.namespace.is_some()),
                ("pvc_policy", target.pvc_policy.is_some()),
                ("timeout", target.timeout.is_some()),
            ];
            self.refuse_fields(file, &at, &fields, |_| {
                "a local target runs its servers itself, on loopback ports it picks; it takes \
                 `root`, `keep_running` and `run_as`"
                    .into()
            });
            return;
        }
        self.refuse_local_fields(file, &at, target);
        let fields = [
            ("kubeconfig", target.kubeconfig.is_some()),
            ("context", target.context.is_some()),
            ("namespace", target.namespace.is_some()),
            ("pvc_policy", target.pvc_policy.is_some()),
        ];
        let kind = target.kind.as_str();
        self.refuse_fields(file, &at, &fields, |field| {
            format!("only a kubernetes target has `{field}` (this one is {kind})")
        });
        if target.url_env.is_some() && target.url_file.is_some() {
            self.error(
                file,
                &at,
                "give the admin URL once: `url_env` or `url_file`, not both",
            );
        }
        if target.servers_per_step() {
            let fields = [
                ("host", target.host.is_some()),
                ("port", target.port.is_some()),
            ];
            self.refuse_fields(file, &at, &fields, |_| {
                "a target without an admin URL administers the servers its steps name \
                 (`server:`); give bindings their host and port in the credentials"
                    .into()
            });
        }
        if target.port == Some(0) {
            self.error(file, format!("{at}.port"), "must be 1-65535");
        }
    }

    /// Reports each field only a `local` target takes that `target` (of another kind) sets.
    fn refuse_local_fields(&mut self, file: &str, at: &str, target: &TargetConfig) {
        let fields = [
            ("root", target.root.is_some()),
            ("keep_running", target.keep_running.is_some()),
            ("run_as", target.run_as.is_some()),
        ];
        let kind = target.kind.as_str();
        self.refuse_fields(file, at, &fields, |field| {
            format!("only a local target has `{field}` (this one is {kind})")
        });
    }

    /// Reports each of `fields` (name, whether it is set) that is set at `at`.
    fn refuse_fields(
        &mut self,
        file: &str,
        at: &str,
        fields: &[(&str, bool)],
        message: impl Fn(&str) -> String,
    ) {
        for (field, _) in fields.iter().filter(|(_, set)| *set) {
            self.error(file, format!("{at}.{field}"), message(field));
        }
    }
}

/// Whether `name` is a DNS label (a Kubernetes namespace name).
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}
