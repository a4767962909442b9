//! Who made a request, as every authenticator gives it.

use std::collections::BTreeMap;

/// Who made a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    /// The user name: the certificate's CN, `X-Remote-User`, or the TokenReview's username.
    pub name: String,
    /// Empty when the authenticator gave none (client certificates never do).
    pub uid: String,
    /// The certificate's O values, `X-Remote-Group`, or the TokenReview's groups; with
    /// `system:authenticated` added (see [`UserInfo::authenticated`]).
    pub groups: Vec<String>,
    /// `X-Remote-Extra-<key>` values, or the TokenReview's extra, passed on in
    /// SubjectAccessReviews.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The group every authenticated user is in, and the ones that rule it out.
pub const ALL_AUTHENTICATED: &str = "system:authenticated";
const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
const ANONYMOUS: &str = "system:anonymous";

impl UserInfo {
    /// In `system:masters`, the group that is always authorized.
    pub fn is_system_masters(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// k8s.io/apiserver's AuthenticatedGroupAdder, applied to every way a user authenticates:
    /// adds `system:authenticated` unless the user is anonymous or already carries it (or
    /// `system:unauthenticated`). The default RBAC binds discovery and `/openapi` to that
    /// group, so without it kube-apiserver (`system:aggregator`, sent with no group) could not
    /// download this server's OpenAPI.
    pub fn authenticated(mut self) -> Self {
        if self.name != ANONYMOUS
            && !self
                .groups
                .iter()
                .any(|g| g == ALL_AUTHENTICATED || g == ALL_UNAUTHENTICATED)
        {
            self.groups.push(ALL_AUTHENTICATED.to_owned());
        }
        self
    }
}

/// A user's groups for a log line, joined with commas only when the line is written.
pub struct Groups<'a>(pub &'a [String]);

impl std::fmt::Display for Groups<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, group) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(group)?;
        }
        Ok(())
    }
}
