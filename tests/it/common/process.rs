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
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `farm-apiserver --bind 127.0.0.1:0 --log-format json <args>` and waits until it
    /// logs the address it serves.
    pub fn start<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_farm-apiserver"))
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
        let addr = loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .expect("server logs that it serves");
            let Ok(log) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if log["message"] == "serving farm.example.com/v1alpha" {
                break log["addr"]
                    .as_str()
                    .expect("addr")
                    .parse()
                    .expect("socket addr");
            }
        };
        Running { child, addr, lines }
    }
}
