//! What the connection went through, for an endpoint to tell "nobody answered" from "I am cut
//! off": when its state last changed, how often it was lost, the last error it met (a lost
//! connection, an error the server sent, a send that failed), and what waits for it at the
//! broker on its durables (§8). Recorded as it happens; read on demand, never guessed: a count
//! the broker did not give is absent.

use std::sync::Mutex;
use std::time::SystemTime;

use std::time::Duration;

use super::{Client, ConnectionState};
use crate::binding::{dm_durable, svc_durable};

/// The record the connection's events write.
#[derive(Default)]
pub(crate) struct Health {
    record: Mutex<Record>,
}

#[derive(Default, Clone)]
struct Record {
    changed: Option<SystemTime>,
    lost: u64,
    last_error: Option<(SystemTime, String)>,
}

impl Health {
    /// The state changed (to `state`) now.
    pub(crate) fn changed(&self, state: ConnectionState) {
        if let Ok(mut r) = self.record.lock() {
            r.changed = Some(SystemTime::now());
            if state != ConnectionState::Connected {
                r.lost += 1;
                r.last_error = Some((
                    SystemTime::now(),
                    "the connection to the server was lost".into(),
                ));
            }
        }
    }

    /// An error met now. While the connection is lost (`connected` false), it is what the
    /// last attempt to reconnect met.
    pub(crate) fn error(&self, what: String, connected: bool) {
        if let Ok(mut r) = self.record.lock() {
            let what = match connected {
                true => what,
                false => format!(
                    "the connection to the server was lost; the last attempt to reconnect \
                     met: {what}"
                ),
            };
            r.last_error = Some((SystemTime::now(), what));
        }
    }
}

/// The connection as [`Client::health`] reports it.
#[derive(Debug, Clone)]
pub struct HealthReport {
    /// The state now.
    pub state: ConnectionState,
    /// When it last changed (`None`: not since connecting).
    pub since: Option<SystemTime>,
    /// How many times the connection was lost.
    pub lost: u64,
    /// The last error met, and when.
    pub last_error: Option<(SystemTime, String)>,
    /// Messages this connection sent and received (every protocol message, control included).
    pub sent: u64,
    /// See `sent`.
    pub received: u64,
}

/// How recent an error met since the last (re)connect makes the connection degraded.
pub(super) const RECENT_ERROR: Duration = Duration::from_secs(60);
/// How long copies may wait at the broker, none handed over, before delivery is stalled.
pub(super) const STALLED: Duration = Duration::from_secs(30);

impl HealthReport {
    /// What is wrong while connected, in words: an error met since the connection was last
    /// made and less than `RECENT_ERROR` ago, and each durable whose copies wait at the
    /// broker while none was handed over for `STALLED` and none is in hand. Empty: nothing
    /// known to be wrong.
    pub fn troubles(&self, durables: &[DurableWaiting]) -> Vec<String> {
        let ago = |t: SystemTime| t.elapsed().unwrap_or_default();
        let mut troubles = Vec::new();
        if let Some((at, what)) = &self.last_error
            && ago(*at) < RECENT_ERROR
            && self.since.is_none_or(|since| *at >= since)
        {
            troubles.push(format!("{what} ({} s ago)", ago(*at).as_secs()));
        }
        for d in durables {
            let idle = d.last_delivered.map(ago);
            if d.pending > 0 && d.unacknowledged == 0 && idle.is_none_or(|i| i >= STALLED) {
                troubles.push(format!(
                    "{}: {} wait at the broker and none was handed to you {}",
                    d.what,
                    d.pending,
                    idle.map_or("in this session".to_owned(), |i| format!(
                        "for {} s",
                        i.as_secs()
                    ))
                ));
            }
        }
        troubles
    }
}

/// What waits for the endpoint at the broker on one of its durables.
#[derive(Debug, Clone)]
pub struct DurableWaiting {
    /// What the durable carries: "direct messages" or "tasks for your role".
    pub what: &'static str,
    /// Copies not yet handed to this endpoint.
    pub pending: u64,
    /// Copies handed out and not yet acknowledged.
    pub unacknowledged: usize,
    /// When a copy was last handed out, if ever.
    pub last_delivered: Option<SystemTime>,
}

impl Client {
    /// The connection's state, its changes and its last error.
    pub fn health(&self) -> HealthReport {
        let record = self
            .inner
            .health
            .record
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default();
        let stats = self.inner.nats.statistics();
        HealthReport {
            state: *self.inner.state.borrow(),
            since: record.changed,
            lost: record.lost,
            last_error: record.last_error,
            sent: stats
                .out_messages
                .load(std::sync::atomic::Ordering::Relaxed),
            received: stats.in_messages.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// What waits at the broker on this endpoint's DM durable and its role's task durable;
    /// each durable the broker did not describe is named in the second list with why.
    pub async fn durables_waiting(&self) -> (Vec<DurableWaiting>, Vec<String>) {
        if *self.inner.state.borrow() != ConnectionState::Connected {
            return (
                Vec::new(),
                vec!["not connected: the broker cannot be asked".to_owned()],
            );
        }
        let names = &self.inner.names;
        let mut durables = vec![(
            "direct messages",
            names.dm_stream(),
            dm_durable(self.inner.id.as_str()),
        )];
        if let Some(role) = self.card().role {
            durables.push((
                "tasks for your role",
                names.task_stream(),
                svc_durable(&role),
            ));
        }
        let (mut waiting, mut unknown) = (Vec::new(), Vec::new());
        for (what, stream, durable) in durables {
            let info = async {
                let stream = self.inner.js.get_stream_no_info(&stream).await?;
                Ok::<_, super::BoxError>(stream.consumer_info(&durable).await?)
            };
            match info.await {
                Ok(info) => waiting.push(DurableWaiting {
                    what,
                    pending: info.num_pending,
                    unacknowledged: info.num_ack_pending,
                    last_delivered: info.delivered.last_active.map(SystemTime::from),
                }),
                Err(e) => unknown.push(format!("{what}: {e}")),
            }
        }
        (waiting, unknown)
    }

    /// Records an error this endpoint met (a send that failed), for [`Client::health`].
    pub(crate) fn met_error(&self, what: String) {
        let connected = *self.inner.state.borrow() == ConnectionState::Connected;
        self.inner.health.error(what, connected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(last_error: Option<(SystemTime, &str)>, since: Option<SystemTime>) -> HealthReport {
        HealthReport {
            state: ConnectionState::Connected,
            since,
            lost: 0,
            last_error: last_error.map(|(at, what)| (at, what.to_owned())),
            sent: 0,
            received: 0,
        }
    }

    fn durable(pending: u64, unacknowledged: usize, idle: Option<u64>) -> DurableWaiting {
        DurableWaiting {
            what: "direct messages",
            pending,
            unacknowledged,
            last_delivered: idle.map(|s| SystemTime::now() - Duration::from_secs(s)),
        }
    }

    #[test]
    fn troubles_are_recent_errors_since_connecting_and_stalled_durables() {
        let now = SystemTime::now();
        let minute_ago = now - Duration::from_secs(61);
        assert!(report(None, None).troubles(&[]).is_empty());
        let failed = report(Some((now, "a send failed")), None).troubles(&[]);
        assert!(failed[0].starts_with("a send failed"), "{failed:?}");
        assert!(
            report(Some((minute_ago, "old")), None)
                .troubles(&[])
                .is_empty(),
            "an old error"
        );
        let lost = now - Duration::from_secs(5);
        let reconnected = report(Some((lost, "lost")), Some(now));
        assert!(
            reconnected.troubles(&[]).is_empty(),
            "an error healed by a reconnect"
        );
        let healthy = report(None, None);
        assert!(
            healthy.troubles(&[durable(5, 0, Some(1))]).is_empty(),
            "recently delivered"
        );
        assert!(
            healthy.troubles(&[durable(5, 3, None)]).is_empty(),
            "copies in hand"
        );
        assert!(
            healthy.troubles(&[durable(0, 0, None)]).is_empty(),
            "nothing waits"
        );
        let stalled = healthy.troubles(&[durable(5, 0, Some(40))]);
        assert!(stalled[0].contains("5 wait at the broker"), "{stalled:?}");
        assert_eq!(
            healthy.troubles(&[durable(2, 0, None)]).len(),
            1,
            "never delivered"
        );
    }
}
