//! Why a client operation fails, in words a person or an agent acts on: the error type, the
//! refusals the broker and the space's bounds give a publish (§8, the fairness bounds), and the
//! permission violations the server reports (Appendix B).

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind;

use crate::dial::DialError;
use crate::protocol::Routing;

/// Any error a NATS or JetStream operation can return, kept as the source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a client operation failed. Each variant keeps what caused it as its `source`.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The `.creds` text cannot be used.
    #[error("cannot use the credential")]
    Credential(#[from] crate::binding::CredsError),
    /// The seed and the JWT of the credential belong to different users.
    #[error(
        "the credential's seed ({seed}) does not belong to its JWT ({jwt}): spliced credentials"
    )]
    Spliced {
        /// The seed's public key.
        seed: String,
        /// The JWT's subject.
        jwt: String,
    },
    /// An id was requested that the credential is not bound to (§2).
    #[error("id {expected} was requested but the credential is bound to {actual} (§2)")]
    IdMismatch {
        /// The requested id.
        expected: String,
        /// The credential's id.
        actual: String,
    },
    /// The credential's key is not a user nkey.
    #[error("the credential's key is not a user id")]
    Id(#[from] crate::protocol::IdError),
    /// The join link carries auth besides the credential.
    #[error(
        "the join link carries a token or user:password, which cannot be combined with a \
         credential (§10)"
    )]
    LinkAuth,
    /// The credential does not grant a role's anycast durable.
    #[error("role `{role}`: this credential may not read {durable} (mint it with --role {role})")]
    RoleNotGranted {
        /// The role.
        role: String,
        /// Its durable.
        durable: String,
    },
    /// A pre-created durable could not be bound.
    #[error(
        "cannot bind {durable} on {stream} (it is created when the credential is minted on a \
         running appliance)"
    )]
    Bind {
        /// The durable.
        durable: String,
        /// Its stream.
        stream: String,
        /// What the broker said.
        #[source]
        source: BoxError,
    },
    /// The credential's `exp` has passed: the broker refuses it.
    #[error(
        "this credential expired at {at}; have a new one minted (`cotald mint NAME --replace` \
         on the appliance)"
    )]
    Expired {
        /// When it expired (RFC 3339, UTC).
        at: String,
    },
    /// The credential grants subjects of another space than the link names.
    #[error(
        "this credential belongs to space {credential}, but the link names space {link}: use \
         the link of space {credential}, or a credential minted with --space {link}"
    )]
    WrongSpace {
        /// The space the credential's grants name.
        credential: String,
        /// The space the link names.
        link: String,
    },
    /// The broker refused the credential at connect (authorization violation).
    #[error(
        "the appliance at {server} refused this credential: it was signed by another appliance \
         (or for a space this one does not serve), or it was revoked; use a credential minted by \
         the appliance the link names"
    )]
    NotAuthorized {
        /// The server URL.
        server: String,
    },
    /// The server's certificate is not signed by a CA this client trusts.
    #[error(
        "the certificate of {server} is not signed by a CA this client trusts: pass --ca with \
         that appliance's CA certificate (<data-dir>/tls/ca.pem)"
    )]
    UntrustedCertificate {
        /// The server URL.
        server: String,
        /// What TLS said.
        #[source]
        source: DialError,
    },
    /// The broker could not be reached or refused the connection.
    #[error("cannot connect to {server}")]
    Connect {
        /// The server URL.
        server: String,
        /// Why.
        #[source]
        source: DialError,
    },
    /// The broker refused a publish (permission violation).
    #[error("{}", publish_refused(subject))]
    PublishRefused {
        /// The refused subject.
        subject: String,
    },
    /// The space refused to store a message: one of its bounds is reached. The advice says
    /// what the sender can do.
    #[error("{what} was refused: {advice}")]
    StoreFull {
        /// Which bound.
        limit: StoreLimit,
        /// What was sent, and to whom.
        what: String,
        /// Which bound, and what to do.
        advice: String,
        /// What the broker said.
        #[source]
        source: BoxError,
    },
    /// A message was sent (and sent again, with the same id) and no acknowledgement came: the
    /// broker may have stored it or not. Never reported as refused: sent again now it would be
    /// stored twice once the broker's duplicate window (two minutes) is over.
    #[error(
        "{what} (id {id}) was sent, and sent again with the same id, but no acknowledgement \
         came within {waited:?}: the broker may have stored it (once) or not; if you send it \
         again, it may arrive twice"
    )]
    OutcomeUnknown {
        /// What was sent, and to whom.
        what: String,
        /// The message id.
        id: String,
        /// How long the client tried.
        waited: Duration,
    },
    /// A request got no answer in time.
    #[error("{what}: no answer within {timeout:?}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        timeout: Duration,
    },
    /// No service listens on a control subject.
    #[error("no `{service}` service answers in space `{space}`")]
    NoResponders {
        /// The service.
        service: String,
        /// The space.
        space: String,
    },
    /// A control request was answered `{ok: false}`.
    #[error("{op} refused: {error}")]
    Refused {
        /// The op.
        op: String,
        /// The reply's error.
        error: String,
    },
    /// A channel the space knows nothing of (no config, no message), named where it would be
    /// made (a likely typo).
    #[error(
        "channel `{channel}` has no config and no messages yet{}",
        closest.as_ref().map(|c| format!(": did you mean `{c}`?")).unwrap_or_default()
    )]
    UnknownChannel {
        /// The channel named.
        channel: String,
        /// The closest channel the space knows, if one is close.
        closest: Option<String>,
    },
    /// The channel's history may not be read (§7 effective `replay = false`).
    #[error(
        "the history of {channel} may not be read: the channel's config says replay = false (§7)"
    )]
    HistoryClosed {
        /// The channel.
        channel: String,
    },
    /// A JetStream or NATS operation failed.
    #[error("{action} failed")]
    Nats {
        /// What was being done.
        action: String,
        /// What the library or broker said.
        #[source]
        source: BoxError,
    },
    /// A subject could not be built (an invalid space, role or target).
    #[error("invalid address")]
    Subject(#[from] crate::protocol::SubjectError),
    /// A channel name is invalid.
    #[error("invalid channel")]
    Channel(#[from] crate::protocol::ChannelError),
    /// A presence record could not be built.
    #[error("invalid presence")]
    Presence(#[from] crate::protocol::PresenceError),
    /// A message or request could not be encoded or a reply decoded.
    #[error("{what}: invalid JSON")]
    Json {
        /// What.
        what: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

/// The words of a refused publish: what the credential may not do, in spec terms, and the fix.
fn publish_refused(subject: &str) -> String {
    let what = match crate::protocol::parse_subject(subject) {
        Ok(p) => match p.kind {
            crate::protocol::SubjectKind::Chat => format!(
                "this credential may not post to channel {channel} (mint it with \
                 --allow-publish {channel}; add --replace to re-issue an existing identity)",
                channel = p.rest
            ),
            crate::protocol::SubjectKind::Inst => {
                "this credential may not send direct messages (observers and admins publish \
                 nothing; use an agent credential)"
                    .to_owned()
            }
            crate::protocol::SubjectKind::Svc => format!(
                "this credential may not send tasks to role {} (observers and admins publish \
                 nothing; use an agent credential)",
                p.rest
            ),
            crate::protocol::SubjectKind::Ctl => format!(
                "this credential may not make requests of service {}",
                p.rest
            ),
        },
        Err(_) => "not within this credential's permissions".to_owned(),
    };
    format!("the broker refused to publish on {subject}: {what}")
}

/// `.map_err(nats_err("read the CHAT frontier"))`: a failed NATS operation, its error kept.
pub(crate) fn nats_err<E: Into<BoxError>>(
    action: impl Into<String>,
) -> impl FnOnce(E) -> ClientError {
    // The action becomes text only on an error: a static one costs a success nothing.
    move |e| ClientError::Nats {
        action: action.into(),
        source: e.into(),
    }
}

/// What a message is, for the words of its refusal: `the direct message to U…`.
pub(super) fn sent_what(routing: &Routing) -> String {
    match routing {
        Routing::Channel(channel) => format!("the message to channel `{channel}`"),
        Routing::To(target) => format!("the direct message to {target}"),
        Routing::ToService(role) => format!("the task for role `{role}`"),
    }
}

/// Whether a publish got no answer from JetStream: none in time (it may have been stored), or
/// none could be given (no stream to take it yet: a broker that is restarting). Sent again
/// with the same id, it is stored at most once.
pub(super) fn unanswered(e: &jetstream::context::PublishError) -> bool {
    matches!(
        e.kind(),
        PublishErrorKind::TimedOut
            | PublishErrorKind::StreamNotFound
            | PublishErrorKind::BrokenPipe
    )
}

/// Which bound of the space refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreLimit {
    /// Its (target or role, sender) pair holds as many unread as the stream keeps per subject
    /// (`binding::streams::{DM,TASK}_MAX_MSGS_PER_PAIR`); on a channel, the sender's subject.
    PairFull,
    /// The sender is held past its share of the store (`space/holds.rs`).
    Held,
    /// The stream's byte or message limit.
    StreamFull,
    /// The space's JetStream quota or the disk.
    DiskFull,
}

impl StoreLimit {
    /// The bound a JetStream publish error names, from its code and words; `None` for any
    /// other error.
    fn of(error: &(dyn std::error::Error + 'static)) -> Option<StoreLimit> {
        let said = crate::ops::error_text(error);
        // nats-server gives one code (10077, "store failed") to every stream limit and tells
        // them apart by its words; a hold's refusal is the manager's, with its own prefix.
        if said.contains(crate::binding::HELD) {
            Some(StoreLimit::Held)
        } else if said.contains("maximum messages per subject exceeded") {
            Some(StoreLimit::PairFull)
        } else if said.contains("maximum bytes exceeded")
            || said.contains("maximum messages exceeded")
        {
            Some(StoreLimit::StreamFull)
        } else if said.contains("resources exceeded") || said.contains("insufficient") {
            Some(StoreLimit::DiskFull)
        } else {
            None
        }
    }
}

pub(super) fn store_refusal(
    routing: &Routing,
    subject: &str,
    e: impl Into<BoxError>,
    waited: Duration,
) -> ClientError {
    let source: BoxError = e.into();
    let what = sent_what(routing);
    let Some(limit) = StoreLimit::of(source.as_ref()) else {
        return ClientError::Nats {
            action: format!("publish on {subject}"),
            source,
        };
    };
    let advice = match limit {
        StoreLimit::PairFull => match routing {
            Routing::To(_) => format!(
                "{} of your direct messages already wait unread for this recipient, and no room \
                 was made for this one in {waited:?}; send again once it has read some",
                crate::binding::streams::DM_MAX_MSGS_PER_PAIR
            ),
            Routing::ToService(_) => format!(
                "{} of your tasks already wait for this role, and no room was made for this \
                 one in {waited:?}; send again once a worker has taken some",
                crate::binding::streams::TASK_MAX_MSGS_PER_PAIR
            ),
            Routing::Channel(_) => "the channel keeps no more from you".to_owned(),
        },
        StoreLimit::Held => {
            // The warden's hold (`space/holds.rs`): its refusal carries the figures.
            let said = source.to_string();
            let reason = said
                .split_once(crate::binding::HELD)
                .map_or(said.as_str(), |r| r.1);
            reason.split_once(" (code ").map_or(reason, |r| r.0).to_owned()
        }
        StoreLimit::StreamFull => "the space's store for this kind of message is full; ask its operator to raise the retention limits in the profile, or send again once messages expire or are read"
            .to_owned(),
        StoreLimit::DiskFull => "the space's storage is full; ask its operator to free disk or raise the space's JetStream quota"
            .to_owned(),
    };
    ClientError::StoreFull {
        limit,
        what,
        advice,
        source,
    }
}

/// A permission violation the broker reported on this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// `Publish` or `Subscription`.
    pub verb: String,
    /// The refused subject.
    pub subject: String,
}

impl Violation {
    /// Parses `Permissions Violation for Subscription to "subject"` (the server's wording).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let rest = text.split_once("Permissions Violation for ")?.1;
        let (verb, rest) = rest.split_once(" to ")?;
        let subject = rest.trim().trim_matches(['"', '\'']);
        let subject = subject.split('"').next().unwrap_or(subject);
        Some(Violation {
            verb: verb.to_owned(),
            subject: subject.to_owned(),
        })
    }
}
