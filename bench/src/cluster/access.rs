//! Reaching the lab's cluster as its kubeconfig says: the API server, the client certificate,
//! kubectl, and the control plane's processes (whose CPU the scenario counts).

use super::*;

/// How to reach the cluster and as whom: a kubeconfig's current context.
pub struct Access {
    pub url: String,
    pub user: String,
    /// The host the server's certificate is verified for.
    pub host: String,
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub identity: (String, String),
}

/// Reads the current context's server, CA and client certificate (inline `*-data` or files).
pub fn read_access(path: &Path) -> Result<Access> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let config: Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("parsing kubeconfig {}", path.display()))?;
    let named = |list: &str, name: &str, field: &str| -> Result<Value> {
        config[list]
            .as_array()
            .and_then(|items| items.iter().find(|i| i["name"] == name))
            .map(|i| i[field].clone())
            .with_context(|| format!("kubeconfig: no {list} entry {name:?}"))
    };
    let current = config["current-context"]
        .as_str()
        .context("kubeconfig: no current-context")?;
    let context = named("contexts", current, "context")?;
    let cluster_name = context["cluster"].as_str().context("context: no cluster")?;
    let user = context["user"].as_str().context("context: no user")?;
    let cluster = named("clusters", cluster_name, "cluster")?;
    let auth = named("users", user, "user")?;
    let dir = path.parent().unwrap_or(Path::new("."));
    // `<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig).
    let pem = |entry: &Value, key: &str| -> Result<String> {
        if let Some(data) = entry[format!("{key}-data")].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .with_context(|| format!("kubeconfig: {key}-data"))?;
            return Ok(String::from_utf8(bytes)?);
        }
        let file = entry[key].as_str().with_context(|| {
            format!("kubeconfig: no {key}(-data) (scenario 8 needs a client certificate)")
        })?;
        std::fs::read_to_string(dir.join(file)).with_context(|| format!("reading {file}"))
    };
    let url = cluster["server"]
        .as_str()
        .context("kubeconfig: cluster without server")?
        .to_owned();
    let uri: http::Uri = url.parse().with_context(|| format!("server {url}"))?;
    ensure!(uri.scheme_str() == Some("https"), "server {url}: not https");
    let host = uri
        .host()
        .context("server without a host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let addr = (host.as_str(), uri.port_u16().unwrap_or(443))
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("resolving {host}"))?;
    Ok(Access {
        user: user.to_owned(),
        host,
        addr,
        ca_pem: pem(&cluster, "certificate-authority")?,
        identity: (pem(&auth, "client-certificate")?, pem(&auth, "client-key")?),
        url,
    })
}

/// kubectl against the cluster, with a cache of its own.
pub(crate) struct Kubectl {
    pub(crate) kubeconfig: PathBuf,
    pub(crate) cache: tempfile::TempDir,
}

impl Kubectl {
    /// (success, stdout, stderr).
    pub(crate) fn try_run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .env_remove("KUBECONFIG")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => return (false, String::new(), format!("running kubectl: {e}")),
        };
        if let Some(mut pipe) = child.stdin.take() {
            use std::io::Write;
            if let Some(input) = stdin {
                let _ = pipe.write_all(input.as_bytes());
            }
        }
        match child.wait_with_output() {
            Ok(out) => (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ),
            Err(e) => (false, String::new(), e.to_string()),
        }
    }

    pub(crate) fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let (ok, out, err) = self.try_run(args, stdin);
        ensure!(
            ok,
            "kubectl {}: {}{}",
            args.join(" "),
            err.trim(),
            out.trim()
        );
        Ok(out)
    }
}

/// kube-apiserver's and etcd's processes, when the cluster runs on this host (for their CPU
/// time; they are never pinned).
pub(crate) fn control_plane(access: &Access) -> Vec<(&'static str, u32)> {
    if !access.addr.ip().is_loopback() {
        return Vec::new();
    }
    let port = access.addr.port();
    let apiservers: Vec<u32> = procfs::pids_named("kube-apiserver")
        .into_iter()
        .filter(|&pid| {
            let args = procfs::cmdline(pid);
            let flag = args.iter().position(|a| a.starts_with("--secure-port"));
            let value = flag.and_then(|i| {
                args[i]
                    .strip_prefix("--secure-port=")
                    .map(str::to_owned)
                    .or_else(|| args.get(i + 1).cloned())
            });
            value.map_or(port == 6443, |v| v == port.to_string())
        })
        .collect();
    let etcds = procfs::pids_named("etcd");
    let mut found = Vec::new();
    if let [pid] = apiservers[..] {
        found.push(("kube-apiserver", pid));
    }
    if let [pid] = etcds[..] {
        found.push(("etcd", pid));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfigs_current_context_gives_the_server_ca_and_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(dir.path().join("other.key"), "OTHER KEY").unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: elsewhere
  cluster: {{server: 'https://10.0.0.1'}}
- name: lab
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: {}
contexts:
- name: other
  context: {{cluster: elsewhere, user: other}}
- name: lab
  context: {{cluster: lab, user: lab-admin}}
users:
- name: other
  user: {{client-certificate-data: eA==, client-key: other.key}}
- name: lab-admin
  user:
    client-certificate-data: {}
    client-key: other.key
",
                b64("CA PEM"),
                b64("CERT PEM")
            ),
        )
        .unwrap();
        let access = read_access(&kubeconfig).unwrap();
        assert_eq!(access.url, "https://127.0.0.1:6443");
        assert_eq!(access.user, "lab-admin");
        assert_eq!(access.host, "127.0.0.1");
        assert_eq!(access.addr, "127.0.0.1:6443".parse().unwrap());
        assert_eq!(access.ca_pem, "CA PEM");
        // Inline data, or a file relative to the kubeconfig.
        assert_eq!(access.identity, ("CERT PEM".into(), "OTHER KEY".into()));
    }

    #[test]
    fn the_install_runs_the_server_here_behind_an_external_name_service() {
        let certs = tempfile::tempdir().unwrap();
        std::fs::write(certs.path().join("ca.crt"), "CA").unwrap();
        let rendered = vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "farm-system"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "farm-apiserver"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "farm-apiserver-tls-x"}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "farm-apiserver"},
                   "spec": {"type": "ClusterIP"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "farm:view"}}),
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                   "metadata": {"name": API_SERVICE},
                   "spec": {"group": GROUP, "version": VERSION, "caBundle": "QUJD",
                            "service": {"name": SERVICE, "namespace": SERVICE_NAMESPACE, "port": 443}}}),
        ];
        let items = objects(rendered, certs.path(), 41234, "farm-bench-1").unwrap();
        let kinds: Vec<&str> = items.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "ClusterRole",
                "APIService",
                "Service",
                "CustomResourceDefinition",
                "Namespace"
            ]
        );
        let api_service = &items[2];
        assert_eq!(api_service["spec"]["service"]["port"], 41234);
        assert_eq!(
            api_service["spec"]["caBundle"], "QUJD",
            "the manifests' own"
        );
        assert_eq!(items[3]["spec"]["type"], "ExternalName");
        assert_eq!(items[3]["spec"]["externalName"], "localhost");
        assert_eq!(items[3]["spec"]["ports"][0]["port"], 41234);
        assert_eq!(items[4]["spec"]["group"], CRD_GROUP);
        assert_eq!(items[4]["spec"]["names"]["plural"], "llamas");
        assert_eq!(items[5]["metadata"]["name"], "farm-bench-1");

        // Manifests without an APIService: one is made, trusting the certs' CA.
        let items = objects(Vec::new(), certs.path(), 41234, "farm-bench-1").unwrap();
        let api_service = items.iter().find(|o| o["kind"] == "APIService").unwrap();
        assert_eq!(api_service["spec"]["caBundle"], "Q0E=");
        assert_eq!(api_service["spec"]["service"]["port"], 41234);
        assert!(
            items
                .iter()
                .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == SERVICE_NAMESPACE)
        );
    }

    #[test]
    fn both_kinds_get_the_same_llamas() {
        let (a, c) = (
            llama("farm.example.com/v1alpha", 7),
            llama("crd.farm.example.com/v1alpha", 7),
        );
        assert_eq!(a["metadata"], c["metadata"]);
        assert_eq!(a["spec"], c["spec"]);
        assert_eq!(a["metadata"]["name"], "l-00007");
    }
}
