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

/// The machine's (steal, total) CPU ticks so far, from /proc/stat's `cpu` line: time the
/// hypervisor gave to other guests is stolen from every figure measured meanwhile.
pub fn steal_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    Some((*ticks.get(7)?, ticks.iter().take(8).sum()))
}

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
