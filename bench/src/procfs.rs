//! Server CPU time and memory, read from /proc (Linux).

/// Clock ticks per second of /proc/<pid>/stat (USER_HZ; 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU seconds the process has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SECOND)
}

/// Resident set size in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The largest resident set size the process has had so far, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The machine's CPU ticks so far, from /proc/stat's `cpu` line.
#[derive(Clone, Copy)]
pub struct MachineTicks {
    /// Running processes (user, nice, system).
    pub busy: u64,
    /// Time the hypervisor gave to other guests: stolen from every figure measured meanwhile.
    pub steal: u64,
    pub total: u64,
}

pub fn machine_ticks() -> Option<MachineTicks> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    let field = |i: usize| ticks.get(i).copied();
    Some(MachineTicks {
        busy: field(0)? + field(1)? + field(2)?,
        steal: field(7)?,
        total: ticks.iter().take(8).sum(),
    })
}

/// Seconds per tick of /proc/stat and /proc/<pid>/stat.
pub const SECONDS_PER_TICK: f64 = 1.0 / TICKS_PER_SECOND;

/// Nanoseconds every thread of the process has run so far (the first field of each
/// /proc/<pid>/task/<tid>/schedstat): finer than the 10 ms ticks of `cpu_seconds`, for short
/// measurements. Threads that already exited are not counted; the servers keep theirs.
pub fn thread_cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let schedstat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Processes whose command name (/proc/<pid>/comm, 15 characters at most) is `comm`.
pub fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The process's command-line arguments.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The CPUs the process may run on, as the kernel lists them (e.g. `0-1`).
pub fn cpus_allowed(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))?;
    Some(line.split_whitespace().nth(1)?.to_owned())
}

/// The highest RSS of a process, sampled by a task every `every` from [`PeakRss::start`]
/// (which samples once first) until [`PeakRss::stop`].
pub struct PeakRss {
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    pub fn start(pid: u32, every: std::time::Duration) -> Self {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, AtomicU64, Ordering},
        };
        let peak = Arc::new(AtomicU64::new(rss_bytes(pid).unwrap_or(0)));
        let running = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn({
            let (peak, running) = (peak.clone(), running.clone());
            async move {
                while running.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_bytes(pid).unwrap_or(0), Ordering::Relaxed);
                    tokio::time::sleep(every).await;
                }
            }
        });
        Self {
            peak,
            running,
            task,
        }
    }

    /// Stops sampling; the highest RSS seen, in bytes.
    pub async fn stop(self) -> u64 {
        use std::sync::atomic::Ordering;
        self.running.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak.load(Ordering::Relaxed)
    }
}
