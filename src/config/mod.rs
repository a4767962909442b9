//! Command line and environment: every flag has a `FARM_…` variable. What they start is in
//! `startup`.

mod startup;

use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use aggregated_apiserver::{
    auth::source::StaticSources,
    net::tls::{self, ServingFiles},
    rest::RestSettings,
    server::{self, InflightLimits, ReviewCache, ShutdownTiming},
    store::{
        StorageFactory,
        etcd::{EtcdClient, EtcdConfig},
    },
};

/// Who farm-apiserver says it is: OpenAPI's title, `/version` (the commit from `FARM_GIT_COMMIT`
/// at build time), its traces' service and its own metrics (`farm_apiserver_…`).
pub const IDENTITY: server::Identity = server::Identity {
    name: "farm-apiserver",
    version: env!("CARGO_PKG_VERSION"),
    git_commit: match option_env!("FARM_GIT_COMMIT") {
        Some(commit) => commit,
        None => "",
    },
};

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    Plain,
    /// One JSON object per line, fields at the top level.
    Json,
}

/// farm-apiserver: the Kubernetes aggregated API server for farm.example.com.
///
/// With no arguments it serves https://127.0.0.1:8443 with Llamas in memory, creates a
/// development CA and serving certificate under certs/, and writes certs/kubeconfig, so that
/// `kubectl --kubeconfig certs/kubeconfig get llamas` works at once.
#[derive(Debug, Clone, Parser)]
#[command(name = "farm-apiserver", version, about, long_about)]
pub struct Args {
    /// Without a command, serve.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Address and port to serve HTTPS on.
    #[arg(long, env = "FARM_BIND", default_value = "127.0.0.1:8443")]
    pub bind: SocketAddr,

    /// Directory for the development CA, serving certificate and kubeconfig, used when no
    /// --tls-cert-file is given. Files: ca.crt, ca.key, tls.crt, tls.key, kubeconfig.
    #[arg(long, env = "FARM_CERT_DIR", default_value = "certs")]
    pub cert_dir: PathBuf,

    /// Serving certificate (PEM, chain allowed), e.g. a mounted Secret's tls.crt. Reloaded when
    /// it changes on disk.
    #[arg(long, env = "FARM_TLS_CERT_FILE", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// Private key of --tls-cert-file (PEM).
    #[arg(long, env = "FARM_TLS_PRIVATE_KEY_FILE", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// CA bundle (PEM): its client certificates authenticate as user = CN, groups = O. Adds to
    /// `client-ca-file` of the extension-apiserver-authentication ConfigMap.
    #[arg(long, env = "FARM_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,

    /// CA bundle (PEM) of the front proxy (kube-apiserver's aggregator): its client
    /// certificates may name the user in X-Remote-* headers. Overrides the ConfigMap's.
    #[arg(long, env = "FARM_REQUESTHEADER_CLIENT_CA_FILE")]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// Front-proxy certificate CNs allowed (comma-separated); empty = any the CA signed.
    /// Overrides the ConfigMap's.
    #[arg(long, env = "FARM_REQUESTHEADER_ALLOWED_NAMES", value_delimiter = ',')]
    pub requestheader_allowed_names: Option<Vec<String>>,

    /// Seconds an allowing SubjectAccessReview answer is cached.
    #[arg(long, env = "FARM_AUTHORIZATION_CACHE_TTL", default_value_t = 10)]
    pub authorization_cache_ttl: u64,

    /// Seconds a denying SubjectAccessReview answer is cached.
    #[arg(long, env = "FARM_AUTHORIZATION_DENY_CACHE_TTL", default_value_t = 10)]
    pub authorization_deny_cache_ttl: u64,

    /// Seconds a TokenReview answer is cached.
    #[arg(long, env = "FARM_AUTHENTICATION_CACHE_TTL", default_value_t = 10)]
    pub authentication_cache_ttl: u64,

    /// How often to check the serving certificate files for changes, in seconds.
    #[arg(long, env = "FARM_CERT_RELOAD_INTERVAL", default_value_t = 10)]
    pub cert_reload_interval: u64,

    /// kubeconfig of the cluster whose Pods FarmPods show. Without it: KUBECONFIG, then the
    /// in-cluster service account; with neither, FarmPods answer 503 and Llamas still work.
    #[arg(long, env = "FARM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Run without any cluster, even when KUBECONFIG or in-cluster config is present.
    #[arg(long, env = "FARM_STANDALONE", conflicts_with = "kubeconfig")]
    pub standalone: bool,

    /// Watch Pods only in these namespaces (comma-separated); default: all namespaces.
    #[arg(long, env = "FARM_FARMPOD_NAMESPACES", value_delimiter = ',')]
    pub farmpod_namespaces: Vec<String>,

    /// Serve this many synthetic FarmPods instead of a cluster's (benchmarks, demos); a
    /// configured cluster is then used for authentication and authorization only.
    #[arg(long, env = "FARM_SYNTHETIC_PODS")]
    pub synthetic_pods: Option<usize>,

    /// Also start with this many generated Llamas `llama-<i>` in namespaces `bench-0..9`
    /// (benchmarks).
    #[arg(long, env = "FARM_SYNTHETIC_LLAMAS", default_value_t = 0)]
    pub synthetic_llamas: usize,

    /// Start with an empty Llama store instead of the sample `default/dolly` (memory storage;
    /// etcd storage never seeds).
    #[arg(long, env = "FARM_NO_SAMPLE_DATA")]
    pub no_sample_data: bool,

    /// Where Llamas live: `memory` (this process, lost on restart) or `etcd` (durable, shared
    /// by every replica pointed at the same etcd).
    #[arg(long, env = "FARM_STORAGE", value_enum, default_value_t = Storage::Memory)]
    pub storage: Storage,

    /// The version farm.example.com's kinds are stored at: `v1` (the default), or `v1alpha` to
    /// keep what a rollback to a v1alpha-only release can read. Objects stored at the other
    /// version are read as well, and rewritten at this one at their next write.
    #[arg(long, env = "FARM_STORAGE_VERSION", default_value = "v1", value_parser = ["v1", "v1alpha"])]
    pub storage_version: String,

    /// etcd client URLs (comma-separated), tried in turn (`--storage etcd`); kube-apiserver's
    /// name for it, also taken as `--etcd-endpoints`.
    #[arg(
        long,
        visible_alias = "etcd-endpoints",
        env = "FARM_ETCD_SERVERS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_servers: Vec<String>,

    /// The CA that signs etcd's serving certificates (`https://` servers).
    #[arg(long, env = "FARM_ETCD_CAFILE")]
    pub etcd_cafile: Option<PathBuf>,

    /// A client certificate for etcd (with `--etcd-keyfile`).
    #[arg(long, env = "FARM_ETCD_CERTFILE", requires = "etcd_keyfile")]
    pub etcd_certfile: Option<PathBuf>,

    /// The client certificate's private key.
    #[arg(long, env = "FARM_ETCD_KEYFILE", requires = "etcd_certfile")]
    pub etcd_keyfile: Option<PathBuf>,

    /// The prefix of every key farm-apiserver writes in etcd.
    #[arg(long, env = "FARM_ETCD_PREFIX", default_value = "/farm.example.com/")]
    pub etcd_prefix: String,

    /// Seconds between SIGTERM (readiness fails at once) and closing the listener, so that load
    /// balancers stop sending traffic first.
    #[arg(long, env = "FARM_SHUTDOWN_DELAY", default_value_t = 0)]
    pub shutdown_delay: u64,

    /// Seconds in-flight requests get to finish after the listener closes.
    #[arg(long, env = "FARM_SHUTDOWN_GRACE", default_value_t = 30)]
    pub shutdown_grace: u64,

    /// Watches without timeoutSeconds end after a random time between this many seconds and twice
    /// as many (kube-apiserver's --min-request-timeout).
    #[arg(long, env = "FARM_MIN_REQUEST_TIMEOUT", default_value_t = 1800)]
    pub min_request_timeout: u64,

    /// Seconds a client has to send a request's headers (kube-apiserver: 32); also how long an
    /// HTTP/1.1 connection may wait for its next request.
    #[arg(long, env = "FARM_HEADER_READ_TIMEOUT", default_value_t = 32)]
    pub header_read_timeout: u64,

    /// Seconds a connection may stay open with no request in flight (kube-apiserver: 90).
    #[arg(long, env = "FARM_IDLE_TIMEOUT", default_value_t = 90)]
    pub idle_timeout: u64,

    /// Seconds a connection's writes may make no progress (a client that stopped reading)
    /// before it is closed.
    #[arg(long, env = "FARM_WRITE_TIMEOUT", default_value_t = 60)]
    pub write_timeout: u64,

    /// Seconds a request other than a watch may take, its response included; past it, 504.
    #[arg(long, env = "FARM_REQUEST_TIMEOUT", default_value_t = 60)]
    pub request_timeout: u64,

    /// Admission plugins to turn off (kube-apiserver's flag). With a cluster,
    /// `NamespaceLifecycle` refuses creates in a namespace that does not exist or is being
    /// deleted, `MutatingAdmissionWebhook` and `ValidatingAdmissionWebhook` call the cluster's
    /// webhooks and `MutatingAdmissionPolicy` and `ValidatingAdmissionPolicy` apply its
    /// policies on every write; without one there is nothing to check.
    #[arg(long, env = "FARM_DISABLE_ADMISSION_PLUGINS", value_delimiter = ',')]
    pub disable_admission_plugins: Vec<String>,

    /// An `apiserver.config.k8s.io` TracingConfiguration (`endpoint`, `samplingRatePerMillion`):
    /// spans of each request, under the caller's `traceparent`, sent over OTLP/gRPC. Without it
    /// nothing is traced.
    #[arg(long, env = "FARM_TRACING_CONFIG_FILE")]
    pub tracing_config_file: Option<PathBuf>,

    /// Read-only requests (get, list) served at once; past it, 429 with `Retry-After: 1`
    /// (0: no limit). Watches are not counted, and `system:masters` is never refused.
    #[arg(long, env = "FARM_MAX_REQUESTS_INFLIGHT", default_value_t = 400)]
    pub max_requests_inflight: usize,

    /// Mutating requests (every other verb) served at once; past it, 429 (0: no limit).
    #[arg(
        long,
        env = "FARM_MAX_MUTATING_REQUESTS_INFLIGHT",
        default_value_t = 200
    )]
    pub max_mutating_requests_inflight: usize,

    /// An `audit.k8s.io/v1` Policy (YAML or JSON): which requests the audit log writes, and
    /// how much of each. Without it nothing is audited.
    #[arg(long, env = "FARM_AUDIT_POLICY_FILE")]
    pub audit_policy_file: Option<PathBuf>,

    /// Where audit events go, one JSON line each; `-` is standard output. Without it (or
    /// without a policy) nothing is audited.
    #[arg(long, env = "FARM_AUDIT_LOG_PATH")]
    pub audit_log_path: Option<PathBuf>,

    /// Days a rotated audit log is kept (0: no limit).
    #[arg(long, env = "FARM_AUDIT_LOG_MAXAGE", default_value_t = 366)]
    pub audit_log_maxage: u64,

    /// Rotated audit logs kept (0: no limit). kube-apiserver's name, singular.
    #[arg(long, env = "FARM_AUDIT_LOG_MAXBACKUP", default_value_t = 100)]
    pub audit_log_maxbackup: usize,

    /// MiB an audit log may reach before it is rotated (0: never).
    #[arg(long, env = "FARM_AUDIT_LOG_MAXSIZE", default_value_t = 100)]
    pub audit_log_maxsize: u64,

    /// When the audit buffer is full: `blocking` makes the request wait for room, `batch`
    /// drops the event (counted in `apiserver_audit_error_total` and logged).
    #[arg(long, env = "FARM_AUDIT_LOG_MODE", value_enum, default_value_t = aggregated_apiserver::audit::Mode::Blocking)]
    pub audit_log_mode: aggregated_apiserver::audit::Mode,

    /// Events the audit log's buffer holds before the mode decides.
    #[arg(
        long,
        env = "FARM_AUDIT_LOG_BATCH_BUFFER_SIZE",
        default_value_t = 10_000
    )]
    pub audit_log_batch_buffer_size: usize,

    /// A kubeconfig naming the audit webhook (its server's URL, CA and credentials): audit
    /// events are also POSTed there in batches, as `audit.k8s.io/v1` EventLists.
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_CONFIG_FILE")]
    pub audit_webhook_config_file: Option<PathBuf>,

    /// `batch`: events are sent in batches, and a full buffer drops them (counted and
    /// logged); `blocking`: a request is answered once its events have been sent.
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_MODE", value_enum, default_value_t = aggregated_apiserver::audit::Mode::Batch)]
    pub audit_webhook_mode: aggregated_apiserver::audit::Mode,

    /// Events the webhook's buffer holds.
    #[arg(
        long,
        env = "FARM_AUDIT_WEBHOOK_BATCH_BUFFER_SIZE",
        default_value_t = 10_000
    )]
    pub audit_webhook_batch_buffer_size: usize,

    /// Events per POST to the webhook at most.
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_BATCH_MAX_SIZE", default_value_t = 400)]
    pub audit_webhook_batch_max_size: usize,

    /// How long an event waits for others before its batch goes (Go's duration: `30s`).
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_BATCH_MAX_WAIT", default_value = "30s", value_parser = go_duration)]
    pub audit_webhook_batch_max_wait: Duration,

    /// Whether POSTs to the webhook are rate-limited.
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_BATCH_THROTTLE_ENABLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub audit_webhook_batch_throttle_enable: bool,

    /// POSTs a second to the webhook at most.
    #[arg(
        long,
        env = "FARM_AUDIT_WEBHOOK_BATCH_THROTTLE_QPS",
        default_value_t = 10.0
    )]
    pub audit_webhook_batch_throttle_qps: f64,

    /// POSTs to the webhook at once before the rate applies.
    #[arg(
        long,
        env = "FARM_AUDIT_WEBHOOK_BATCH_THROTTLE_BURST",
        default_value_t = 15
    )]
    pub audit_webhook_batch_throttle_burst: u32,

    /// The wait before a failed POST to the webhook is tried again (Go's duration).
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_INITIAL_BACKOFF", default_value = "10s", value_parser = go_duration)]
    pub audit_webhook_initial_backoff: Duration,

    /// Seconds between BOOKMARK events on watches that allow them.
    #[arg(long, env = "FARM_WATCH_BOOKMARK_INTERVAL", default_value_t = 60)]
    pub watch_bookmark_interval: u64,

    /// Log filter, in RUST_LOG syntax (e.g. `info`, `farm_apiserver=debug`). Release builds
    /// log down to `debug`; `trace` needs a debug build.
    #[arg(long, env = "FARM_LOG", default_value = "info")]
    pub log_level: String,

    /// Log format.
    #[arg(long, env = "FARM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

/// What to do instead of serving.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Write the certificates `kubectl apply -k manifests/` installs: a CA (kept when present,
    /// so the APIService's caBundle stays the same), a serving certificate for
    /// <service>.<namespace>.svc (issued anew), and the APIService caBundle patch.
    Certs(CertsArgs),
}

/// The arguments of `farm-apiserver certs`.
#[derive(Debug, Clone, clap::Args)]
pub struct CertsArgs {
    /// Namespace the server runs in.
    #[arg(long, default_value = "farm-system")]
    pub namespace: String,

    /// Name of the Service the APIService points at.
    #[arg(long, default_value = "farm-apiserver")]
    pub service: String,

    /// Directory to write ca.crt, ca.key, tls.crt, tls.key and apiservice-cabundle.yaml to.
    #[arg(long, default_value = "manifests/certs")]
    pub out: PathBuf,
}

impl CertsArgs {
    /// Writes the files (see [`crate::certs::write_install_certificates`]) and says what to do next.
    pub fn run(&self) -> anyhow::Result<()> {
        crate::certs::write_install_certificates(&self.out, &self.service, &self.namespace)
            .with_context(|| format!("writing certificates to {}", self.out.display()))?;
        println!(
            "wrote {dir}/{{ca.crt,ca.key,tls.crt,tls.key,{patch}}}: a serving certificate for {svc}.{ns}.svc and the APIService caBundle; next: kubectl apply -k manifests/",
            dir = self.out.display(),
            patch = crate::certs::CA_BUNDLE_PATCH,
            svc = self.service,
            ns = self.namespace,
        );
        Ok(())
    }
}

/// Whether `url` is this server listening on `addr`: its port, on a loopback address or
/// `localhost` (the development kubeconfig's `https://127.0.0.1:<port>`), or on the address
/// bound.
fn names_this_server(url: &axum::http::Uri, addr: SocketAddr) -> bool {
    let Some(host) = url.host() else {
        return false;
    };
    let port = url.port_u16().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let local = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip == addr.ip());
    port == addr.port() && local
}

/// A duration flag: at least a second, at most a year (so deadlines computed from it never
/// overflow).
fn seconds(value: u64) -> Duration {
    Duration::from_secs(value.clamp(1, 365 * 24 * 3600))
}

/// Where Llamas, and every other writable kind, live (`--storage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Storage {
    /// In this process: the embedded default.
    Memory,
    /// In etcd, shared by every replica.
    Etcd,
}

/// A duration as Go writes it (`30s`, `1m0s`, `500ms`), as kube-apiserver's flags take it.
fn go_duration(text: &str) -> Result<Duration, String> {
    let parsed: jiff::SignedDuration = text
        .parse()
        .map_err(|e| format!("{text:?} is not a duration such as 30s or 1m0s: {e}"))?;
    Duration::try_from(parsed).map_err(|_| format!("{text:?} is negative"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Args;

    #[test]
    fn a_kubeconfig_names_this_server_by_its_port_on_a_local_address() {
        let names = |url: &str, addr: &str| {
            super::names_this_server(&url.parse().unwrap(), addr.parse().unwrap())
        };
        assert!(names("https://127.0.0.1:8443", "0.0.0.0:8443"));
        assert!(names("https://localhost:8443", "127.0.0.1:8443"));
        assert!(names("https://[::1]:8443", "[::]:8443"));
        assert!(names("https://10.0.0.5:8443", "10.0.0.5:8443"));
        // Another port or another host is a cluster.
        assert!(!names("https://127.0.0.1:6443", "0.0.0.0:8443"));
        assert!(!names("https://10.0.0.5:8443", "0.0.0.0:8443"));
        assert!(!names("https://kubernetes.default.svc", "0.0.0.0:443"));
    }

    #[test]
    fn verify_cli() {
        Args::command().debug_assert();
    }

    #[test]
    fn durations_as_go_writes_them() {
        use std::time::Duration;
        for (text, expected) in [
            ("30s", Duration::from_secs(30)),
            ("1m0s", Duration::from_secs(60)),
            ("500ms", Duration::from_millis(500)),
            ("1h30m", Duration::from_secs(5400)),
        ] {
            assert_eq!(super::go_duration(text), Ok(expected), "{text}");
        }
        assert!(super::go_duration("-1s").is_err());
        assert!(super::go_duration("soon").is_err());
    }

    #[test]
    fn etcd_endpoints_is_another_name_for_etcd_servers() {
        use clap::Parser;
        let args = Args::try_parse_from([
            "farm-apiserver",
            "--storage",
            "etcd",
            "--etcd-endpoints",
            "https://10.0.0.1:2379,https://10.0.0.2:2379",
        ])
        .unwrap();
        assert_eq!(
            args.etcd_servers,
            ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
        );
    }

    #[tokio::test]
    async fn the_storage_follows_the_flags() {
        use clap::Parser;

        use crate::resources::{FarmPod, llama::v1::Llama};
        let objects = |flags: &[&str]| {
            let args = Args::try_parse_from(["farm-apiserver"].iter().chain(flags)).unwrap();
            let storage = args.storage(None).unwrap();
            async move {
                let llamas = storage.store::<Llama>().stats().await.unwrap().objects;
                let pods = storage.view::<FarmPod>().stats().await.unwrap().objects;
                (llamas, pods)
            }
        };
        assert_eq!(objects(&[]).await, (1, 0), "dolly, and no cluster");
        assert_eq!(objects(&["--no-sample-data"]).await, (0, 0));
        let bench = ["--synthetic-llamas", "3", "--synthetic-pods", "2"];
        assert_eq!(objects(&bench).await, (4, 2));
    }

    #[test]
    fn the_api_service_name_is_version_dot_group() {
        use crate::resources::{GROUP, VERSION};
        assert_eq!(crate::certs::API_SERVICES[1], format!("{VERSION}.{GROUP}"));
        assert_eq!(crate::certs::API_SERVICES[0], format!("v1.{GROUP}"));
    }
}
