//! What the flags start: logging, tracing, the audit backends, the cluster client, the
//! serving certificate, the storage, and then the server ([`aggregated_apiserver::server::build`]).

use super::*;

impl Args {
    /// The audit backends the flags ask for (the log, the webhook, or both): none without a
    /// policy and a backend.
    pub async fn auditor(
        &self,
    ) -> anyhow::Result<Option<Arc<aggregated_apiserver::audit::Auditor>>> {
        let backend = self.audit_log_path.is_some() || self.audit_webhook_config_file.is_some();
        let (Some(policy), true) = (&self.audit_policy_file, backend) else {
            if backend {
                tracing::warn!("an audit backend without --audit-policy-file: nothing is audited");
            }
            return Ok(None);
        };
        let text = std::fs::read_to_string(policy)
            .with_context(|| format!("reading the audit policy {}", policy.display()))?;
        let policy = aggregated_apiserver::audit::Policy::parse(&text)
            .map_err(|e| anyhow::anyhow!("audit policy {}: {e}", policy.display()))?;
        let metrics = Arc::default();
        let mut backends = Vec::new();
        if let Some(path) = &self.audit_log_path {
            let sink = aggregated_apiserver::audit::log::start(
                aggregated_apiserver::audit::log::LogOptions {
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
            let options = aggregated_apiserver::audit::webhook::WebhookOptions {
                buffer_size: self.audit_webhook_batch_buffer_size,
                max_size: self.audit_webhook_batch_max_size.max(1),
                max_wait: self.audit_webhook_batch_max_wait,
                throttle: self.audit_webhook_batch_throttle_enable.then_some((
                    self.audit_webhook_batch_throttle_qps,
                    self.audit_webhook_batch_throttle_burst,
                )),
                initial_backoff: self.audit_webhook_initial_backoff,
            };
            let sink =
                aggregated_apiserver::audit::webhook::start(path, options, Arc::clone(&metrics))
                    .await
                    .with_context(|| format!("the audit webhook {}", path.display()))?;
            tracing::info!(config = %path.display(), "audit webhook on");
            backends.push((sink, self.audit_webhook_mode, "webhook"));
        }
        Ok(Some(aggregated_apiserver::audit::Auditor::with_backends(
            policy, backends, metrics,
        )))
    }

    /// How to reach etcd, from the `--etcd-*` flags.
    pub fn etcd_config(&self) -> anyhow::Result<EtcdConfig> {
        let tls = match (&self.etcd_cafile, &self.etcd_certfile, &self.etcd_keyfile) {
            (None, None, None) => None,
            (ca, cert, key) => {
                let mut roots = Vec::new();
                if let Some(ca) = ca {
                    let pem =
                        std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
                    roots = tls::load_certs(&pem)?;
                }
                // etcd's CA trusted as Go's clients (etcd's own, kube-apiserver) trust it.
                let builder = aggregated_apiserver::net::client_tls::client_config(roots)?;
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
        Ok(Some(aggregated_apiserver::net::client_tls::kube_client(
            config,
        )?))
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
        let ca =
            tls::ensure_dev_certificates(&self.cert_dir, &tls::local_url(addr), &crate::certs::DEV)
                .with_context(|| {
                    format!("preparing dev certificates in {}", self.cert_dir.display())
                })?;
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
        use crate::resources::{
            farmpod,
            llama::{self, v1, v1alpha},
        };
        let storage = match self.storage {
            // Seeded at both versions: only the stored one's store is made.
            Storage::Memory => StorageFactory::memory()
                .seed(llama::seed::<v1::Llama>(
                    !self.no_sample_data,
                    self.synthetic_llamas,
                ))
                .seed(llama::seed::<v1alpha::Llama>(
                    !self.no_sample_data,
                    self.synthetic_llamas,
                )),
            Storage::Etcd => {
                let client =
                    EtcdClient::new(self.etcd_config()?).map_err(|e| anyhow::anyhow!("{e}"))?;
                tracing::info!(servers = ?self.etcd_servers, prefix = %self.etcd_prefix, "objects are stored in etcd");
                StorageFactory::etcd(client, &self.etcd_prefix)
            }
        };
        let storage = match (self.synthetic_pods, cluster) {
            (Some(count), _) => {
                storage.provide::<farmpod::FarmPod>(farmpod::synthetic_view(count));
                storage
            }
            (None, Some(client)) => {
                storage.viewing(client.clone(), self.farmpod_namespaces.clone())
            }
            (None, None) => {
                tracing::info!(
                    "no cluster configured: FarmPods answer 503, Llamas are served, only the dev identity is authorized"
                );
                storage
            }
        };
        Ok(storage.storing_at(&self.storage_version))
    }

    /// Runs the command, or serves until SIGTERM/SIGINT: logging, the listener, certificates,
    /// the cluster (when there is one) for FarmPods, TokenReview, SubjectAccessReview and
    /// admission, the storage, then [`server::build`] with the binary's kinds
    /// ([`crate::resources::register`]). `on_serving` is called when the listener accepts and again
    /// once the server is first ready (see [`server::Server::serve`]): the binary gives the
    /// allocator's spare memory back to the OS there.
    /// Returns when the server has stopped.
    pub async fn run(self, on_serving: fn()) -> anyhow::Result<()> {
        if let Some(Command::Certs(certs)) = &self.command {
            return certs.run();
        }
        let started = std::time::Instant::now();
        self.init_logging()?;
        aggregated_apiserver::observe::recovery::install_hook();
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
            kinds: crate::resources::register,
            rest,
            disable_admission_plugins: self.disable_admission_plugins.clone(),
            audit: auditor.clone(),
            inflight: InflightLimits {
                read_only: self.max_requests_inflight,
                mutating: self.max_mutating_requests_inflight,
            },
            limits: aggregated_apiserver::net::connection::Limits {
                header_read: seconds(self.header_read_timeout),
                idle: seconds(self.idle_timeout),
                write_stall: seconds(self.write_timeout),
            },
            identity: IDENTITY,
        };
        let timing = ShutdownTiming {
            delay: Duration::from_secs(self.shutdown_delay),
            grace: Duration::from_secs(self.shutdown_grace),
        };
        let served = server::build(config)
            .await?
            .serve(timing, (started, on_serving))
            .await;
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
        let config =
            aggregated_apiserver::observe::telemetry::TracingConfiguration::parse(&text)
                .map_err(|e| anyhow::anyhow!("tracing configuration {}: {e}", path.display()))?;
        let provider = aggregated_apiserver::observe::telemetry::start(&config, IDENTITY.name)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(
            endpoint = config.endpoint.as_deref().unwrap_or("localhost:4317"),
            sampling_rate_per_million = config.sampling_rate_per_million.unwrap_or(0),
            "tracing on"
        );
        Ok(Some(provider))
    }
}
