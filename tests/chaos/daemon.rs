//! A long-running child process of the suite (etcd, a Patroni agent,
//! HAProxy), its output in a log file of its own. Dropping it stops it
//! (SIGTERM, then SIGKILL after a grace), so that a run that fails, or
//! panics, leaves nothing running. Its pid is also written to a file beside
//! the log: a test process killed outright (SIGKILL) runs no drop, and the
//! next run stops what the files name ([`stop_leftovers`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    name: String,
    child: Child,
    pid_file: PathBuf,
    /// How long it gets to stop on SIGTERM (Patroni stops its PostgreSQL
    /// first).
    grace: Duration,
}

impl Daemon {
    /// Starts `command` with stdout and stderr appended to `dir/NAME.log`.
    pub fn start(name: &str, mut command: Command, dir: &Path, grace: Duration) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))
            .unwrap_or_else(|e| panic!("open {name}'s log in {}: {e}", dir.display()));
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({command:?}): {e}"));
        let pid_file = dir.join(format!("{name}.daemon-pid"));
        std::fs::write(&pid_file, child.id().to_string()).unwrap();
        Daemon {
            name: name.to_string(),
            child,
            pid_file,
            grace,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (it may have exited by itself).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, as when its machine dies; reaped at once.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pid_file);
    }

    /// SIGTERM now, without waiting: several daemons then stop at once.
    pub fn terminate(&mut self) {
        if self.running() {
            signal("TERM", [self.child.id()]);
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within its grace.
    fn stop(&mut self) {
        if !self.running() {
            return;
        }
        signal("TERM", [self.child.id()]);
        let deadline = Instant::now() + self.grace;
        while Instant::now() < deadline {
            if !self.running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "{} did not stop within {:?} of SIGTERM: killed",
            self.name, self.grace
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Sends SIGNAL (a name, as kill(1) takes it) to each of `pids`.
pub fn signal(name: &str, pids: impl IntoIterator<Item = u32>) {
    let pids: Vec<String> = pids.into_iter().map(|p| p.to_string()).collect();
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .args(&pids)
        .stderr(Stdio::null())
        .status();
}

/// SIGKILLs the processes named by `*.daemon-pid` files in `dir`, left by a
/// test process that was killed outright, if they still run the same
/// program (a pid can be reused).
pub fn stop_leftovers(dir: &Path, programs: &[&str]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("daemon-pid") {
            continue;
        }
        let pid = std::fs::read_to_string(&path).unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if programs.iter().any(|p| cmdline.contains(p)) {
            eprintln!(
                "stopping {} (pid {}) left by an earlier run",
                path.display(),
                pid.trim()
            );
            signal("KILL", pid.trim().parse::<u32>().ok());
        }
        let _ = std::fs::remove_file(&path);
    }
}
