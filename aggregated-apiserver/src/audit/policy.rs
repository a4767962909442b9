//! The audit policy (`audit.k8s.io/v1` Policy, `--audit-policy-file`), read and judged as
//! k8s.io/apiserver's `audit/policy` reads and judges it: the first rule that matches a request
//! gives its level (None when none does); an empty list in a rule matches everything.

use serde::Deserialize;

use crate::{auth::UserInfo, request_info::RequestInfo};

/// How much of a request is written (`audit.k8s.io/v1` Level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
pub enum Level {
    /// Nothing is written.
    None,
    /// Who, what, when and the answer's code; no objects.
    Metadata,
    /// And the request's object.
    Request,
    /// And the response's.
    RequestResponse,
}

/// When in a request an event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum Stage {
    /// As soon as the request is authenticated.
    RequestReceived,
    /// When a long-running request's (a watch's) answer has begun.
    ResponseStarted,
    /// When the answer is complete.
    ResponseComplete,
    /// When the handler panicked.
    Panic,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyFile {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    level: Option<Level>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    omit_managed_fields: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

/// What the policy says of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestConfig {
    /// How much is written.
    pub level: Level,
    /// The stages not written (the rule's and the policy's).
    pub omit_stages: Vec<Stage>,
    /// Objects are written without `metadata.managedFields`.
    pub omit_managed_fields: bool,
}

impl RequestConfig {
    /// Whether an event is written at `stage`.
    pub fn writes(&self, stage: Stage) -> bool {
        self.level > Level::None && !self.omit_stages.contains(&stage)
    }
}

/// A loaded policy.
#[derive(Debug)]
pub struct Policy {
    rules: Vec<Rule>,
    omit_stages: Vec<Stage>,
    omit_managed_fields: bool,
}

impl Policy {
    /// Reads a policy from YAML or JSON; the error names what is wrong, as kube-apiserver's.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| format!("failed decoding: {e}"))?;
        // kube-apiserver decodes strictly, then leniently with a warning: a misspelt field
        // widens a rule, so say so.
        let mut unknown = Vec::new();
        let file: PolicyFile = serde_ignored::deserialize(value, |path| {
            unknown.push(path.to_string());
        })
        .map_err(|e| format!("failed decoding: {e}"))?;
        if !unknown.is_empty() {
            tracing::warn!(
                fields = %unknown.join(", "),
                "Audit policy contains errors, falling back to lenient decoding: unknown fields"
            );
        }
        match (file.api_version.as_deref(), file.kind.as_deref()) {
            (Some("audit.k8s.io/v1"), Some("Policy")) => {}
            (version, kind) => {
                return Err(format!(
                    "unknown group version field {}, Kind={} in policy",
                    version.unwrap_or_default(),
                    kind.unwrap_or_default()
                ));
            }
        }
        let mut errors = Vec::new();
        for (i, rule) in file.rules.iter().enumerate() {
            if rule.level.is_none() {
                errors.push(format!("rules[{i}].level: Required value"));
            }
            for (j, url) in rule.non_resource_urls.iter().enumerate() {
                if url != "*" && !url.starts_with('/') {
                    errors.push(format!(
                        "rules[{i}].nonResourceURLs[{j}]: Invalid value: \"{url}\": non-resource URL rules must begin with a '/' character"
                    ));
                }
                if url.find('*').is_some_and(|at| at != url.len() - 1) {
                    errors.push(format!(
                        "rules[{i}].nonResourceURLs[{j}]: Invalid value: \"{url}\": non-resource URL wildcards '*' must be the final character of the rule"
                    ));
                }
            }
            if !rule.non_resource_urls.is_empty()
                && (!rule.resources.is_empty() || !rule.namespaces.is_empty())
            {
                errors.push(format!(
                    "rules[{i}].nonResourceURLs: Invalid value: rules cannot apply to both regular resources and non-resource URLs"
                ));
            }
            for (j, group) in rule.resources.iter().enumerate() {
                if !group.resource_names.is_empty() && group.resources.is_empty() {
                    errors.push(format!(
                        "rules[{i}].resources[{j}].resourceNames: Invalid value: using resourceNames requires at least one resource"
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors.join(", "));
        }
        if file.rules.is_empty() {
            return Err("loaded illegal policy with 0 rules".into());
        }
        Ok(Self {
            rules: file.rules,
            omit_stages: file.omit_stages,
            omit_managed_fields: file.omit_managed_fields,
        })
    }

    /// The level and stages for a request by `user` (None when authentication failed).
    pub fn evaluate(&self, user: Option<&UserInfo>, info: &RequestInfo<'_>) -> RequestConfig {
        for rule in &self.rules {
            if rule.matches(user, info) {
                let mut omit_stages = self.omit_stages.clone();
                for stage in &rule.omit_stages {
                    if !omit_stages.contains(stage) {
                        omit_stages.push(*stage);
                    }
                }
                return RequestConfig {
                    level: rule.level.unwrap_or(Level::None),
                    omit_stages,
                    omit_managed_fields: rule
                        .omit_managed_fields
                        .unwrap_or(self.omit_managed_fields),
                };
            }
        }
        RequestConfig {
            level: Level::None,
            omit_stages: self.omit_stages.clone(),
            omit_managed_fields: self.omit_managed_fields,
        }
    }
}

fn has(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == value)
}

impl Rule {
    fn matches(&self, user: Option<&UserInfo>, info: &RequestInfo<'_>) -> bool {
        if !self.users.is_empty() && !user.is_some_and(|u| has(&self.users, &u.name)) {
            return false;
        }
        if !self.user_groups.is_empty()
            && !user.is_some_and(|u| u.groups.iter().any(|g| has(&self.user_groups, g)))
        {
            return false;
        }
        if !self.verbs.is_empty() && !has(&self.verbs, info.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(info);
        }
        if !self.non_resource_urls.is_empty() {
            return !info.is_resource_request
                && self
                    .non_resource_urls
                    .iter()
                    .any(|spec| path_matches(spec, info.path));
        }
        true
    }

    fn matches_resource(&self, info: &RequestInfo<'_>) -> bool {
        if !info.is_resource_request {
            return false;
        }
        if !self.namespaces.is_empty() && !has(&self.namespaces, info.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let combined = if info.subresource.is_empty() {
            info.resource.to_owned()
        } else {
            format!("{}/{}", info.resource, info.subresource)
        };
        self.resources
            .iter()
            .filter(|gr| gr.group == info.api_group || gr.group == "*")
            .any(|gr| {
                if gr.resources.is_empty() {
                    return true;
                }
                if !gr.resource_names.is_empty() && !has(&gr.resource_names, info.name) {
                    return false;
                }
                gr.resources.iter().any(|res| {
                    res == &combined
                        || res == "*"
                        || res.strip_prefix("*/").is_some_and(|sub| {
                            !info.subresource.is_empty() && sub == info.subresource
                        })
                        // As kube-apiserver: `zebras/*` also takes `zebras` itself.
                        || res.strip_suffix("/*") == Some(info.resource)
                })
            })
    }
}

fn path_matches(spec: &str, path: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    fn level(policy: &Policy, user: Option<&UserInfo>, method: Method, path: &str) -> Level {
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let info = RequestInfo::parse(&method, path, Some(query).filter(|q| !q.is_empty()));
        policy.evaluate(user, &info).level
    }

    #[test]
    fn first_matching_rule_gives_the_level() {
        let policy = Policy::parse(
            r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: ["system:kube-proxy"]
- level: RequestResponse
  resources:
  - group: zoo.example.com
    resources: ["zebras/status"]
- level: Request
  verbs: ["create", "update"]
  namespaces: ["prod"]
- level: Metadata
  resources:
  - group: zoo.example.com
    resources: ["zebras"]
    resourceNames: ["dolly"]
- level: Metadata
  nonResourceURLs: ["/openapi*"]
"#,
        )
        .unwrap();
        let alice = user("alice", &["system:authenticated"]);
        let proxy = user("system:kube-proxy", &[]);
        let zebras = "/apis/zoo.example.com/v1alpha/namespaces/prod/zebras";
        let a = Some(&alice);
        assert_eq!(
            level(&policy, Some(&proxy), Method::GET, zebras),
            Level::None
        );
        assert_eq!(
            level(&policy, a, Method::PUT, &format!("{zebras}/dolly/status")),
            Level::RequestResponse
        );
        assert_eq!(level(&policy, a, Method::POST, zebras), Level::Request);
        assert_eq!(
            level(&policy, a, Method::GET, &format!("{zebras}/dolly")),
            Level::Metadata
        );
        // resourceNames never match a list; nothing else matches it.
        assert_eq!(level(&policy, a, Method::GET, zebras), Level::None);
        assert_eq!(
            level(&policy, a, Method::GET, "/openapi/v2"),
            Level::Metadata
        );
        // A rule with resources never matches a non-resource request.
        assert_eq!(level(&policy, a, Method::GET, "/version"), Level::None);
        let info = RequestInfo::parse(&Method::POST, zebras, None);
        let config = policy.evaluate(a, &info);
        assert!(!config.writes(Stage::RequestReceived));
        assert!(config.writes(Stage::ResponseComplete));
    }

    #[test]
    fn subresource_patterns_and_groups_match_as_kube_apiserver() {
        let policy = Policy::parse(
            r#"{"apiVersion":"audit.k8s.io/v1","kind":"Policy","rules":[
              {"level":"Request","resources":[{"group":"*","resources":["*/status"]}]},
              {"level":"Metadata","userGroups":["farmers"],"resources":[{"group":"zoo.example.com","resources":["zebras/*"]}]}]}"#,
        )
        .unwrap();
        let farmer = user("bob", &["farmers"]);
        let other = user("eve", &["others"]);
        let base = "/apis/zoo.example.com/v1alpha/namespaces/default/zebras";
        assert_eq!(
            level(
                &policy,
                Some(&other),
                Method::PATCH,
                &format!("{base}/a/status")
            ),
            Level::Request
        );
        assert_eq!(
            level(&policy, Some(&farmer), Method::GET, base),
            Level::Metadata
        );
        assert_eq!(level(&policy, Some(&other), Method::GET, base), Level::None);
        // A failed authentication (no user) matches no rule naming users or groups.
        assert_eq!(level(&policy, None, Method::GET, base), Level::None);
    }

    #[test]
    fn bad_policies_are_refused_with_kube_apiserver_words() {
        let cases = [
            (
                "apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]",
                "unknown group version",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []",
                "0 rules",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{users: [a]}]",
                "rules[0].level: Required value",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Loud}]",
                "failed decoding",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [healthz]}]",
                "must begin with a '/'",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: ['/a*b']}]",
                "must be the final character",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, namespaces: [a], nonResourceURLs: ['/a']}]",
                "both regular resources",
            ),
            (
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{resourceNames: [x]}]}]",
                "requires at least one resource",
            ),
        ];
        for (text, expected) in cases {
            let error = Policy::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
