//! Whether the `brokkr-user-info` ValidatingAdmissionPolicy and its binding, as the API server
//! holds them, check `spec.userInfo` of a kind in every namespace as brokkr ships them
//! (deploy/base/user-info-policy.yaml), so that an identity the controller forwards is one the
//! API server checked.
//!
//! What may differ from what brokkr ships, because it checks no less:
//!
//! - the policy: more validations beside the shipped one (its expression as shipped, up to
//!   whitespace), each validation's `message`, `messageExpression` and `reason`, `variables`,
//!   `auditAnnotations`, more resources, operations, API groups or versions in its rules,
//!   `failurePolicy` `Fail` (the default), `matchPolicy`, and the empty selectors and `scope: "*"`
//!   the API server fills in;
//! - the binding: more `validationActions` beside `Deny`, and a `matchResources` that selects
//!   everything (empty selectors, no rules of its own, or rules that cover the kind).
//!
//! Anything else — a selector that leaves namespaces or objects out, `excludeResourceRules`,
//! `matchConditions`, parameters, the shipped expression changed, `failurePolicy: Ignore`, a
//! binding that only warns or audits — is not provably the same check, and the identity is not
//! trusted. [`as_shipped`] says why.

use serde_json::Value;

/// The name of the ValidatingAdmissionPolicy, and of its binding, that checks `spec.userInfo`.
pub const POLICY: &str = "brokkr-user-info";
/// The API group whose kinds the policy checks.
const GROUP: &str = "services.brokkr.dev";

/// The shipped validation's expression, whitespace aside (deploy/base/user-info-policy.yaml; a
/// test keeps the two the same).
pub const SHIPPED_EXPRESSION: &str = "!has(object.spec.userInfo) \
    || (oldObject != null && object.spec == oldObject.spec) \
    || (object.spec.userInfo.username == request.userInfo.username \
    && (!has(object.spec.userInfo.uid) || object.spec.userInfo.uid == request.userInfo.uid) \
    && (!has(object.spec.userInfo.groups) \
    || object.spec.userInfo.groups.all(g, g in request.userInfo.groups)) \
    && (!has(object.spec.userInfo.extra) || size(object.spec.userInfo.extra) == 0))";

/// `text` with every run of whitespace made one space, and none at either end.
fn squeezed(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `value` (a JSON list of strings) holds `wanted` or `*`.
fn lists(value: &Value, wanted: &str) -> bool {
    value
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == wanted || v == "*"))
}

/// Whether a field is absent, `null`, or empty (an empty list or object).
fn empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Whether a label selector selects everything: none, or `{}`.
fn selects_all(selector: &Value) -> bool {
    empty(&selector["matchLabels"]) && empty(&selector["matchExpressions"])
}

/// Whether one `resourceRules` entry covers CREATE and UPDATE of `plural` at every version of
/// brokkr's group, in namespaces.
fn rule_covers(rule: &Value, plural: &str) -> bool {
    let scope = rule["scope"].as_str().unwrap_or("*");
    lists(&rule["apiGroups"], GROUP)
        && lists(&rule["apiVersions"], "*")
        && lists(&rule["operations"], "CREATE")
        && lists(&rule["operations"], "UPDATE")
        && (lists(&rule["resources"], plural) || lists(&rule["resources"], "*/*"))
        && rule["resourceNames"].as_array().is_none_or(Vec::is_empty)
        && (scope == "*" || scope == "Namespaced")
}

/// Whether `matchConstraints` (of the policy) or `matchResources` (of its binding) match every
/// request for `plural` in every namespace; `Err` says what leaves some out.
fn matches_all(what: &str, rules: &Value, plural: &str, rules_needed: bool) -> Result<(), String> {
    for selector in ["namespaceSelector", "objectSelector"] {
        if !selects_all(&rules[selector]) {
            return Err(format!("{what} has a {selector}"));
        }
    }
    if !empty(&rules["excludeResourceRules"]) {
        return Err(format!("{what} has excludeResourceRules"));
    }
    let own = rules["resourceRules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if (rules_needed || !own.is_empty()) && !own.iter().any(|r| rule_covers(r, plural)) {
        return Err(format!(
            "{what} has no resource rule covering CREATE and UPDATE of {plural}.{GROUP} at every version"
        ));
    }
    Ok(())
}

/// Whether the policy and its binding (their whole bodies) check `spec.userInfo` of `plural`
/// (`serviceinstances`, `servicebindings`) in every namespace as shipped, or provably the same
/// way; `Err` says, for the log, what differs.
pub fn as_shipped(policy: &Value, binding: &Value, plural: &str) -> Result<(), String> {
    let spec = &policy["spec"];
    if !matches!(spec["failurePolicy"].as_str(), None | Some("Fail")) {
        return Err("the policy's failurePolicy is not Fail".into());
    }
    if !empty(&spec["paramKind"]) {
        return Err("the policy takes parameters (paramKind)".into());
    }
    if !empty(&spec["matchConditions"]) {
        return Err("the policy has matchConditions".into());
    }
    matches_all(
        "the policy's matchConstraints",
        &spec["matchConstraints"],
        plural,
        true,
    )?;
    let shipped = squeezed(SHIPPED_EXPRESSION);
    let validations = spec["validations"].as_array().cloned().unwrap_or_default();
    if !validations.iter().any(|v| {
        v["expression"]
            .as_str()
            .is_some_and(|e| squeezed(e) == shipped)
    }) {
        return Err("the policy's validations do not hold the shipped expression".into());
    }
    let spec = &binding["spec"];
    if spec["policyName"] != POLICY {
        return Err(format!("the binding is not of the policy {POLICY}"));
    }
    if !spec["validationActions"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "Deny"))
    {
        return Err("the binding does not Deny".into());
    }
    if !empty(&spec["paramRef"]) {
        return Err("the binding has a paramRef".into());
    }
    matches_all(
        "the binding's matchResources",
        &spec["matchResources"],
        plural,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The shipped policy and binding, as deploy/base has them, with the defaults a 1.30+ API
    /// server fills in.
    fn shipped() -> (Value, Value) {
        let text = include_str!("../../../deploy/base/user-info-policy.yaml");
        let mut documents: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
        let mut binding = documents.pop().unwrap();
        let mut policy = documents.pop().unwrap();
        let constraints = &mut policy["spec"]["matchConstraints"];
        constraints["namespaceSelector"] = json!({});
        constraints["objectSelector"] = json!({});
        constraints["matchPolicy"] = json!("Equivalent");
        constraints["resourceRules"][0]["scope"] = json!("*");
        binding["spec"]["matchResources"] = json!({"namespaceSelector": {}, "objectSelector": {},
            "matchPolicy": "Equivalent"});
        (policy, binding)
    }

    #[test]
    fn the_shipped_policy_is_trusted_for_both_kinds_and_its_expression_is_the_one_checked() {
        let (policy, binding) = shipped();
        for plural in ["serviceinstances", "servicebindings"] {
            assert_eq!(as_shipped(&policy, &binding, plural), Ok(()));
        }
        assert_eq!(
            squeezed(
                policy["spec"]["validations"][0]["expression"]
                    .as_str()
                    .unwrap()
            ),
            squeezed(SHIPPED_EXPRESSION)
        );
        // As written in deploy/ (no defaults filled in) it is trusted too.
        let text = include_str!("../../../deploy/base/user-info-policy.yaml");
        let documents: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
        assert_eq!(
            as_shipped(&documents[0], &documents[1], "serviceinstances"),
            Ok(())
        );
    }

    #[test]
    fn what_checks_no_less_is_trusted() {
        let (mut policy, mut binding) = shipped();
        let spec = &mut policy["spec"];
        spec["validations"][0]["message"] = json!("not yours");
        spec["validations"]
            .as_array_mut()
            .unwrap()
            .push(json!({"expression": "true"}));
        spec["matchConstraints"]["resourceRules"][0]["resources"] = json!([
            "serviceinstances",
            "servicebindings",
            "servicebindingusages"
        ]);
        spec["matchConstraints"]["resourceRules"][0]["operations"] = json!(["*"]);
        spec["auditAnnotations"] = json!([{"key": "who", "valueExpression": "'x'"}]);
        spec["validations"][0]["expression"] = json!(SHIPPED_EXPRESSION.replace(" || ", "\n  || "));
        binding["spec"]["validationActions"] = json!(["Deny", "Audit"]);
        binding["spec"]["matchResources"]["resourceRules"] = json!([{"apiGroups": ["*"],
            "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["*"]}]);
        assert_eq!(as_shipped(&policy, &binding, "servicebindings"), Ok(()));
    }

    #[test]
    fn what_may_check_less_is_not_trusted_and_says_why() {
        type Change = Box<dyn Fn(&mut Value, &mut Value)>;
        let changes: Vec<(&str, Change)> = vec![
            (
                "namespaceSelector",
                Box::new(|_, b| {
                    b["spec"]["matchResources"]["namespaceSelector"] =
                        json!({"matchLabels": {"team": "a"}});
                }),
            ),
            (
                "objectSelector",
                Box::new(|p, _| {
                    p["spec"]["matchConstraints"]["objectSelector"] =
                        json!({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]});
                }),
            ),
            (
                "excludeResourceRules",
                Box::new(|_, b| {
                    b["spec"]["matchResources"]["excludeResourceRules"] = json!([{"apiGroups": ["*"], "apiVersions": ["*"],
                                "operations": ["*"], "resources": ["*"]}]);
                }),
            ),
            (
                "no resource rule",
                Box::new(|p, _| {
                    p["spec"]["matchConstraints"]["resourceRules"][0]["resources"] =
                        json!(["serviceinstances"]);
                }),
            ),
            (
                "no resource rule",
                Box::new(|p, _| {
                    p["spec"]["matchConstraints"]["resourceRules"][0]["operations"] =
                        json!(["CREATE"]);
                }),
            ),
            (
                "no resource rule",
                Box::new(|_, b| {
                    b["spec"]["matchResources"]["resourceRules"] = json!([{"apiGroups": ["*"],
                        "apiVersions": ["v1alpha1"], "operations": ["*"], "resources": ["*"]}]);
                }),
            ),
            (
                "shipped expression",
                Box::new(|p, _| {
                    p["spec"]["validations"][0]["expression"] = json!("true");
                }),
            ),
            (
                "failurePolicy",
                Box::new(|p, _| p["spec"]["failurePolicy"] = json!("Ignore")),
            ),
            (
                "matchConditions",
                Box::new(|p, _| {
                    p["spec"]["matchConditions"] =
                        json!([{"name": "x", "expression": "request.namespace != 'b'"}]);
                }),
            ),
            (
                "paramKind",
                Box::new(|p, _| {
                    p["spec"]["paramKind"] = json!({"apiVersion": "v1", "kind": "ConfigMap"});
                }),
            ),
            (
                "does not Deny",
                Box::new(|_, b| b["spec"]["validationActions"] = json!(["Warn", "Audit"])),
            ),
            (
                "not of the policy",
                Box::new(|_, b| b["spec"]["policyName"] = json!("another")),
            ),
        ];
        for (why, change) in changes {
            let (mut policy, mut binding) = shipped();
            change(&mut policy, &mut binding);
            let said = as_shipped(&policy, &binding, "servicebindings").unwrap_err();
            assert!(said.contains(why), "{why}: {said}");
        }
    }
}
