//! Which webhooks a write calls: k8s.io/apiserver's `predicates` (rules, namespaceSelector,
//! objectSelector), in ShouldCallHook's order.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::admissionregistration::v1::RuleWithOperations,
    apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector,
};

use super::super::Attributes;
use crate::store::selector::LabelSelector;

/// [`rule_matches_at`] at the version the write names.
#[cfg(test)]
fn rule_matches(rule: &RuleWithOperations, attributes: &Attributes<'_>) -> bool {
    rule_matches_at(rule, attributes, attributes.version)
}

/// Whether `rule` names the write at the kind's `version` (`rules.Matcher.Matches`): its scope,
/// operation, group, version and resource. `*` is every resource but no subresource;
/// `zebras/*` is the resource and all its subresources; `*/status` every status subresource.
pub fn rule_matches_at(
    rule: &RuleWithOperations,
    attributes: &Attributes<'_>,
    version: &str,
) -> bool {
    Rule {
        api_groups: &rule.api_groups,
        api_versions: &rule.api_versions,
        operations: &rule.operations,
        resources: &rule.resources,
        scope: rule.scope.as_deref(),
    }
    .matches_at(attributes, version)
}

/// Whether a `matchPolicy` is `Equivalent` (the default) rather than `Exact`.
pub fn equivalent(match_policy: Option<&str>) -> bool {
    match_policy != Some("Exact")
}

/// The version at which `rules` take the write: the one requested if any rule takes it, else
/// (`equivalent`) the first other version of the kind that one takes, the rules in order and
/// each rule's versions in the kind's (k8s.io/apiserver's ShouldCallHook and policy
/// `matchesResourceRules`). None: no rule takes it.
pub fn matched_version<'a, R>(
    rules: &[R],
    equivalent: bool,
    attributes: &Attributes<'a>,
    matches: impl Fn(&R, &str) -> bool,
) -> Option<&'a str> {
    if rules.iter().any(|rule| matches(rule, attributes.version)) {
        return Some(attributes.version);
    }
    let versions = attributes
        .equivalents
        .as_ref()
        .filter(|_| equivalent)?
        .versions();
    rules.iter().find_map(|rule| {
        versions
            .iter()
            .copied()
            .find(|version| *version != attributes.version && matches(rule, version))
    })
}

/// The fields a webhook's rule and a policy's named rule share, borrowed.
pub struct Rule<'r> {
    /// `apiGroups`.
    pub api_groups: &'r Option<Vec<String>>,
    /// `apiVersions`.
    pub api_versions: &'r Option<Vec<String>>,
    /// `operations`.
    pub operations: &'r Option<Vec<String>>,
    /// `resources` (`zebras`, `zebras/status`, `*/*`...).
    pub resources: &'r Option<Vec<String>>,
    /// `scope`.
    pub scope: Option<&'r str>,
}

impl Rule<'_> {
    /// Whether the rule takes the write `attributes` describes, made at the kind's `version`.
    pub fn matches_at(&self, attributes: &Attributes<'_>, version: &str) -> bool {
        let exact_or_wildcard = |items: &Option<Vec<String>>, requested: &str| {
            items
                .iter()
                .flatten()
                .any(|item| item == "*" || item == requested)
        };
        let scope = match self.scope {
            None | Some("*") => true,
            Some("Namespaced") => {
                attributes.resource != "namespaces" && !attributes.namespace.is_empty()
            }
            Some("Cluster") => {
                attributes.resource == "namespaces" || attributes.namespace.is_empty()
            }
            Some(_) => false,
        };
        let resource = self.resources.iter().flatten().any(|entry| {
            let (resource, subresource) = entry.split_once('/').unwrap_or((entry, ""));
            (resource == "*" || resource == attributes.resource)
                && (subresource == "*" || subresource == attributes.subresource)
        });
        scope
            && exact_or_wildcard(self.operations, attributes.operation.as_str())
            && exact_or_wildcard(self.api_groups, attributes.group)
            && exact_or_wildcard(self.api_versions, version)
            && resource
    }
}

/// A selector of the API in the text form selectors are parsed from; Err for an operator
/// that is not one.
pub fn selector_text(selector: &ApiLabelSelector) -> Result<String, String> {
    let mut terms: Vec<String> = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        terms.push(format!("{key}={value}"));
    }
    for expression in selector.match_expressions.iter().flatten() {
        let values = expression.values.clone().unwrap_or_default().join(",");
        let key = &expression.key;
        terms.push(match expression.operator.as_str() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        });
    }
    Ok(terms.join(","))
}

/// A selector of the API as ours; None for the empty selector (everything), Err for one that
/// does not parse.
pub fn selector(selector: Option<&ApiLabelSelector>) -> Result<Option<LabelSelector>, String> {
    let Some(selector) = selector else {
        return Ok(None);
    };
    let text = selector_text(selector)?;
    if text.is_empty() {
        return Ok(None);
    }
    LabelSelector::parse(&text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The labels of an object as JSON (None without any).
pub fn labels_of(object: Option<&serde_json::Value>) -> Option<BTreeMap<String, String>> {
    let labels = object?.get("metadata")?.get("labels")?.as_object()?;
    labels
        .iter()
        .map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())))
        .collect()
}

/// objectSelector: the new object's labels or the old object's match (either is enough).
pub fn object_matches(
    selector: &Option<LabelSelector>,
    object: Option<&BTreeMap<String, String>>,
    old: Option<&BTreeMap<String, String>>,
    has_object: bool,
    has_old: bool,
) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    (has_object && selector.matches(object)) || (has_old && selector.matches(old))
}

/// A webhook's or a policy binding's selectors, parsed (None: everything).
pub struct Selectors {
    object: Option<LabelSelector>,
    namespace: Option<LabelSelector>,
}

impl Selectors {
    /// Err names the selector that does not parse (`objectSelector: ...`).
    pub fn parse(
        object: Option<&ApiLabelSelector>,
        namespace: Option<&ApiLabelSelector>,
    ) -> Result<Self, String> {
        Ok(Self {
            object: selector(object).map_err(|e| format!("objectSelector: {e}"))?,
            namespace: selector(namespace).map_err(|e| format!("namespaceSelector: {e}"))?,
        })
    }

    /// Whether they take a write of `object` (`old`: the stored one): the object's or the old
    /// object's labels match the objectSelector, then the namespace's labels match the
    /// namespaceSelector (a cluster-scoped write always does). Labels are read only for a
    /// selector to judge them.
    pub async fn take(
        &self,
        attributes: &Attributes<'_>,
        object: Option<&serde_json::Value>,
        old: Option<&serde_json::Value>,
        namespaces: &crate::store::namespaces::Namespaces,
    ) -> crate::error::Result<bool> {
        if self.object.is_some()
            && !object_matches(
                &self.object,
                labels_of(object).as_ref(),
                labels_of(old).as_ref(),
                object.is_some(),
                old.is_some(),
            )
        {
            return Ok(false);
        }
        if let Some(selector) = &self.namespace
            && !attributes.namespace.is_empty()
        {
            let labels = namespaces.labels(attributes.namespace).await?;
            return Ok(selector.matches(labels.as_ref()));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Operation;

    fn attributes(
        operation: Operation,
        namespace: &'static str,
        subresource: &'static str,
    ) -> Attributes<'static> {
        Attributes {
            operation,
            group: "zoo.example.com",
            version: "v1alpha",
            resource: "zebras".into(),
            kind: "Zebra".into(),
            subresource,
            namespace,
            name: "dolly",
            user: None,
            dry_run: false,
            options: serde_json::Value::Null,
            numbers: None,
            equivalents: None,
            requested_version: None,
        }
    }

    fn rule(operations: &[&str], resources: &[&str], scope: Option<&str>) -> RuleWithOperations {
        let strings = |items: &[&str]| Some(items.iter().map(|s| s.to_string()).collect());
        RuleWithOperations {
            api_groups: strings(&["zoo.example.com"]),
            api_versions: strings(&["*"]),
            operations: strings(operations),
            resources: strings(resources),
            scope: scope.map(str::to_owned),
        }
    }

    #[test]
    fn resources_and_subresources_as_kube_apiserver_matches_them() {
        let object = attributes(Operation::Create, "default", "");
        let status = attributes(Operation::Update, "default", "status");
        for (resources, on_object, on_status) in [
            (&["zebras"][..], true, false),
            (&["*"][..], true, false),
            (&["zebras/*"][..], true, true),
            (&["*/*"][..], true, true),
            (&["*/status"][..], false, true),
            (&["zebras/status"][..], false, true),
            (&["barns"][..], false, false),
        ] {
            let rule = rule(&["*"], resources, None);
            assert_eq!(rule_matches(&rule, &object), on_object, "{resources:?}");
            assert_eq!(rule_matches(&rule, &status), on_status, "{resources:?}");
        }
    }

    #[test]
    fn operations_groups_versions_and_scope() {
        let create = attributes(Operation::Create, "default", "");
        assert!(rule_matches(&rule(&["CREATE"], &["zebras"], None), &create));
        assert!(!rule_matches(
            &rule(&["UPDATE", "DELETE"], &["zebras"], None),
            &create
        ));
        assert!(rule_matches(
            &rule(&["*"], &["zebras"], Some("Namespaced")),
            &create
        ));
        assert!(!rule_matches(
            &rule(&["*"], &["zebras"], Some("Cluster")),
            &create
        ));
        let mut other_group = rule(&["*"], &["*"], None);
        other_group.api_groups = Some(vec!["apps".into()]);
        assert!(!rule_matches(&other_group, &create));
        let mut other_version = rule(&["*"], &["*"], None);
        other_version.api_versions = Some(vec!["v1".into()]);
        assert!(!rule_matches(&other_version, &create));
    }

    /// Two versions, v1 and v1alpha, converted by renaming `spec.a` and `spec.b`.
    #[derive(Debug)]
    struct TwoVersions;

    impl crate::admission::Equivalents for TwoVersions {
        fn versions(&self) -> &[&'static str] {
            &["v1", "v1alpha"]
        }
        fn convert_to(
            &self,
            object: &serde_json::Value,
            version: &str,
            _: Option<&serde_json::Value>,
        ) -> Option<serde_json::Value> {
            let (from, to) = if version == "v1" {
                ("a", "b")
            } else {
                ("b", "a")
            };
            let value = object.get("spec")?.get(from)?.clone();
            Some(serde_json::json!({
                "apiVersion": format!("zoo.example.com/{version}"),
                "spec": {to: value},
            }))
        }
        fn numbers(&self, _: &str) -> Option<std::sync::Arc<crate::admission::cel::Numbers>> {
            None
        }
    }

    #[test]
    fn match_policy_takes_the_requested_version_first_then_an_equivalent_one() {
        let mut write = attributes(Operation::Create, "default", "");
        write.version = "v1";
        let versioned = |versions: &[&str]| {
            let mut rule = rule(&["*"], &["zebras"], None);
            rule.api_versions = Some(versions.iter().map(|v| v.to_string()).collect());
            rule
        };
        let at = |rules: &[RuleWithOperations], equivalent: bool, write: &Attributes<'_>| {
            matched_version(rules, equivalent, write, |rule, version| {
                rule_matches_at(rule, write, version)
            })
            .map(str::to_owned)
        };
        let alpha = [versioned(&["v1alpha"])];
        // Without the kind's versions known, or with Exact, only the version requested.
        assert_eq!(at(&alpha, true, &write), None);
        write.equivalents = Some(std::sync::Arc::new(TwoVersions));
        assert_eq!(at(&alpha, false, &write), None);
        assert_eq!(at(&alpha, true, &write).as_deref(), Some("v1alpha"));
        // A rule that takes the version requested wins, wherever it is listed.
        let both = [versioned(&["v1alpha"]), versioned(&["v1"])];
        assert_eq!(at(&both, true, &write).as_deref(), Some("v1"));
        assert_eq!(at(&[versioned(&["v2"])], true, &write), None);
        assert!(equivalent(None) && equivalent(Some("Equivalent")) && !equivalent(Some("Exact")));

        // The write at v1alpha: kind and resource there, the request's version kept, the
        // object converted (a null one, a delete's, stays null).
        let object = serde_json::json!({"apiVersion": "zoo.example.com/v1", "spec": {"b": 3}});
        let judged = crate::admission::AtVersion::new(
            &write,
            "v1alpha",
            Some(&object),
            Some(&serde_json::Value::Null),
        )
        .unwrap();
        assert!(judged.converted());
        assert_eq!(judged.attributes.version, "v1alpha");
        assert_eq!(judged.attributes.request_version(), "v1");
        assert_eq!(
            judged.object.as_deref(),
            Some(&serde_json::json!({"apiVersion": "zoo.example.com/v1alpha", "spec": {"a": 3}}))
        );
        assert_eq!(judged.old.as_deref(), Some(&serde_json::Value::Null));
        // An object that does not convert is kube-apiserver's 500, not a hook skipped.
        assert!(
            crate::admission::AtVersion::new(
                &write,
                "v1alpha",
                Some(&serde_json::json!({"apiVersion": "zoo.example.com/v1", "spec": {}})),
                None,
            )
            .is_err()
        );
    }

    #[test]
    fn selectors_from_the_api() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let api = ApiLabelSelector {
            match_labels: Some([("team".to_string(), "a".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["x".into(), "y".into()]),
                },
                LabelSelectorRequirement {
                    key: "skip".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        let parsed = selector(Some(&api)).unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let yes = labels(&[("team", "a"), ("tier", "y")]);
        let no = labels(&[("team", "a"), ("tier", "y"), ("skip", "1")]);
        assert!(object_matches(&parsed, Some(&yes), None, true, false));
        assert!(!object_matches(&parsed, Some(&no), None, true, false));
        // Either the new or the old object.
        assert!(object_matches(&parsed, Some(&no), Some(&yes), true, true));
        assert!(
            selector(Some(&ApiLabelSelector::default()))
                .unwrap()
                .is_none()
        );
        let bad = ApiLabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "Near".into(),
                values: None,
            }]),
            ..Default::default()
        };
        assert!(selector(Some(&bad)).is_err());
    }
}
