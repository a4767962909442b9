//! The audit log backend (`--audit-log-path`): one JSON event per line, written by a thread of
//! its own from a bounded buffer, so no request waits on the disk. Files rotate as
//! kube-apiserver's (lumberjack) do: before a write would pass `maxsize` MiB the file is
//! renamed `<name>-<UTC time><ext>` and a new one begun; backups beyond `maxbackup`, or older
//! than `maxage` days, are removed.

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

/// Where and how the log is written (kube-apiserver's `--audit-log-*` flags).
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// The file; `-` is standard output.
    pub path: PathBuf,
    /// Days a rotated file is kept (0: no limit).
    pub max_age_days: u64,
    /// Rotated files kept (0: no limit).
    pub max_backups: usize,
    /// MiB a file may reach before it rotates (0: never).
    pub max_size_mb: u64,
}

/// The time format of a rotated file's name (Go's `2006-01-02T15-04-05.000`, UTC).
const BACKUP_TIME: &str = "%Y-%m-%dT%H-%M-%S%.3f";

/// How long the writer lets events gather between writes.
const BATCH_WAIT: Duration = Duration::from_millis(10);

/// Bytes gathered before a write to the file: a busy server's batch (10 ms of events, about
/// 600 bytes each) in a few system calls rather than one per 8 KiB.
const WRITE_BUFFER: usize = 256 * 1024;

/// What the buffer may hold in all, whatever the count of events: an event can carry a 3 MiB
/// request and its response.
pub const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;

/// What the writer is sent.
#[derive(Debug)]
pub enum Message {
    /// An event's line, and its share of the bytes the buffer may hold.
    Line(Vec<u8>, OwnedSemaphorePermit),
    /// Everything sent before is written: say so.
    Flush(oneshot::Sender<()>),
}

/// The buffer in front of a writer: at most so many events and [`MAX_QUEUED_BYTES`].
#[derive(Debug, Clone)]
pub struct Sink {
    sender: mpsc::Sender<Message>,
    bytes: Arc<Semaphore>,
}

/// The buffer is full (or its writer is gone).
#[derive(Debug)]
pub struct Full;

impl Sink {
    /// A buffer of `events` and the end the writer reads (tests read it themselves).
    pub fn channel(events: usize) -> (Self, mpsc::Receiver<Message>) {
        let (sender, receiver) = mpsc::channel(events.max(1));
        let sink = Self {
            sender,
            bytes: Arc::new(Semaphore::new(MAX_QUEUED_BYTES)),
        };
        (sink, receiver)
    }

    fn share(line: &[u8]) -> u32 {
        u32::try_from(line.len().clamp(1, MAX_QUEUED_BYTES)).unwrap_or(u32::MAX)
    }

    /// Queues `line`, waiting for room.
    pub async fn send(&self, line: Vec<u8>) -> Result<(), Full> {
        let permit = self
            .bytes
            .clone()
            .acquire_many_owned(Self::share(&line))
            .await
            .map_err(|_| Full)?;
        self.sender
            .send(Message::Line(line, permit))
            .await
            .map_err(|_| Full)
    }

    /// Queues `line` if there is room now.
    pub fn try_send(&self, line: Vec<u8>) -> Result<(), Full> {
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(Self::share(&line))
            .map_err(|_| Full)?;
        self.sender
            .try_send(Message::Line(line, permit))
            .map_err(|_| Full)
    }

    /// Room for `lines` if there is room for all of them now: held until [`Reserved::send`]
    /// queues them, given back when dropped.
    pub fn try_reserve(&self, lines: &[Vec<u8>]) -> Option<Reserved<'_>> {
        let bytes = lines
            .iter()
            .fold(0u32, |sum, line| sum.saturating_add(Self::share(line)));
        let bytes = self.bytes.clone().try_acquire_many_owned(bytes).ok()?;
        let slots = self.sender.try_reserve_many(lines.len()).ok()?;
        Some(Reserved { slots, bytes })
    }

    /// Waits until everything queued so far is written.
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

/// Room in a [`Sink`] for some lines ([`Sink::try_reserve`]).
pub struct Reserved<'a> {
    slots: mpsc::PermitIterator<'a, Message>,
    bytes: OwnedSemaphorePermit,
}

impl Reserved<'_> {
    /// Queues `lines`, the ones the room was reserved for, in order.
    pub fn send(self, mut lines: Vec<Vec<u8>>) {
        let Reserved {
            mut slots,
            mut bytes,
        } = self;
        // Each line takes its share of the bytes; the last one what is left.
        let last = lines.pop();
        for line in lines {
            let share = Sink::share(&line) as usize;
            let (Some(slot), Some(permit)) = (slots.next(), bytes.split(share)) else {
                return;
            };
            slot.send(Message::Line(line, permit));
        }
        if let (Some(slot), Some(line)) = (slots.next(), last) {
            slot.send(Message::Line(line, bytes));
        }
    }
}

/// Starts the writer thread; lines sent to the returned sink are written in order.
pub fn start(options: LogOptions, buffer: usize) -> std::io::Result<Sink> {
    let mut out = Output::open(options)?;
    let (sink, mut receiver) = Sink::channel(buffer);
    std::thread::Builder::new()
        .name("audit-log".into())
        .spawn(move || {
            while let Some(message) = receiver.blocking_recv() {
                let mut flushed = Vec::new();
                let mut take = |message| match message {
                    // The line's bytes are free again once it is written.
                    Message::Line(line, _permit) => out.write(&line),
                    Message::Flush(done) => flushed.push(done),
                };
                take(message);
                // Whatever else is waiting goes in the same flush.
                while let Ok(message) = receiver.try_recv() {
                    take(message);
                }
                out.flush();
                let waited = !flushed.is_empty();
                for done in flushed {
                    let _ = done.send(());
                }
                // Events gather for a moment before the next write: waking this thread for
                // each one costs a request more than writing it does.
                if !waited {
                    std::thread::sleep(BATCH_WAIT);
                }
            }
        })?;
    Ok(sink)
}

enum Target {
    Stdout(std::io::Stdout),
    File { file: BufWriter<File>, size: u64 },
}

struct Output {
    options: LogOptions,
    target: Target,
}

impl Output {
    fn open(options: LogOptions) -> std::io::Result<Self> {
        let target = if options.path == Path::new("-") {
            Target::Stdout(std::io::stdout())
        } else {
            Self::open_file(&options.path)?
        };
        Ok(Self { options, target })
    }

    fn open_file(path: &Path) -> std::io::Result<Target> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            // As kube-apiserver's: the directory private to the server.
            let mut create = std::fs::DirBuilder::new();
            create.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut create, 0o700);
            create.create(dir)?;
        }
        let mut open = OpenOptions::new();
        open.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        let file = open.open(path)?;
        let size = file.metadata()?.len();
        Ok(Target::File {
            file: BufWriter::with_capacity(WRITE_BUFFER, file),
            size,
        })
    }

    fn write(&mut self, line: &[u8]) {
        let max = self.options.max_size_mb.saturating_mul(1024 * 1024);
        if let Target::File { size, .. } = &self.target
            && max > 0
            && *size > 0
            && *size + line.len() as u64 > max
            && let Err(error) = self.rotate()
        {
            tracing::warn!(%error, path = %self.options.path.display(), "cannot rotate the audit log");
        }
        let result = match &mut self.target {
            Target::Stdout(out) => out.lock().write_all(line),
            Target::File { file, size } => {
                *size += line.len() as u64;
                file.write_all(line)
            }
        };
        if let Err(error) = result {
            tracing::warn!(%error, "cannot write the audit log");
        }
    }

    fn flush(&mut self) {
        let result = match &mut self.target {
            Target::Stdout(out) => out.flush(),
            Target::File { file, .. } => file.flush(),
        };
        if let Err(error) = result {
            tracing::warn!(%error, "cannot write the audit log");
        }
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.flush();
        let path = &self.options.path;
        let (dir, stem, ext) = parts(path);
        let now = jiff::Timestamp::now();
        let backup = dir.join(format!("{stem}-{}{ext}", now.strftime(BACKUP_TIME)));
        std::fs::rename(path, &backup)?;
        self.target = Self::open_file(path)?;
        self.prune(&dir, &stem, &ext, now);
        Ok(())
    }

    /// Removes backups beyond the count or age the options allow.
    fn prune(&self, dir: &Path, stem: &str, ext: &str, now: jiff::Timestamp) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let prefix = format!("{stem}-");
        let mut backups: Vec<(jiff::Timestamp, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let time = name.strip_prefix(&prefix)?.strip_suffix(ext)?;
                let at = jiff::civil::DateTime::strptime(BACKUP_TIME, time)
                    .ok()?
                    .to_zoned(jiff::tz::TimeZone::UTC)
                    .ok()?
                    .timestamp();
                Some((at, entry.path()))
            })
            .collect();
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        let max_age = Duration::from_secs(self.options.max_age_days.saturating_mul(86_400));
        for (i, (at, path)) in backups.iter().enumerate() {
            let too_many = self.options.max_backups > 0 && i >= self.options.max_backups;
            let too_old =
                self.options.max_age_days > 0 && now.duration_since(*at).unsigned_abs() > max_age;
            if (too_many || too_old)
                && let Err(error) = std::fs::remove_file(path)
            {
                tracing::warn!(%error, path = %path.display(), "cannot remove an old audit log");
            }
        }
    }
}

/// The directory, the name without its extension, and the extension (with its dot).
fn parts(path: &Path) -> (PathBuf, String, String) {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    (dir, stem, ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rotates_at_max_size_and_keeps_max_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let sink = start(
            LogOptions {
                path: path.clone(),
                max_age_days: 0,
                max_backups: 2,
                max_size_mb: 1,
            },
            16,
        )
        .unwrap();
        // 3.5 MiB in 100 KiB lines: three rotations, two backups kept.
        let line = [vec![b'x'; 100 * 1024 - 1], vec![b'\n']].concat();
        for _ in 0..36 {
            sink.send(line.clone()).await.unwrap();
            // Distinct backup names (millisecond times).
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        sink.flush().await;
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(names[2], "audit.log");
        for backup in &names[..2] {
            assert!(
                backup.starts_with("audit-") && backup.ends_with(".log"),
                "{backup}"
            );
            let size = std::fs::metadata(dir.path().join(backup)).unwrap().len();
            assert!(size <= 1024 * 1024, "{backup}: {size}");
            assert!(size > 1024 * 1024 - 100 * 1024, "{backup}: {size}");
        }
        let current = std::fs::metadata(&path).unwrap().len();
        assert_eq!(current % (100 * 1024), 0);
    }

    /// `--audit-log-maxage`: a rotation removes the backups older than that many days (named
    /// by their time, as lumberjack names them), and keeps the younger ones.
    #[tokio::test]
    async fn a_rotation_removes_backups_older_than_max_age() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let backup = |age: jiff::SignedDuration| {
            let at = jiff::Timestamp::now() - age;
            let name = format!("audit-{}.log", at.strftime(BACKUP_TIME));
            std::fs::write(dir.path().join(&name), b"old\n").unwrap();
            name
        };
        let old = backup(jiff::SignedDuration::from_hours(24 * 10));
        let young = backup(jiff::SignedDuration::from_hours(1));
        let sink = start(
            LogOptions {
                path: path.clone(),
                max_age_days: 3,
                max_backups: 0,
                max_size_mb: 1,
            },
            16,
        )
        .unwrap();
        let line = [vec![b'x'; 100 * 1024 - 1], vec![b'\n']].concat();
        for _ in 0..11 {
            sink.send(line.clone()).await.unwrap();
        }
        sink.flush().await;
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!names.contains(&old), "{names:?}");
        assert!(names.contains(&young), "{names:?}");
        // The young backup, the one this rotation made, and the live file.
        assert_eq!(names.len(), 3, "{names:?}");
    }
}
