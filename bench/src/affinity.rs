//! CPU pinning: farm-apiserver and the ceiling on one set of cores, the load generator on the
//! others, so neither time-slices the other's threads (on a shared 2-core machine that
//! time-slicing is most of the tail latency).

use std::{io, os::unix::process::CommandExt, process::Command};

/// Restricts the calling thread, and every thread and process it starts afterwards, to `cpus`.
pub fn pin_current(cpus: &[usize]) -> io::Result<()> {
    apply(&cpu_set(cpus)?)
}

/// Starts `command`'s process on `cpus` only; its runtime then sizes itself to them
/// (`available_parallelism` follows the affinity mask).
pub fn pin_command(command: &mut Command, cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus)?;
    // SAFETY: the closure runs between fork and exec and only makes one syscall on a set built
    // before the fork: no allocation, no locks.
    unsafe {
        command.pre_exec(move || apply(&set));
    }
    Ok(())
}

/// The CPUs this process may run on.
pub fn allowed() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the set is a valid cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every index is below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Which CPUs the servers and the load generator get: as asked; else, with two or more CPUs,
/// the first half (rounded up) for the servers and the rest for the load generator; with one,
/// nothing pinned.
pub fn split(allowed: &[usize], server: &[usize], load: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let rest = |taken: &[usize]| -> Vec<usize> {
        allowed
            .iter()
            .copied()
            .filter(|c| !taken.contains(c))
            .collect()
    };
    match (server.is_empty(), load.is_empty()) {
        (false, false) => (server.to_vec(), load.to_vec()),
        (false, true) => (server.to_vec(), rest(server)),
        (true, false) => (rest(load), load.to_vec()),
        (true, true) if allowed.len() >= 2 => {
            let (servers, loads) = allowed.split_at(allowed.len().div_ceil(2));
            (servers.to_vec(), loads.to_vec())
        }
        (true, true) => (Vec::new(), Vec::new()),
    }
}

fn cpu_set(cpus: &[usize]) -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::other(format!("no CPU {cpu}")));
        }
        // SAFETY: cpu is below CPU_SETSIZE, so CPU_SET writes inside the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Ok(set)
}

fn apply(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: pid 0 is the calling thread; the set is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn two_cpus_split_one_each_and_explicit_lists_win() {
        assert_eq!(split(&[0, 1], &[], &[]), (vec![0], vec![1]));
        assert_eq!(split(&[0, 1, 2], &[], &[]), (vec![0, 1], vec![2]));
        assert_eq!(split(&[4, 5, 6, 7], &[], &[7]), (vec![4, 5, 6], vec![7]));
        assert_eq!(split(&[0, 1], &[1], &[]), (vec![1], vec![0]));
        assert_eq!(split(&[3], &[], &[]), (vec![], vec![]));
    }
}
