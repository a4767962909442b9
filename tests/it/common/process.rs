//! The shipped binary as a child process on an ephemeral loopback port, its JSON log lines
//! read on a thread; killed when dropped.

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

pub struct Running {
    pub child: Child,
    pub addr: SocketAddr,
    pub lines: std::sync::mpsc::Receiver<String>,
    /// The lines logged up to "serving" (start-up).
    pub start_up: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `farm-apiserver --bind 127.0.0.1:0 --log-format json <args>` and waits until it
    /// logs the address it serves. Hermetic: none of the environment's cluster or flag
    /// variables reach it (a developer's `KUBECONFIG`, `FARM_*`), only what the test passes.
    pub fn start<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::start_with_env(args, &[])
    }

    /// [`Running::start`] with these environment variables set.
    pub fn start_with_env<I, S>(args: I, env: &[(&str, &OsStr)]) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(env!("CARGO_BIN_EXE_farm-apiserver"));
        for (name, _) in std::env::vars_os() {
            let selects = name.to_str().is_some_and(|n| {
                n.starts_with("FARM_") || n == "KUBECONFIG" || n.starts_with("KUBERNETES_")
            });
            if selects {
                command.env_remove(&name);
            }
        }
        command.envs(env.iter().copied());
        let mut child = command
            .args(["--bind", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start farm-apiserver");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut start_up = Vec::new();
        let addr = loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .expect("server logs that it serves");
            start_up.push(line.clone());
            let Ok(log) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if log["message"] == "serving" {
                break log["addr"]
                    .as_str()
                    .expect("addr")
                    .parse()
                    .expect("socket addr");
            }
        };
        Running {
            child,
            addr,
            lines,
            start_up,
        }
    }

    /// A client of it as the development kubeconfig's user (`system:masters`), trusting the
    /// development CA in `certs` (its `--cert-dir`).
    pub fn admin(&self, certs: &std::path::Path, alpn: super::Alpn) -> super::RawClient {
        let ca = std::fs::read_to_string(certs.join("ca.crt")).expect("ca.crt");
        let admin = aggregated_apiserver::net::tls::DevCa::load_or_create(certs)
            .expect("dev ca")
            .issue_client("farm-dev-admin", &["system:masters"])
            .expect("client cert");
        super::RawClient::new(self.addr, &ca, Some(admin), alpn)
    }
}
