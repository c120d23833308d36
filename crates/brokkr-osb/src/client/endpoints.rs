//! The broker's endpoints, a typed call each: the catalog, provisioning, updating and
//! deprovisioning an instance, binding and unbinding, fetching an instance or a binding, and one
//! poll of `last_operation`.

use reqwest::{Method, StatusCode};

use super::error::Error;
use super::exchange::{Client, Kind, Response};
use super::request_target::{PlanRef, Poll, binding_path, incomplete, instance_path, with_plan};
use crate::catalog::Catalog;
use crate::messages::{
    AsyncResponse, BindRequest, BindResponse, BindingResource, InstanceOperationResponse,
    InstanceResource, LastOperation, ProvisionRequest, UpdateRequest,
};

impl Client {
    /// `GET /v2/catalog`.
    pub async fn catalog(&self) -> Result<Response<Catalog>, Error> {
        self.call(
            Method::GET,
            "/v2/catalog",
            &[],
            None::<&()>,
            &[StatusCode::OK],
            Kind::Catalog,
        )
        .await
    }

    /// `PUT /v2/service_instances/:instance_id`: 201 created, 200 already there, 202 accepted.
    pub async fn provision(
        &self,
        instance_id: &str,
        request: &ProvisionRequest,
        accepts_incomplete: bool,
    ) -> Result<Response<InstanceOperationResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::CREATED, StatusCode::ACCEPTED];
        let query = incomplete(accepts_incomplete);
        self.call(
            Method::PUT,
            &instance_path(instance_id),
            &query,
            Some(request),
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `PATCH /v2/service_instances/:instance_id`: 200 done, 202 accepted.
    pub async fn update(
        &self,
        instance_id: &str,
        request: &UpdateRequest,
        accepts_incomplete: bool,
    ) -> Result<Response<InstanceOperationResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::ACCEPTED];
        let query = incomplete(accepts_incomplete);
        self.call(
            Method::PATCH,
            &instance_path(instance_id),
            &query,
            Some(request),
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `DELETE /v2/service_instances/:instance_id`: 200 deleted, 202 accepted, 410 gone (which
    /// a platform takes as deleted).
    pub async fn deprovision(
        &self,
        instance_id: &str,
        plan: &PlanRef,
        accepts_incomplete: bool,
    ) -> Result<Response<AsyncResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::GONE];
        let query = with_plan(incomplete(accepts_incomplete), Some(plan));
        self.call(
            Method::DELETE,
            &instance_path(instance_id),
            &query,
            None::<&()>,
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `PUT …/service_bindings/:binding_id`: 201 created, 200 already there, 202 accepted.
    pub async fn bind(
        &self,
        instance_id: &str,
        binding_id: &str,
        request: &BindRequest,
        accepts_incomplete: bool,
    ) -> Result<Response<BindResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::CREATED, StatusCode::ACCEPTED];
        let path = binding_path(instance_id, binding_id);
        let query = incomplete(accepts_incomplete);
        self.call(Method::PUT, &path, &query, Some(request), &ok, Kind::Answer)
            .await
    }

    /// `DELETE …/service_bindings/:binding_id`: 200 deleted, 202 accepted, 410 gone.
    pub async fn unbind(
        &self,
        instance_id: &str,
        binding_id: &str,
        plan: &PlanRef,
        accepts_incomplete: bool,
    ) -> Result<Response<AsyncResponse>, Error> {
        let ok = [StatusCode::OK, StatusCode::ACCEPTED, StatusCode::GONE];
        let path = binding_path(instance_id, binding_id);
        let query = with_plan(incomplete(accepts_incomplete), Some(plan));
        self.call(
            Method::DELETE,
            &path,
            &query,
            None::<&()>,
            &ok,
            Kind::Answer,
        )
        .await
    }

    /// `GET /v2/service_instances/:instance_id` (brokers with `instances_retrievable`).
    pub async fn instance(
        &self,
        instance_id: &str,
        plan: Option<&PlanRef>,
    ) -> Result<Response<InstanceResource>, Error> {
        let query = with_plan(Vec::new(), plan);
        let path = instance_path(instance_id);
        self.call(
            Method::GET,
            &path,
            &query,
            None::<&()>,
            &[StatusCode::OK],
            Kind::Answer,
        )
        .await
    }

    /// `GET …/service_bindings/:binding_id` (brokers with `bindings_retrievable`).
    pub async fn binding(
        &self,
        instance_id: &str,
        binding_id: &str,
        plan: Option<&PlanRef>,
    ) -> Result<Response<BindingResource>, Error> {
        let query = with_plan(Vec::new(), plan);
        let path = binding_path(instance_id, binding_id);
        self.call(
            Method::GET,
            &path,
            &query,
            None::<&()>,
            &[StatusCode::OK],
            Kind::Answer,
        )
        .await
    }

    /// `GET …/last_operation` of an instance or a binding, once. A 410 Gone (the resource was
    /// deleted) is an [`Error::Broker`] with that status; [`Client::wait`] takes it as the end of
    /// a delete.
    pub async fn last_operation(&self, poll: &Poll) -> Result<Response<LastOperation>, Error> {
        let mut query = with_plan(Vec::new(), poll.plan.as_ref());
        if let Some(op) = &poll.operation {
            query.push(("operation", op.clone()));
        }
        let path = format!("{}/last_operation", poll.resource.path());
        self.call(
            Method::GET,
            &path,
            &query,
            None::<&()>,
            &[StatusCode::OK],
            Kind::Answer,
        )
        .await
    }
}
