//! Who the server says it is, wherever a client or an operator reads its name: OpenAPI's
//! `info`, `/version`, the service of its traces, the prefix of its own metrics.

/// Who the server says it is: OpenAPI's `info`, `/version`, the service name of its traces, and
/// the prefix of its own metrics (the name with `_` for `-`).
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    /// The server's name (`sample-apiserver`).
    pub name: &'static str,
    /// Its version (`0.1.0`): `/version` says `v<version>`.
    pub version: &'static str,
    /// The commit it was built from, when known.
    pub git_commit: &'static str,
}

impl Identity {
    /// `name` at `version`, from an unknown commit.
    pub const fn new(name: &'static str, version: &'static str) -> Self {
        Self {
            name,
            version,
            git_commit: "",
        }
    }

    /// The prefix of the server's own metrics.
    pub fn metrics_prefix(&self) -> String {
        self.name.replace(['-', '.'], "_")
    }
}

impl Default for Identity {
    /// This library, at its version.
    fn default() -> Self {
        Self::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
    }
}
