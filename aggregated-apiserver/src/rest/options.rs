//! The query parameters of resource requests and the DeleteOptions body, read and validated
//! as kube-apiserver reads them (ListOptions, WatchOptions, CreateOptions...), without HTTP.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;

use crate::{
    error::{Error, FieldError, Result, Subject},
    render::table::IncludeObject,
    resource::ServedResource,
    store::ReadAt,
    store::selector::{FieldSelector, Filter, LabelSelector},
};

/// The query parameters kube-apiserver reads on resource requests, as sent. Others are
/// ignored, as kube-apiserver ignores them.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pub(crate) label_selector: Option<String>,
    pub(crate) field_selector: Option<String>,
    pub(crate) limit: Option<String>,
    pub(crate) continue_: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) resource_version_match: Option<String>,
    pub(crate) watch: Option<String>,
    pub(crate) allow_watch_bookmarks: Option<String>,
    pub(crate) timeout_seconds: Option<String>,
    pub(crate) send_initial_events: Option<String>,
    pub(crate) include_object: Option<String>,
    pub(crate) dry_run: Option<String>,
    pub(crate) field_validation: Option<String>,
    pub(crate) field_manager: Option<String>,
    pub(crate) force: Option<String>,
    pub(crate) propagation_policy: Option<String>,
    pub(crate) orphan_dependents: Option<String>,
}

/// Parses a query string; a parameter given twice takes its first value, as kube-apiserver's
/// parameter conversion does.
pub(crate) fn parse_query(raw: Option<&str>) -> Result<Query> {
    let mut query = Query::default();
    let raw = match raw {
        // Most GETs carry no query: no parsing.
        None | Some("") => return Ok(query),
        Some(raw) => raw,
    };
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
        .map_err(|e| Error::BadRequest(format!("invalid query parameters: {e}")))?;
    for (name, value) in pairs {
        let slot = match name.as_str() {
            "labelSelector" => &mut query.label_selector,
            "fieldSelector" => &mut query.field_selector,
            "limit" => &mut query.limit,
            "continue" => &mut query.continue_,
            "resourceVersion" => &mut query.resource_version,
            "resourceVersionMatch" => &mut query.resource_version_match,
            "watch" => &mut query.watch,
            "allowWatchBookmarks" => &mut query.allow_watch_bookmarks,
            "timeoutSeconds" => &mut query.timeout_seconds,
            "sendInitialEvents" => &mut query.send_initial_events,
            "includeObject" => &mut query.include_object,
            "dryRun" => &mut query.dry_run,
            "fieldValidation" => &mut query.field_validation,
            "fieldManager" => &mut query.field_manager,
            "force" => &mut query.force,
            "propagationPolicy" => &mut query.propagation_policy,
            "orphanDependents" => &mut query.orphan_dependents,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(value);
        }
    }
    Ok(query)
}

/// kube-apiserver's `FieldManagerMaxLength`.
pub(crate) const FIELD_MANAGER_MAX_LENGTH: usize = 128;

/// Go's `unicode.IsPrint`, near enough: no control characters, no separators but the space.
pub(crate) fn is_print(c: char) -> bool {
    c == ' ' || !(c.is_control() || c.is_whitespace() || ('\u{e000}'..='\u{f8ff}').contains(&c))
}

/// An integer parameter as Go's `strconv.ParseInt` reads it, with its error text.
pub(crate) fn parse_i64(value: &str) -> Result<i64> {
    value.parse().map_err(|e: std::num::ParseIntError| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        Error::BadRequest(format!("strconv.ParseInt: parsing {value:?}: {why}"))
    })
}

/// Go's `strconv.ParseBool`, which is what kube-apiserver applies to boolean parameters.
pub(crate) fn parse_bool(name: &str, value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("") => Ok(false),
        Some(value) => crate::request_info::parse_bool(value).ok_or_else(|| {
            Error::BadRequest(format!(
                "invalid value for {name}: {value:?}: must be true or false"
            ))
        }),
    }
}

pub(crate) fn list_options_invalid(causes: Vec<FieldError>) -> Error {
    Error::Invalid {
        subject: Subject {
            resource: String::new(),
            group: "meta.k8s.io".into(),
            kind: "ListOptions".into(),
            name: String::new(),
        },
        causes,
    }
}

/// A list's validated options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListParams {
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
    pub(crate) read_at: ReadAt,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchFrom {
    /// ADDED events for the current state first.
    InitialState,
    /// Changes after the store's current version (`sendInitialEvents=false` without a version).
    Latest,
    /// Changes after this version.
    After(u64),
}

/// A watch's validated options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WatchParams {
    pub(crate) from: WatchFrom,
    pub(crate) send_initial_events: bool,
    pub(crate) allow_bookmarks: bool,
    pub(crate) resource_version: Option<u64>,
    /// None: the server's choice.
    pub(crate) timeout: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

impl Query {
    /// `limit`: at most this many; 0 or less (or none) means all, as in kube-apiserver.
    pub(crate) fn limit(&self) -> Result<Option<usize>> {
        match self.limit.as_deref() {
            None | Some("") => Ok(None),
            Some(l) => Ok(usize::try_from(parse_i64(l)?).ok().filter(|l| *l > 0)),
        }
    }

    /// `timeoutSeconds`, parsed wherever ListOptions are (lists, watches, deletecollection):
    /// a malformed value is 400 even where it would not be used.
    pub(crate) fn timeout_seconds(&self) -> Result<Option<Duration>> {
        match self.timeout_seconds.as_deref() {
            None | Some("") => Ok(None),
            Some(s) => Ok(Some(Duration::from_secs(
                u64::try_from(parse_i64(s)?).unwrap_or(0),
            ))),
        }
    }

    /// Both selectors, the field selector knowing `K`'s selectable fields.
    pub(crate) fn filter<K: ServedResource>(&self) -> Result<Filter> {
        Ok(Filter {
            labels: LabelSelector::parse(self.label_selector.as_deref().unwrap_or(""))?,
            fields: FieldSelector::parse_for(
                self.field_selector.as_deref().unwrap_or(""),
                K::SELECTABLE_FIELDS,
            )?,
        })
    }

    /// `resourceVersion`, read as kube-apiserver's storage reads it (Go's `strconv.ParseUint`:
    /// digits only, no sign), on a GET as on a list or watch.
    pub(crate) fn resource_version(&self) -> Result<Option<u64>> {
        match self.resource_version.as_deref() {
            None | Some("") => Ok(None),
            Some(rv) => {
                let why = if !rv.bytes().all(|b| b.is_ascii_digit()) {
                    "invalid syntax"
                } else {
                    match rv.parse() {
                        Ok(rv) => return Ok(Some(rv)),
                        Err(_) => "value out of range",
                    }
                };
                Err(Error::BadRequest(format!(
                    "invalid resource version: resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: {why}"
                )))
            }
        }
    }

    pub(crate) fn include_object(&self) -> Result<IncludeObject> {
        match self.include_object.as_deref() {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(Error::BadRequest(format!(
                "unrecognized includeObject value: {other:?}"
            ))),
        }
    }

    pub(crate) fn dry_run(&self) -> Result<bool> {
        match self.dry_run.as_deref() {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(Error::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            ))),
        }
    }

    /// `fieldManager` (and `force`) of a write, validated as kube-apiserver validates its
    /// `options` (`CreateOptions`, `UpdateOptions`, `PatchOptions`): at most 128 bytes of
    /// printable characters; for a patch, required when `apply` and `force` forbidden otherwise.
    /// Returns the manager ("" when not given) and `force`.
    pub(crate) fn field_manager(
        &self,
        options: &str,
        apply: Option<bool>,
    ) -> Result<(String, bool)> {
        let manager = self.field_manager.clone().unwrap_or_default();
        let mut causes = Vec::new();
        match apply {
            Some(true) if manager.is_empty() => causes.push(FieldError::required(
                "fieldManager",
                "is required for apply patch",
            )),
            Some(false) if self.force.is_some() => causes.push(FieldError {
                field: "force".into(),
                reason: "FieldValueForbidden",
                message: "Forbidden: may not be specified for non-apply patch".into(),
            }),
            _ => {}
        }
        if manager.len() > FIELD_MANAGER_MAX_LENGTH {
            causes.push(FieldError {
                field: "fieldManager".into(),
                reason: "FieldValueTooLong",
                message: format!("Too long: may not be more than {FIELD_MANAGER_MAX_LENGTH} bytes"),
            });
        }
        for (i, c) in manager.char_indices() {
            if !is_print(c) {
                causes.push(FieldError::invalid(
                    "fieldManager",
                    format!("{manager:?}"),
                    &format!("invalid character U+{:04X} (at position {i})", u32::from(c)),
                ));
            }
        }
        if !causes.is_empty() {
            return Err(Error::Invalid {
                subject: Subject {
                    resource: String::new(),
                    group: "meta.k8s.io".into(),
                    kind: options.into(),
                    name: String::new(),
                },
                causes,
            });
        }
        let force = match (apply, self.force.as_deref()) {
            (Some(true), value @ Some(_)) => parse_bool("force", value)?,
            _ => false,
        };
        Ok((manager, force))
    }

    pub(crate) fn field_validation(&self) -> Result<FieldValidation> {
        match self.field_validation.as_deref() {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(Error::BadRequest(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }

    /// A list's options, validated as kube-apiserver validates ListOptions (the selectors
    /// apart: [`Query::filter`]).
    pub(crate) fn list_params(&self) -> Result<ListParams> {
        if self.send_initial_events.is_some() {
            return Err(list_options_invalid(vec![FieldError {
                field: "sendInitialEvents".into(),
                reason: "FieldValueForbidden",
                message: "Forbidden: sendInitialEvents is forbidden for list".into(),
            }]));
        }
        let continue_token = self.continue_.clone().filter(|c| !c.is_empty());
        if continue_token.is_some()
            && self
                .resource_version()
                .ok()
                .flatten()
                .is_some_and(|rv| rv != 0)
        {
            return Err(Error::BadRequest(
                "specifying resource version is not allowed when using continue".into(),
            ));
        }
        let limit = self.limit()?;
        self.timeout_seconds()?;
        Ok(ListParams {
            limit,
            continue_token,
            read_at: self.read_at()?,
        })
    }

    /// A watch's options, validated as kube-apiserver validates them for a watch.
    pub(crate) fn watch_params(&self) -> Result<WatchParams> {
        let send_initial_events =
            parse_bool("sendInitialEvents", self.send_initial_events.as_deref())?;
        let allow_bookmarks =
            parse_bool("allowWatchBookmarks", self.allow_watch_bookmarks.as_deref())?;
        let resource_version = self.resource_version()?;
        let rv_match = self.resource_version_match.as_deref().unwrap_or("");
        if self.send_initial_events.is_some() {
            let mut causes = Vec::new();
            if rv_match != "NotOlderThan" {
                causes.push(FieldError {
                    field: "resourceVersionMatch".into(),
                    reason: "FieldValueForbidden",
                    message: "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
                });
            }
            if send_initial_events && !allow_bookmarks {
                causes.push(FieldError {
                    field: "allowWatchBookmarks".into(),
                    reason: "FieldValueForbidden",
                    message: "Forbidden: allowWatchBookmarks must be set to true when sendInitialEvents is true".into(),
                });
            }
            if !causes.is_empty() {
                return Err(list_options_invalid(causes));
            }
        } else if !rv_match.is_empty() {
            return Err(list_options_invalid(vec![FieldError {
                field: "resourceVersionMatch".into(),
                reason: "FieldValueForbidden",
                message: "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
            }]));
        }
        let from = match (
            self.send_initial_events.is_some(),
            send_initial_events,
            resource_version,
        ) {
            (true, true, _) => WatchFrom::InitialState,
            (true, false, None | Some(0)) => WatchFrom::Latest,
            (true, false, Some(rv)) => WatchFrom::After(rv),
            (false, _, None | Some(0)) => WatchFrom::InitialState,
            (false, _, Some(rv)) => WatchFrom::After(rv),
        };
        Ok(WatchParams {
            from,
            send_initial_events,
            allow_bookmarks,
            resource_version,
            // 0, as none, is the server's choice (kube-apiserver's ListResource); a negative
            // timeout has passed already, and the watch ends at once, as in kube-apiserver.
            timeout: match self.timeout_seconds.as_deref() {
                None | Some("") => None,
                Some(s) => match parse_i64(s)? {
                    0 => None,
                    t => Some(Duration::from_secs(u64::try_from(t).unwrap_or(0))),
                },
            },
        })
    }

    /// `resourceVersion` + `resourceVersionMatch` for a list, validated as ListOptions are.
    pub(crate) fn read_at(&self) -> Result<ReadAt> {
        let rv = self.resource_version()?;
        match (self.resource_version_match.as_deref(), rv) {
            (None | Some(""), None) => Ok(ReadAt::Latest),
            (None | Some(""), Some(0)) => Ok(ReadAt::Any),
            (None | Some(""), Some(rv)) | (Some("NotOlderThan"), Some(rv)) => {
                Ok(ReadAt::NotOlderThan(rv))
            }
            (Some("Exact"), Some(0)) => Err(list_options_invalid(vec![FieldError::invalid(
                "resourceVersionMatch",
                "\"Exact\"",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            )])),
            (Some("Exact"), Some(rv)) => Ok(ReadAt::Exact(rv)),
            (Some("NotOlderThan" | "Exact"), None) => {
                Err(list_options_invalid(vec![FieldError {
                    field: "resourceVersionMatch".into(),
                    reason: "FieldValueForbidden",
                    message: "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
                }]))
            }
            (Some(other), _) => Err(list_options_invalid(vec![FieldError {
                field: "resourceVersionMatch".into(),
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            }])),
        }
    }
}

/// A DELETE's body: DeleteOptions, or nothing.
pub(crate) fn parse_delete_options(body: &[u8]) -> Result<DeleteOptions> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DeleteOptions::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| Error::BadRequest(format!("invalid DeleteOptions: {e}")))
}

pub(crate) fn dry_run_of(options: &DeleteOptions, query: &Query) -> Result<bool> {
    let from_body = match options.dry_run.as_deref() {
        None | Some([]) => false,
        Some([all]) if all == "All" => true,
        Some(other) => {
            return Err(Error::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    Ok(from_body || query.dry_run()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(raw: &str) -> Query {
        parse_query(Some(raw)).unwrap()
    }

    fn bad_request(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Err(Error::BadRequest(message)) => message,
            other => panic!("expected 400, got {other:?}"),
        }
    }

    /// The fields of a 422 on ListOptions, with their reasons.
    fn invalid(result: Result<impl std::fmt::Debug>) -> Vec<(String, &'static str)> {
        match result {
            Err(Error::Invalid { subject, causes }) => {
                assert_eq!(subject.kind, "ListOptions");
                assert_eq!(subject.group, "meta.k8s.io");
                causes.into_iter().map(|c| (c.field, c.reason)).collect()
            }
            other => panic!("expected 422, got {other:?}"),
        }
    }

    #[test]
    fn a_parameter_given_twice_takes_its_first_value() {
        let q = query("limit=5&limit=7&watch=false&watch=true&unknown=1");
        assert_eq!(q.limit().unwrap(), Some(5));
        assert!(!parse_bool("watch", q.watch.as_deref()).unwrap());
    }

    #[test]
    fn limit_and_timeout_are_go_integers() {
        assert_eq!(query("limit=-1").limit().unwrap(), None);
        assert_eq!(query("limit=0").limit().unwrap(), None);
        assert_eq!(query("").limit().unwrap(), None);
        assert_eq!(
            bad_request(query("limit=abc").limit()),
            "strconv.ParseInt: parsing \"abc\": invalid syntax"
        );
        assert_eq!(
            bad_request(query("limit=99999999999999999999").limit()),
            "strconv.ParseInt: parsing \"99999999999999999999\": value out of range"
        );
        assert_eq!(
            query("timeoutSeconds=-5").timeout_seconds().unwrap(),
            Some(Duration::ZERO)
        );
        assert!(bad_request(query("timeoutSeconds=1.5").timeout_seconds()).contains("ParseInt"));
    }

    #[test]
    fn booleans_are_go_parse_bool() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(parse_bool("watch", Some(yes)).unwrap(), "{yes}");
        }
        for no in ["", "0", "f", "false", "False"] {
            assert!(!parse_bool("watch", Some(no)).unwrap(), "{no}");
        }
        assert!(bad_request(parse_bool("watch", Some("yes"))).contains("invalid value for watch"));
    }

    #[test]
    fn read_at_follows_resource_version_match() {
        let at = |raw: &str| query(raw).read_at();
        assert_eq!(at("").unwrap(), ReadAt::Latest);
        assert_eq!(at("resourceVersion=0").unwrap(), ReadAt::Any);
        assert_eq!(at("resourceVersion=7").unwrap(), ReadAt::NotOlderThan(7));
        assert_eq!(
            at("resourceVersion=7&resourceVersionMatch=NotOlderThan").unwrap(),
            ReadAt::NotOlderThan(7)
        );
        assert_eq!(
            at("resourceVersion=7&resourceVersionMatch=Exact").unwrap(),
            ReadAt::Exact(7)
        );
        assert_eq!(
            invalid(at("resourceVersion=0&resourceVersionMatch=Exact")),
            [("resourceVersionMatch".to_owned(), "FieldValueInvalid")]
        );
        assert_eq!(
            invalid(at("resourceVersionMatch=Exact")),
            [("resourceVersionMatch".to_owned(), "FieldValueForbidden")]
        );
        assert_eq!(
            invalid(at("resourceVersion=1&resourceVersionMatch=Newest")),
            [("resourceVersionMatch".to_owned(), "FieldValueNotSupported")]
        );
        assert!(bad_request(at("resourceVersion=x")).contains("resourceVersion"));
    }

    #[test]
    fn list_options() {
        let params = query("limit=10&continue=abc").list_params().unwrap();
        assert_eq!(params.limit, Some(10));
        assert_eq!(params.continue_token.as_deref(), Some("abc"));
        assert_eq!(
            query("continue=&resourceVersion=5")
                .list_params()
                .unwrap()
                .continue_token,
            None
        );
        assert_eq!(
            bad_request(query("continue=abc&resourceVersion=5").list_params()),
            "specifying resource version is not allowed when using continue"
        );
        assert!(
            query("continue=abc&resourceVersion=0")
                .list_params()
                .is_ok()
        );
        assert_eq!(
            invalid(query("sendInitialEvents=true").list_params()),
            [("sendInitialEvents".to_owned(), "FieldValueForbidden")]
        );
        assert!(bad_request(query("timeoutSeconds=x").list_params()).contains("ParseInt"));
    }

    #[test]
    fn watch_options() {
        let from = |raw: &str| query(raw).watch_params().map(|p| p.from);
        assert_eq!(from("").unwrap(), WatchFrom::InitialState);
        assert_eq!(from("resourceVersion=0").unwrap(), WatchFrom::InitialState);
        assert_eq!(from("resourceVersion=9").unwrap(), WatchFrom::After(9));
        let list =
            "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan";
        assert_eq!(from(list).unwrap(), WatchFrom::InitialState);
        let no_initial = "sendInitialEvents=false&resourceVersionMatch=NotOlderThan";
        assert_eq!(from(no_initial).unwrap(), WatchFrom::Latest);
        assert_eq!(
            from(&format!("{no_initial}&resourceVersion=4")).unwrap(),
            WatchFrom::After(4)
        );
        assert_eq!(
            invalid(query("sendInitialEvents=true").watch_params()),
            [
                ("resourceVersionMatch".to_owned(), "FieldValueForbidden"),
                ("allowWatchBookmarks".to_owned(), "FieldValueForbidden"),
            ]
        );
        assert_eq!(
            invalid(query("resourceVersionMatch=NotOlderThan").watch_params()),
            [("resourceVersionMatch".to_owned(), "FieldValueForbidden")]
        );
        let params = query("timeoutSeconds=0&allowWatchBookmarks=1")
            .watch_params()
            .unwrap();
        assert_eq!(params.timeout, None, "0 is the server's choice");
        assert!(params.allow_bookmarks);
        assert_eq!(
            query("timeoutSeconds=30").watch_params().unwrap().timeout,
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn write_options() {
        assert!(query("dryRun=All").dry_run().unwrap());
        assert!(!query("").dry_run().unwrap());
        assert!(bad_request(query("dryRun=Some").dry_run()).contains("supported values: \"All\""));
        assert_eq!(
            query("fieldValidation=Strict").field_validation().unwrap(),
            FieldValidation::Strict
        );
        assert_eq!(query("").field_validation().unwrap(), FieldValidation::Warn);
        assert!(
            bad_request(query("fieldValidation=strict").field_validation())
                .contains("Unsupported value")
        );
        assert_eq!(
            query("includeObject=None").include_object().unwrap(),
            IncludeObject::None
        );
    }

    #[test]
    fn delete_options_from_the_body_or_the_query() {
        let empty = parse_delete_options(b"  ").unwrap();
        assert!(!dry_run_of(&empty, &query("")).unwrap());
        assert!(dry_run_of(&empty, &query("dryRun=All")).unwrap());
        let body = br#"{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"],
            "preconditions":{"uid":"u-1","resourceVersion":"5"},"propagationPolicy":"Background"}"#;
        let options = parse_delete_options(body).unwrap();
        assert!(dry_run_of(&options, &query("")).unwrap());
        let preconditions = options.preconditions.unwrap();
        assert_eq!(preconditions.uid.as_deref(), Some("u-1"));
        assert_eq!(preconditions.resource_version.as_deref(), Some("5"));
        let other = parse_delete_options(br#"{"dryRun":["Some"]}"#).unwrap();
        assert!(bad_request(dry_run_of(&other, &query(""))).contains("supported values"));
        assert!(bad_request(parse_delete_options(b"{")).starts_with("invalid DeleteOptions"));
    }
}
