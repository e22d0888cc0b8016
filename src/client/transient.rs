//! The transient failures a client retries on its own. A JetStream API request answered with
//! "no responders": while the broker applies an update of the space's account JWT (a mint that
//! replaces a credential, a revoke, a sender held or released), the account's import of the
//! JetStream API is rebuilt, and a request in that instant finds nobody to answer it, though
//! every stream and bucket of the space exists. Such a read is tried again, a few times with a
//! short backoff (a debug line each time). And a request that got no answer at all: a broker
//! reloading its configuration (a server certificate renewal) drops a request in flight, which
//! then times out; such a read is tried once more, so a broker that stopped answering is still
//! reported after two timeouts. And a request in flight when the connection dropped (a broker
//! restarted): it was most likely lost with the old socket, so it is asked again as soon as the
//! connection is back, not after its timeout. Any other failure is returned at once.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::context::RequestErrorKind;
use tokio::sync::watch;

use super::ConnectionState;

/// How many times a request is tried in all.
const ATTEMPTS: u32 = 6;
/// How many times a request is asked again because the connection came back while it waited
/// (past that, a flapping connection leaves it to its timeout).
const REASKS: u32 = 3;
/// The first pause; it doubles (50, 100, 200, 400, 800 ms: 1.55 s in all).
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// Whether `e`, or one of its causes, is a request that found no responders.
pub(crate) fn no_responders(e: &(dyn std::error::Error + 'static)) -> bool {
    any_cause(e, |e| {
        request_kind(e) == Some(RequestErrorKind::NoResponders)
            || e.downcast_ref::<async_nats::RequestError>()
                .is_some_and(|r| r.kind() == async_nats::RequestErrorKind::NoResponders)
    })
}

/// Whether `e`, or one of its causes, is a request that got no answer in time.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
    any_cause(e, |e| {
        request_kind(e) == Some(RequestErrorKind::TimedOut)
            || e.downcast_ref::<async_nats::RequestError>()
                .is_some_and(|r| r.kind() == async_nats::RequestErrorKind::TimedOut)
            || e.downcast_ref::<ConsumerError>()
                .is_some_and(|r| r.kind() == ConsumerErrorKind::TimedOut)
    })
}

/// The kind of a JetStream request's error, when `e` is one.
fn request_kind(e: &(dyn std::error::Error + 'static)) -> Option<RequestErrorKind> {
    e.downcast_ref::<async_nats::jetstream::context::RequestError>()
        .map(|r| r.kind())
}

/// Whether `e` or one of its causes is what `is` looks for.
fn any_cause(
    e: &(dyn std::error::Error + 'static),
    is: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(is)
}

/// Resolves when the connection `state` watches is back after a drop it was told of since it
/// was last seen (the state is only sent when it changes); never once it is closed for good.
async fn came_back(state: &mut watch::Receiver<ConnectionState>) {
    while state.changed().await.is_ok() {
        match *state.borrow_and_update() {
            ConnectionState::Connected => return,
            ConnectionState::Reconnecting => {}
            ConnectionState::Disconnected => break,
        }
    }
    std::future::pending().await
}

/// Runs the read `op` (it must be safe to repeat) on the connection whose state `connection`
/// watches: again while it fails for no responders, once more after a first timeout, and at
/// once when the connection came back while it waited.
pub(crate) async fn retried<T, E, F, Fut>(
    what: &str,
    connection: &watch::Receiver<ConnectionState>,
    mut op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::error::Error + 'static,
{
    let mut pause = FIRST_PAUSE;
    let mut attempt = 1;
    let mut timeouts = 0;
    let mut reasked = 0;
    let mut state = connection.clone();
    loop {
        state.borrow_and_update();
        let outcome = tokio::select! {
            outcome = op() => outcome,
            () = came_back(&mut state), if reasked < REASKS => {
                tracing::debug!(what, "the connection came back while asking; asking again");
                reasked += 1;
                continue;
            }
        };
        match outcome {
            Err(e) if timeouts == 0 && timed_out(&e) => {
                tracing::debug!(
                    what,
                    "no answer (a request dropped by a reload?); asking again"
                );
                timeouts += 1;
            }
            Err(e) if attempt < ATTEMPTS && no_responders(&e) => {
                tracing::debug!(
                    what,
                    attempt,
                    ?pause,
                    "no responders (an account update?); retrying"
                );
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that stays up (nothing will ever change it).
    fn connected() -> watch::Receiver<ConnectionState> {
        watch::channel(ConnectionState::Connected).1
    }

    #[tokio::test]
    async fn a_read_in_flight_when_the_connection_dropped_is_asked_again_once_it_is_back() {
        let (tx, rx) = watch::channel(ConnectionState::Connected);
        let (asked, mut asking) = tokio::sync::mpsc::unbounded_channel();
        let mut calls = 0;
        let read = retried("a test read", &rx, || {
            calls += 1;
            let _ = asked.send(calls);
            let call = calls;
            async move {
                match call {
                    // Lost with the old socket: never answered.
                    1 => std::future::pending().await,
                    _ => Ok::<_, async_nats::RequestError>(call),
                }
            }
        });
        let connection = async {
            assert_eq!(asking.recv().await, Some(1));
            tx.send_replace(ConnectionState::Reconnecting);
            tx.send_replace(ConnectionState::Connected);
        };
        let (answered, ()) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(read, connection)
        })
        .await
        .expect("asked again at once, not after a timeout");
        assert_eq!(answered.unwrap(), 2);
    }

    #[test]
    fn no_responders_is_found_among_the_causes_and_nothing_else_is_retried() {
        let refused = async_nats::RequestError::new(async_nats::RequestErrorKind::NoResponders);
        let jetstream: async_nats::jetstream::context::RequestError = refused.into();
        let read = async_nats::jetstream::context::GetStreamError::with_source(
            async_nats::jetstream::context::GetStreamErrorKind::Request,
            jetstream,
        );
        let wrapped = super::super::ClientError::Nats {
            action: "read the CHAT frontier".into(),
            source: Box::new(read),
        };
        assert!(no_responders(&wrapped));
        let late = async_nats::RequestError::new(async_nats::RequestErrorKind::TimedOut);
        assert!(!no_responders(&late));
    }

    #[tokio::test]
    async fn a_read_is_tried_again_while_nobody_responds_then_given_up() {
        let mut calls = 0;
        let answered = retried("a test read", &connected(), || {
            calls += 1;
            let outcome = match calls {
                1 | 2 => Err(async_nats::RequestError::new(
                    async_nats::RequestErrorKind::NoResponders,
                )),
                _ => Ok(calls),
            };
            async move { outcome }
        })
        .await;
        assert_eq!(answered.unwrap(), 3);
        let mut calls = 0;
        let refused: Result<(), _> = retried("a test read", &connected(), || {
            calls += 1;
            async {
                Err(async_nats::RequestError::new(
                    async_nats::RequestErrorKind::NoResponders,
                ))
            }
        })
        .await;
        assert!(refused.is_err());
        assert_eq!(calls, ATTEMPTS);
    }

    #[tokio::test]
    async fn a_read_that_got_no_answer_is_asked_once_more_and_a_second_timeout_returned() {
        let no_answer = || async_nats::RequestError::new(async_nats::RequestErrorKind::TimedOut);
        let consumer = async_nats::jetstream::stream::ConsumerError::new(
            async_nats::jetstream::stream::ConsumerErrorKind::TimedOut,
        );
        assert!(timed_out(&consumer));
        let mut calls = 0;
        let answered = retried("a test read", &connected(), || {
            calls += 1;
            let outcome = match calls {
                1 => Err(no_answer()),
                _ => Ok(calls),
            };
            async move { outcome }
        })
        .await;
        assert_eq!(answered.unwrap(), 2);
        let mut calls = 0;
        let late: Result<(), _> = retried("a test read", &connected(), || {
            calls += 1;
            async move { Err(no_answer()) }
        })
        .await;
        assert!(late.is_err());
        assert_eq!(calls, 2);
    }
}
