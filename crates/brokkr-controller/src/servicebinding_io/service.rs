//! The binding's service: the Secret a Provisioned Service names, and whether the API server
//! serves a kind.

use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::Value;

use crate::context::Context;
use crate::resources::servicebinding_io::ServiceBinding;
use crate::workloads::Error;

/// The Secret of the binding's service, or why there is none yet: (reason, message).
pub(super) async fn service_secret(
    binding: &ServiceBinding,
    ctx: &Context,
    namespace: &str,
) -> Result<Result<String, (&'static str, String)>, Error> {
    let service = &binding.spec.service;
    if service.api_version == "v1" && service.kind == "Secret" {
        return Ok(Ok(service.name.clone()));
    }
    let gvk = gvk(&service.api_version, &service.kind);
    let Some(resource) = served(ctx, &gvk).await? else {
        return Ok(Err((
            "ServiceNotFound",
            format!("{} {} is not served", service.api_version, service.kind),
        )));
    };
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &resource);
    let Some(object) = api.get_opt(&service.name).await? else {
        return Ok(Err((
            "ServiceNotFound",
            format!("{} {} does not exist", service.kind, service.name),
        )));
    };
    Ok(
        match object
            .data
            .pointer("/status/binding/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            Some(name) => Ok(name.to_owned()),
            None => Err((
                "ServiceMissingBinding",
                format!(
                    "{} {} has no .status.binding.name yet",
                    service.kind, service.name
                ),
            )),
        },
    )
}

pub(super) fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// The API resource of `gvk`, if the cluster serves it; its objects are watched from then on,
/// so that a change to one wakes the bindings that name it.
pub(super) async fn served(
    ctx: &Context,
    gvk: &GroupVersionKind,
) -> Result<Option<ApiResource>, Error> {
    let resource = ctx.workloads.resource(&ctx.client, gvk).await?;
    if let Some(resource) = &resource {
        ctx.workloads.watch(&ctx.client, &ctx.scope, resource);
    }
    Ok(resource)
}
