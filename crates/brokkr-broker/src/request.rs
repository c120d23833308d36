//! What a mutating request asks for, checked before anything is stored: `accepts_incomplete`
//! and its JSON body, the catalog plan it names, and its parameters against that plan's schemas.

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use brokkr_blueprint::PlanEntry;
use serde_json::{Map, Value};

use crate::body::{Query, read_json};
use crate::broker::Broker;
use crate::error::ApiError;

/// Reads what every mutating request carries: `accepts_incomplete` and a JSON body.
pub(crate) async fn read_mutation<T>(
    broker: &Broker,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
    parse: fn(&[u8]) -> Result<T, brokkr_osb::messages::RequestError>,
) -> Result<(bool, T), ApiError> {
    let accepts_incomplete = Query::parse(query)?.accepts_incomplete()?;
    let bytes = read_json(headers, body, broker.max_body_bytes()).await?;
    let request = parse(&bytes).map_err(|e| ApiError::bad_request(e.0))?;
    Ok((accepts_incomplete, request))
}

/// Looks up a plan, explaining which id is unknown.
pub(crate) fn plan_entry(
    broker: &Broker,
    service_id: &str,
    plan_id: &str,
) -> Result<Arc<PlanEntry>, ApiError> {
    let config = broker.config();
    if config.catalog.service(service_id).is_none() {
        return Err(ApiError::bad_request(format!(
            "service_id {service_id:?} is not in the catalog"
        )));
    }
    config.plan(service_id, plan_id).cloned().ok_or_else(|| {
        ApiError::bad_request(format!(
            "plan_id {plan_id:?} is not a plan of service {service_id:?}"
        ))
    })
}

/// Validates parameters against an optional schema: 400 with every violation.
pub(crate) fn validate_parameters(
    schema: Option<&brokkr_blueprint::schema::ParameterSchema>,
    parameters: Option<&Map<String, Value>>,
) -> Result<(), ApiError> {
    let Some(schema) = schema else {
        return Ok(());
    };
    let value = Value::Object(parameters.cloned().unwrap_or_default());
    schema.validate(&value).map_err(|messages| {
        ApiError::bad_request(format!("invalid parameters: {}", messages.join("; ")))
    })
}
