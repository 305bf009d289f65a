//! Where a connection is in its request cycle (`ConnState`), as the
//! watchdog, the I/O wrapper and the service all see it: the one state the
//! header and idle clocks are read from.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::EdgeLimits;

/// Where a connection is in its request cycle, as far as timeouts go.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request head since `since` (the accept, or the first
    /// byte after an idle period): bounded by `header_read_timeout`.
    Head { since: Instant },
    /// Keep-alive with nothing received since the last response finished at
    /// `since`: bounded by `idle_timeout`.
    Idle { since: Instant },
    /// A request is being handled (head parsed, response not yet fully
    /// written). The body is bounded by `TimedBody`, a stalled response by
    /// `EdgeIo`'s write timeout; the handler's own time is not bounded here.
    ///
    /// Bytes that arrive while busy (a pipelined next request) do not start
    /// a header clock; if they form only part of a head, the connection is
    /// then bounded by `idle_timeout` (and hyper's backstop), not by
    /// `header_read_timeout`.
    Busy { in_flight: u32 },
}

/// Phase tracking shared by the connection's watchdog (`connection`), its
/// I/O (`EdgeIo`, which sees bytes arrive) and its service (`EdgeService`,
/// which sees requests start and responses end).
pub(super) struct ConnState {
    phase: Mutex<Phase>,
    /// Wakes the watchdog when the deadline may have moved earlier.
    pub(super) changed: Notify,
}

impl ConnState {
    pub(super) fn new(accepted: Instant) -> Self {
        ConnState {
            phase: Mutex::new(Phase::Head { since: accepted }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn deadline(&self, limits: &EdgeLimits) -> Option<(Instant, &'static str)> {
        match *self.lock() {
            Phase::Head { since } => Some((
                since + limits.header_read_timeout,
                "request head not received within header_read_timeout",
            )),
            Phase::Idle { since } => Some((since + limits.idle_timeout, "idle_timeout")),
            Phase::Busy { .. } => None,
        }
    }

    /// Bytes arrived: an idle connection starts its header clock.
    pub(super) fn on_read(&self) {
        let mut phase = self.lock();
        if let Phase::Idle { .. } = *phase {
            *phase = Phase::Head {
                since: Instant::now(),
            };
            drop(phase);
            self.changed.notify_one();
        }
    }

    pub(super) fn begin_request(self: &Arc<Self>) -> RequestGuard {
        let mut phase = self.lock();
        *phase = match *phase {
            Phase::Busy { in_flight } => Phase::Busy {
                in_flight: in_flight + 1,
            },
            _ => Phase::Busy { in_flight: 1 },
        };
        RequestGuard {
            state: self.clone(),
        }
    }

    fn end_request(&self) {
        let mut phase = self.lock();
        if let Phase::Busy { in_flight } = *phase {
            *phase = if in_flight > 1 {
                Phase::Busy {
                    in_flight: in_flight - 1,
                }
            } else {
                Phase::Idle {
                    since: Instant::now(),
                }
            };
            drop(phase);
            self.changed.notify_one();
        }
    }
}

/// Marks a request as in flight from the moment hyper hands it to the
/// service until its response body is dropped (fully written, or the
/// connection failed).
pub(super) struct RequestGuard {
    state: Arc<ConnState>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.state.end_request();
    }
}
