//! Command line and environment: every flag has a `FARM_…` variable.

use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::{
    auth::source::StaticSources,
    rest::RestSettings,
    server::{self, InflightLimits, ReviewCache, ShutdownTiming},
    store::{
        PodCache, StorageFactory,
        etcd::{EtcdClient, EtcdConfig},
    },
    tls::{self, ServingFiles},
};

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    Plain,
    /// One JSON object per line, fields at the top level.
    Json,
}

/// farm-apiserver: the Kubernetes aggregated API server for farm.example.com/v1alpha.
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
    #[arg(long, env = "FARM_AUDIT_LOG_MODE", value_enum, default_value_t = crate::audit::Mode::Blocking)]
    pub audit_log_mode: crate::audit::Mode,

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

    /// When the webhook's buffer is full: `batch` drops the event (counted and logged),
    /// `blocking` makes the request wait for room.
    #[arg(long, env = "FARM_AUDIT_WEBHOOK_MODE", value_enum, default_value_t = crate::audit::Mode::Batch)]
    pub audit_webhook_mode: crate::audit::Mode,

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
    /// Writes the files (see [`tls::write_install_certificates`]) and says what to do next.
    pub fn run(&self) -> anyhow::Result<()> {
        tls::write_install_certificates(&self.out, &self.service, &self.namespace)
            .with_context(|| format!("writing certificates to {}", self.out.display()))?;
        println!(
            "wrote {dir}/{{ca.crt,ca.key,tls.crt,tls.key,{patch}}}: a serving certificate for {svc}.{ns}.svc and the APIService caBundle; next: kubectl apply -k manifests/",
            dir = self.out.display(),
            patch = tls::CA_BUNDLE_PATCH,
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

impl Args {
    /// The audit backends the flags ask for (the log, the webhook, or both): none without a
    /// policy and a backend.
    pub async fn auditor(&self) -> anyhow::Result<Option<Arc<crate::audit::Auditor>>> {
        let backend = self.audit_log_path.is_some() || self.audit_webhook_config_file.is_some();
        let (Some(policy), true) = (&self.audit_policy_file, backend) else {
            if backend {
                tracing::warn!("an audit backend without --audit-policy-file: nothing is audited");
            }
            return Ok(None);
        };
        let text = std::fs::read_to_string(policy)
            .with_context(|| format!("reading the audit policy {}", policy.display()))?;
        let policy = crate::audit::Policy::parse(&text)
            .map_err(|e| anyhow::anyhow!("audit policy {}: {e}", policy.display()))?;
        let metrics = Arc::default();
        let mut backends = Vec::new();
        if let Some(path) = &self.audit_log_path {
            let sink = crate::audit::log::start(
                crate::audit::log::LogOptions {
                    path: path.clone(),
                    max_age_days: self.audit_log_maxage,
                    max_backups: self.audit_log_maxbackup,
                    max_size_mb: self.audit_log_maxsize,
                },
                self.audit_log_batch_buffer_size,
            )
            .with_context(|| format!("opening the audit log {}", path.display()))?;
            tracing::info!(path = %path.display(), "audit log on");
            backends.push((sink, self.audit_log_mode, "log"));
        }
        if let Some(path) = &self.audit_webhook_config_file {
            let options = crate::audit::webhook::WebhookOptions {
                buffer_size: self.audit_webhook_batch_buffer_size,
                max_size: self.audit_webhook_batch_max_size.max(1),
                max_wait: self.audit_webhook_batch_max_wait,
                throttle: self.audit_webhook_batch_throttle_enable.then_some((
                    self.audit_webhook_batch_throttle_qps,
                    self.audit_webhook_batch_throttle_burst,
                )),
                initial_backoff: self.audit_webhook_initial_backoff,
            };
            let sink = crate::audit::webhook::start(path, options, Arc::clone(&metrics))
                .await
                .with_context(|| format!("the audit webhook {}", path.display()))?;
            tracing::info!(config = %path.display(), "audit webhook on");
            backends.push((sink, self.audit_webhook_mode, "webhook"));
        }
        Ok(Some(crate::audit::Auditor::with_backends(
            policy, backends, metrics,
        )))
    }

    /// How to reach etcd, from the `--etcd-*` flags.
    pub fn etcd_config(&self) -> anyhow::Result<EtcdConfig> {
        let tls = match (&self.etcd_cafile, &self.etcd_certfile, &self.etcd_keyfile) {
            (None, None, None) => None,
            (ca, cert, key) => {
                let mut roots = rustls::RootCertStore::empty();
                if let Some(ca) = ca {
                    let pem =
                        std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
                    for cert in tls::load_certs(&pem)? {
                        roots.add(cert)?;
                    }
                }
                let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
                Some(match (cert, key) {
                    (Some(cert), Some(key)) => {
                        let chain = tls::load_certs(
                            &std::fs::read(cert)
                                .with_context(|| format!("reading {}", cert.display()))?,
                        )?;
                        let key = <rustls_pki_types::PrivateKeyDer as rustls_pki_types::pem::PemObject>::from_pem_slice(
                            &std::fs::read(key)
                                .with_context(|| format!("reading {}", key.display()))?,
                        )
                        .with_context(|| format!("reading the key {}", key.display()))?;
                        builder.with_client_auth_cert(chain, key)?
                    }
                    _ => builder.with_no_client_auth(),
                })
            }
        };
        Ok(EtcdConfig {
            endpoints: self.etcd_servers.clone(),
            tls,
            request_timeout: Duration::from_secs(5),
        })
    }

    /// Installs the global tracing subscriber for `--log-level` and `--log-format`; an error
    /// when the filter does not parse or a subscriber is already installed.
    pub fn init_logging(&self) -> anyhow::Result<()> {
        let filter = EnvFilter::try_new(&self.log_level)
            .with_context(|| format!("invalid --log-level {:?}", self.log_level))?;
        let registry = tracing_subscriber::registry().with(filter);
        let ansi = std::io::stdout().is_terminal();
        match self.log_format {
            LogFormat::Plain => registry.with(fmt::layer().with_ansi(ansi)).try_init()?,
            LogFormat::Json => registry
                .with(fmt::layer().json().flatten_event(true))
                .try_init()?,
        }
        Ok(())
    }

    /// The watch and request timeouts from the flags, each clamped to between a second and a
    /// year.
    pub fn rest_settings(&self) -> RestSettings {
        RestSettings {
            min_request_timeout: seconds(self.min_request_timeout),
            bookmark_interval: seconds(self.watch_bookmark_interval),
            request_timeout: seconds(self.request_timeout),
            garbage_collection: false,
        }
    }

    /// The cluster FarmPods come from: --kubeconfig, KUBECONFIG, or in-cluster config. None
    /// (standalone) when there is none, or when the kubeconfig names this server itself (the
    /// development kubeconfig it writes, which README has kubectl users export): that would
    /// make the server a client of itself, never ready. `addr` is where it listens.
    async fn cluster_client(&self, addr: SocketAddr) -> anyhow::Result<Option<kube::Client>> {
        if self.standalone {
            return Ok(None);
        }
        let path = self
            .kubeconfig
            .clone()
            .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from));
        let config = if let Some(path) = path {
            let kubeconfig = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?;
            if names_this_server(&config.cluster_url, addr) {
                tracing::info!(
                    kubeconfig = %path.display(),
                    cluster = %config.cluster_url,
                    "the kubeconfig names this server itself, not a cluster: running standalone"
                );
                return Ok(None);
            }
            config
        } else if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            kube::Config::incluster().context("loading the in-cluster configuration")?
        } else {
            return Ok(None);
        };
        tracing::info!(cluster = %config.cluster_url, "using this cluster for FarmPods and authorization");
        Ok(Some(kube::Client::try_from(config)?))
    }

    fn read(path: &Option<PathBuf>) -> anyhow::Result<Option<String>> {
        path.as_ref()
            .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
            .transpose()
    }

    /// The serving certificate's files: `--tls-cert-file` and its key, or the development ones
    /// in `--cert-dir` (made when missing, with a kubeconfig for `addr`), whose CA then also
    /// authenticates clients (the kubeconfig's identity). A server given a certificate never
    /// trusts a development CA.
    fn serving_files(&self, addr: SocketAddr) -> anyhow::Result<(ServingFiles, Option<String>)> {
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_private_key_file) {
            let files = ServingFiles {
                cert: cert.clone(),
                key: key.clone(),
            };
            return Ok((files, None));
        }
        let ca = tls::ensure_dev_certificates(&self.cert_dir, &tls::local_url(addr)).with_context(
            || format!("preparing dev certificates in {}", self.cert_dir.display()),
        )?;
        tracing::info!(
            kubeconfig = %self.cert_dir.join(tls::KUBECONFIG).display(),
            "development certificates ready"
        );
        Ok((ServingFiles::development(&self.cert_dir), Some(ca)))
    }

    /// Where the kinds' objects live (`--storage`, `--etcd-*`; the memory store seeded as
    /// `--no-sample-data` and `--synthetic-llamas` say), and the FarmPods: synthetic, the Pods
    /// of `cluster`, or none (503).
    pub fn storage(&self, cluster: Option<&kube::Client>) -> anyhow::Result<StorageFactory> {
        let pods = match (self.synthetic_pods, cluster) {
            (Some(count), _) => PodCache::synthetic(count),
            (None, Some(client)) => {
                PodCache::start(client.clone(), self.farmpod_namespaces.clone())
            }
            (None, None) => {
                tracing::info!(
                    "no cluster configured: FarmPods answer 503, Llamas are served, only the dev identity is authorized"
                );
                PodCache::without_cluster()
            }
        };
        Ok(match self.storage {
            Storage::Memory => StorageFactory::memory(pods).seed(crate::resources::llama::seed(
                !self.no_sample_data,
                self.synthetic_llamas,
            )),
            Storage::Etcd => {
                let client =
                    EtcdClient::new(self.etcd_config()?).map_err(|e| anyhow::anyhow!("{e}"))?;
                tracing::info!(servers = ?self.etcd_servers, prefix = %self.etcd_prefix, "objects are stored in etcd");
                StorageFactory::etcd(client, &self.etcd_prefix, pods)
            }
        })
    }

    /// Runs the command, or serves until SIGTERM/SIGINT: logging, the listener, certificates,
    /// the cluster (when there is one) for FarmPods, TokenReview, SubjectAccessReview and
    /// admission, the storage, then [`server::build`] with the binary's kinds
    /// ([`crate::group::register`]). Returns when the server has stopped.
    pub async fn run(self) -> anyhow::Result<()> {
        if let Some(Command::Certs(certs)) = &self.command {
            return certs.run();
        }
        let started = std::time::Instant::now();
        self.init_logging()?;
        crate::recovery::install_hook();
        let auth_sources = StaticSources {
            requestheader_ca: Self::read(&self.requestheader_client_ca_file)?,
            requestheader_allowed_names: self.requestheader_allowed_names.clone(),
            client_ca: Self::read(&self.client_ca_file)?,
            dev_ca: None,
        };
        let listener = std::net::TcpListener::bind(self.bind)
            .with_context(|| format!("binding {}", self.bind))?;
        let addr = listener.local_addr()?;
        // Before the cluster: an exported KUBECONFIG may be the development one written here.
        let (serving, dev_ca) = self.serving_files(addr)?;
        let tracing_provider = self.start_tracing()?;
        let auditor = self.auditor().await?;
        let cluster = self.cluster_client(addr).await?;
        let storage = self.storage(cluster.as_ref())?;
        let mut rest = self.rest_settings();
        rest.garbage_collection = cluster.is_some();
        let config = server::Config {
            listener,
            serving,
            cert_reload_interval: Duration::from_secs(self.cert_reload_interval),
            auth_sources: StaticSources {
                dev_ca,
                ..auth_sources
            },
            review_cache: ReviewCache {
                allow: Duration::from_secs(self.authorization_cache_ttl),
                deny: Duration::from_secs(self.authorization_deny_cache_ttl),
                token: Duration::from_secs(self.authentication_cache_ttl),
            },
            cluster,
            follow_auth_configmap: true,
            storage,
            kinds: crate::group::register,
            rest,
            disable_admission_plugins: self.disable_admission_plugins.clone(),
            audit: auditor.clone(),
            inflight: InflightLimits {
                read_only: self.max_requests_inflight,
                mutating: self.max_mutating_requests_inflight,
            },
            limits: crate::connection::Limits {
                header_read: seconds(self.header_read_timeout),
                idle: seconds(self.idle_timeout),
                write_stall: seconds(self.write_timeout),
            },
        };
        let timing = ShutdownTiming {
            delay: Duration::from_secs(self.shutdown_delay),
            grace: Duration::from_secs(self.shutdown_grace),
        };
        let served = server::build(config).await?.serve(timing, started).await;
        // The last events and spans go out before the process ends.
        if let Some(auditor) = &auditor
            && tokio::time::timeout(Duration::from_secs(10), auditor.flush())
                .await
                .is_err()
        {
            tracing::warn!("the audit log could not be written to its end in 10 s");
        }
        if let Some(provider) = tracing_provider
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "sending the last spans");
        }
        served
    }

    /// Starts the traces `--tracing-config-file` asks for (none without it).
    fn start_tracing(&self) -> anyhow::Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>> {
        let Some(path) = &self.tracing_config_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the tracing configuration {}", path.display()))?;
        let config = crate::telemetry::TracingConfiguration::parse(&text)
            .map_err(|e| anyhow::anyhow!("tracing configuration {}: {e}", path.display()))?;
        let provider = crate::telemetry::start(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(
            endpoint = config.endpoint.as_deref().unwrap_or("localhost:4317"),
            sampling_rate_per_million = config.sampling_rate_per_million.unwrap_or(0),
            "tracing on"
        );
        Ok(Some(provider))
    }
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

        use crate::{resources::Llama, store::Store};
        let objects = |flags: &[&str]| {
            let args = Args::try_parse_from(["farm-apiserver"].iter().chain(flags)).unwrap();
            let storage = args.storage(None).unwrap();
            async move {
                let llamas = storage.store::<Llama>().stats().await.unwrap().objects;
                let pods = storage.pods().stats().await.unwrap().objects;
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
        use crate::resource::{GROUP, VERSION};
        assert_eq!(crate::tls::API_SERVICE, format!("{VERSION}.{GROUP}"));
    }
}
